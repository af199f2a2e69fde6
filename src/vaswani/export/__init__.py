"""Export a trained run to other engines: ``vaswani export RUN_DIR --format ct2 --out DIR``.

One module per format, each reading the run through :mod:`vaswani.rundir` and writing the
weights in the target's own layout:

    ct2.py   CTranslate2 (translators and language models; ``quantize="int8"`` as CTranslate2
             quantizes), written through its spec API as its own converters do
    hf.py    Hugging Face transformers (encoders as BERT, language models as their own class),
             loadable with ``AutoModel*.from_pretrained`` and ``AutoTokenizer``
    onnx.py  ONNX (every family's forward pass, dynamic batch and length), checked with
             ONNX Runtime

A run option with no exact counterpart in the target format is an :class:`ExportError` that
names the option and its value, never a silent approximation. Every export folder keeps a copy
of the run's ``config.toml`` and ``tokenizer/`` under ``vaswani/``, so the exported model can be
used from vaswani (``vaswani translate DIR --engine ct2``) without the run directory, and
``vaswani_export.json``: the names the export wrote, all that ``--overwrite`` may remove.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .. import checkpoint, rundir
from ..atomic import WriteError, atomic_write_text, failed_write, private_dir, write_error
from ..config import ModelConfig

FORMATS = ("hf", "onnx", "ct2")
SOURCE = "vaswani"  # the folder, inside an export, that holds the run's config and tokenizer


class ExportError(ValueError):
    """The run cannot be exported to this format exactly (the message names the option)."""


def refuse(fmt: str, option: str, value, supported: str) -> ExportError:
    return ExportError(f"cannot export to {fmt}: {ModelConfig.where(option)} = {value!r} "
                       f"has no counterpart there ({supported})")


def how_to_use(fmt: str, out: Path) -> str:
    """One line saying how to use an export in ``out``."""
    return {"ct2": f"vaswani translate {out} --engine ct2   (or generate ... --engine ct2)",
            "hf": f"transformers' AutoModel*.from_pretrained({str(out)!r}) and "
                  f"AutoTokenizer.from_pretrained({str(out)!r})",
            "onnx": f"onnxruntime.InferenceSession(...) on {out}/*.onnx (inputs and outputs in "
                    f"{out}/onnx_export.json)"}[fmt]


MANIFEST = "vaswani_export.json"  # the names an export wrote in its folder


def export(run_dir: str | Path, fmt: str, out: str | Path, *, quantize: str | None = None,
           overwrite: bool = False, merge: bool = False) -> Path:
    """Export the run at ``run_dir`` to ``out`` in format ``fmt``; returns ``out``.

    Everything is checked and built in a temporary folder next to ``out`` before ``out`` is
    touched: a refused or failed export leaves ``out`` as it was. ``out`` may not be the run,
    lie inside it or contain it. The export lists what it wrote in ``out/vaswani_export.json``;
    ``overwrite`` replaces a previous export there, removing only those names, and never a file
    of someone else's.

    A LoRA run (``[finetune] method = "lora"``) exports as hf its base model with the
    adapters in peft's format in ``out/adapter/`` (peft.py); with ``merge``, and in the other
    formats, the model with the adapters merged into its weights."""
    from ..inference import load

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if quantize not in (None, "int8"):
        raise ExportError(f"unknown quantization {quantize!r}; the choice is int8")
    if quantize and fmt != "ct2":
        raise ExportError(f"--quantize {quantize} is for --format ct2 (CTranslate2 quantizes "
                          f"its own weights); {fmt} exports float32")
    run_dir, out = Path(run_dir).resolve(), Path(out).resolve()
    _check_place(run_dir, out)
    previous = _written(out)
    others = []
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir() if p.name not in previous + [MANIFEST])
    if (previous or others) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace "
                              "the export in it (files vaswani did not write are kept)")
    config = rundir.read_config(run_dir)
    if merge and not config.finetune.lora:
        raise ExportError(f"--merge folds a LoRA run's adapters into its weights; {run_dir} "
                          f"holds none ([finetune] method = {config.finetune.method!r})")
    from . import ct2, hf, onnx, peft

    if config.finetune.lora and fmt == "hf" and not merge:  # the base, and the adapters
        run = load(config.train.init_from)

        def writer(dest: Path) -> None:
            architecture = hf.check(run.config.model)
            peft.write(config.finetune, checkpoint.weights_path(run_dir), architecture,
                       dest / peft.ADAPTER, out)  # first: a refusal writes nothing
            hf.write(run, dest)
    else:
        run = load(run_dir)
        writer = {"ct2": lambda dest: ct2.write(run, dest, quantize=quantize),
                  "hf": lambda dest: hf.write(run, dest),
                  "onnx": lambda dest: onnx.write(run, dest)}[fmt]
    tmp = private_dir(out.parent, out.name)
    try:
        try:
            writer(tmp / "export")
            shutil.copytree(run_dir / rundir.TOKENIZER,
                            tmp / "export" / SOURCE / rundir.TOKENIZER)
            shutil.copy2(run_dir / rundir.CONFIG, tmp / "export" / SOURCE / rundir.CONFIG)
        except Exception as e:  # a full disk, from whichever library was writing
            if failed_write(e) and not isinstance(e, WriteError):
                shutil.rmtree(tmp, ignore_errors=True)  # first: the space it leaves is said
                raise write_error(out, e, f"nothing was written to {out}") from e
            raise
        names = sorted(p.name for p in (tmp / "export").iterdir())
        clash = sorted(set(names) & set(others))
        if clash:
            raise FileExistsError(f"{out} holds {', '.join(clash)}, which vaswani did not "
                                  "write and this export would replace; move them, or "
                                  "choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        _list(out, sorted(set(previous) | set(names)))  # a kill from here on leaves them listed
        for name in previous:
            _remove(out / name)
        for name in names:
            os.replace(tmp / "export" / name, out / name)
        _list(out, names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_place(run_dir: Path, out: Path) -> None:
    """An export never writes over the run it exports."""
    where = ("is the run directory itself" if out == run_dir else
             f"lies inside {run_dir}" if run_dir in out.parents else
             f"contains {run_dir}" if out in run_dir.parents else None)
    if where:
        raise ExportError(f"--out {out} {where}: an export is written beside the run, never "
                          "over it; choose another --out")
    file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
        raise ExportError(f"--out {out}: {file} is a file, not a folder; an export is a folder "
                          "of files: choose another --out")


def _written(out: Path) -> list[str]:
    """The names a previous export listed in ``out`` (none without its list)."""
    try:
        names = json.loads((out / MANIFEST).read_text())["written"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in names if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")]


def _list(out: Path, names: list[str]) -> None:
    atomic_write_text(out / MANIFEST, json.dumps({"written": names}, indent=2) + "\n")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
