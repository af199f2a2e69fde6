"""A compiled decode step's package on disk (engine/compiled.py builds and loads it): where
it lies in a run, what it is bound to, and its shared library unpacked beside it.

A package is bound to what it was built from (:func:`identity`): the run's weights (file,
size, modification time; where the time alone differs, their bytes: :func:`matched`) and
config, the quantization, the torch version, vaswani's code that the step runs (a digest of
its source) and the CPU (its model and instruction sets: Inductor compiles for the machine
it runs on, and a package from another CPU may not run at all). Loading one that does not
match is refused with a warning that names the difference and the command that rebuilds it
(:func:`differences`, :func:`options`).

It lives in the run: ``RUN_DIR/compiled/decode-{float,int8,int4}.pt2`` (AOTInductor's
archive, which ``torch._inductor.aoti_load_package`` opens) beside a JSON record of its
identity, and the archive's shared library unpacked once (``decode-float.<crc32>.so``,
:func:`unpack`): ``aoti_load_package`` unpacks the whole archive into a temporary folder at
every load, most of a large package's warm start, where opening the unpacked library
is a fraction of it (the figures: docs/performance.md, "A compiled decode step").
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import shutil
import zipfile
from pathlib import Path

import torch

from ..atomic import atomic_write, atomic_write_text, file_sha256
from ..rundir import COMPILED, CONFIG, NotOurLock, locked

STEP_VERSION = 2  # the exported step's signature and code; a package of another is rebuilt


def cpu_identity() -> dict:
    """The CPU a package is compiled for: its model name and instruction-set flags (Linux's
    /proc/cpuinfo; elsewhere the platform's name), and the vector width PyTorch uses on it."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        name = fields.get("model name", name)
        flags = " ".join(sorted(fields.get("flags", fields.get("Features", "")).split()))
    except OSError:
        pass
    return {"cpu": name, "cpu_flags": flags,
            "capability": torch.backends.cpu.get_cpu_capability()}


def identity(run_dir: Path, weights: Path, quantize: str | None,
             kv_cache: str | None = None) -> dict:
    """Everything a package of ``run_dir``'s ``weights`` file depends on (the module's
    docstring)."""
    stat = weights.stat()
    return {"step": STEP_VERSION, "code": code_digest(), "torch": torch.__version__,
            "weights": weights.relative_to(run_dir).as_posix(), "weights_bytes": stat.st_size,
            "weights_mtime_ns": stat.st_mtime_ns,
            "config": (run_dir / CONFIG).read_text(),
            "quantize": quantize, "kv_cache": kv_cache, **cpu_identity()}


@functools.cache  # the source does not change while a process runs
def code_digest() -> str:
    """The sha256 of the source of every package whose code a step runs (nn/, cpu/,
    models/, engine/): another version of vaswani's modules is another package."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in CODE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


CODE = ("nn", "cpu", "models", "engine")
WHAT = {"step": "vaswani's decode step", "code": "vaswani's code", "torch": "torch",
        "weights": "weights file",
        "weights_bytes": "weights (size)", "weights_mtime_ns": "weights (changed since)",
        "config": "config.toml", "quantize": "quantization", "kv_cache": "key/value cache",
        "cpu": "CPU",
        "cpu_flags": "CPU instruction sets", "capability": "CPU vector width"}


def differences(built: dict, wanted: dict) -> list[str]:
    """What differs between a package's record and what is loaded now, in words."""
    out = []
    for key, what in WHAT.items():
        if built.get(key) != wanted.get(key):
            short = key in ("torch", "quantize", "kv_cache", "cpu", "capability", "weights",
                            "step")
            out.append(f"{what} ({built.get(key)!r} -> {wanted.get(key)!r})" if short else what)
    return out


def matched(package: Path, built: dict, wanted: dict) -> list[str]:
    """What differs between ``package``'s record ``built`` and ``wanted``
    (:func:`differences`), but for the weights' modification time alone where the file
    still holds the bytes the package was built from (the sha256 its record holds, which
    records written before it do not): a run copied without its files' times (``cp -r``,
    a download, a container's image) keeps its package. The record then takes the new
    time, so that the next load reads the time alone; where it cannot be written (the
    run is read-only or in use) every load compares the bytes."""
    changed = differences(built, wanted)
    if changed != [WHAT["weights_mtime_ns"]] or "weights_sha256" not in built:
        return changed
    run_dir = package.parent.parent  # RUN_DIR/compiled/PACKAGE (package_path)
    path = run_dir / wanted["weights"]
    if _sha256(path, wanted["weights_bytes"], wanted["weights_mtime_ns"]) != \
            built["weights_sha256"]:
        return changed
    try:
        with locked(run_dir):  # (vaswani compile writes records under the lock)
            if json.loads(record_path(package).read_text()) == built:  # not rebuilt since
                atomic_write_text(record_path(package), json.dumps(
                    {**built, "weights_mtime_ns": wanted["weights_mtime_ns"]}, indent=1) + "\n")
    except (OSError, ValueError, NotOurLock):
        pass
    return []


@functools.lru_cache(maxsize=4)  # a step and its companions ask for one file's at one load
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def package_path(run_dir: Path, quantize: str | None, kv_cache: str | None = None) -> Path:
    """decode-{float,int8,int4,int4-g64}.pt2, -kv-bf16 before the suffix for a step over a
    bfloat16 cache."""
    kept = f"-kv-{kv_cache}" if kv_cache else ""
    return run_dir / COMPILED / f"decode-{quantize or 'float'}{kept}.pt2"


def record_path(package: Path) -> Path:
    return package.with_suffix(".json")


# --- the library unpacked ------------------------------------------------------------------

def _library_entry(package: zipfile.ZipFile) -> zipfile.ZipInfo:
    found = [i for i in package.infolist() if i.filename.endswith(".so")]
    if len(found) != 1:
        raise ValueError(f"{package.filename} holds {len(found)} shared libraries, not one")
    return found[0]


def unpacked(package: Path, archive: Path | None = None) -> Path:
    """Where ``package``'s shared library lies unpacked: beside it, named by the package's
    stem and the library's CRC-32 as the archive (``package`` itself, or the ``archive``
    it is a copy of) records it; a rebuilt package's library is another file (the dynamic
    loader hands a process that opened a library by name the same one for that name)."""
    with zipfile.ZipFile(archive or package) as zipped:
        return _named(package, _library_entry(zipped))


def _named(package: Path, entry: zipfile.ZipInfo) -> Path:
    return package.with_name(f"{package.stem}.{entry.CRC:08x}.so")


def intact(package: Path) -> Path | None:
    """``package``'s library unpacked beside it if it is there whole (as many bytes as the
    archive's: a shorter file would fault the process that maps it), else None."""
    with zipfile.ZipFile(package) as zipped:
        entry = _library_entry(zipped)
    library = _named(package, entry)
    try:
        return library if library.stat().st_size == entry.file_size else None
    except FileNotFoundError:
        return None


def unpack(archive: Path, package: Path) -> Path:
    """Write the shared library of ``archive`` (a package to be copied to ``package``) to
    :func:`unpacked`, whole or not at all (zipfile checks its CRC as it reads)."""
    out = unpacked(package, archive)
    with zipfile.ZipFile(archive) as zipped:
        entry = _library_entry(zipped)

        def write(path: Path) -> None:
            with zipped.open(entry) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 24)
        atomic_write(out, write)
    return out


def remove_others(library: Path, package: Path) -> None:
    """Remove the libraries unpacked for the packages built before ``package``."""
    pattern = rf"{re.escape(package.stem)}\.[0-9a-f]{{8}}\.so"
    for old in package.parent.glob(f"{package.stem}.*.so"):
        if old != library and re.fullmatch(pattern, old.name):
            old.unlink(missing_ok=True)


def options(quantize: str | None, kv_cache: str | None) -> str:
    """The command-line options that name a package: " --quantize int8 --kv-cache bf16"."""
    return (f" --quantize {quantize}" if quantize else "") + \
        (f" --kv-cache {kv_cache}" if kv_cache else "")
