"""A compiled step's package on disk (engine/package.py): its shared library unpacked beside
it under a name its content decides, old ones removed, nothing half-written left when a
build fails. Archives here are small zip files shaped like AOTInductor's (one ``.so``
entry); the real packages are tests/engine/test_compiled.py's."""

import errno
import zipfile
from pathlib import Path

import pytest
from torch import nn

from vaswani.atomic import WriteError
from vaswani.engine import build as build_module
from vaswani.engine.package import remove_others, unpack, unpacked


def archive(path: Path, library: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("step/archive_format", "pt2")
        z.writestr("step/data/aotinductor/model/abc.wrapper.so", library)
        z.writestr("step/data/aotinductor/model/abc.wrapper.cpp", "// code")
    return path


def test_the_library_is_named_by_its_content_and_written_whole(tmp_path):
    package = archive(tmp_path / "decode-float.pt2", b"ELF one")
    library = unpack(package, package)
    assert library == unpacked(package) and library.read_bytes() == b"ELF one"
    assert library.name == f"decode-float.{zipfile.crc32(b'ELF one'):08x}.so"
    # another build's library is another file, so a process never reopens a stale one
    other = archive(tmp_path / "built.pt2", b"ELF two")
    assert unpacked(package, other) != library
    assert unpacked(package, archive(tmp_path / "same.pt2", b"ELF one")) == library


def test_only_the_same_packages_older_libraries_are_removed(tmp_path):
    names = ["decode-float.0000abcd.so", "decode-float-kv-bf16.0000abcd.so",
             "decode-int4-g64.0000abcd.so", "decode-float.notes.so", "decode-float.pt2"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    package = archive(tmp_path / "decode-float.pt2", b"ELF new")
    library = unpack(package, package)
    remove_others(library, package)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {*names[1:], library.name})


def test_a_damaged_archive_leaves_no_library(tmp_path):
    package = archive(tmp_path / "decode-float.pt2", b"ELF " + b"w" * 4000)
    data = bytearray(package.read_bytes())
    data[data.index(b"wwww")] = ord("v")  # the stored bytes no longer match their CRC
    package.write_bytes(bytes(data))
    with pytest.raises(WriteError, match="Bad CRC"):
        unpack(package, package)
    assert [p.name for p in tmp_path.iterdir()] == ["decode-float.pt2"]


def test_a_build_replaces_the_last_library_and_a_failed_one_leaves_the_last_whole(
        tmp_path, monkeypatch):
    """A build writes the new package and its library and removes the last one's; a failed
    write of the new package (a full disk) removes the new library and keeps the previous
    package with its own library."""
    out = archive(tmp_path / "decode-float.pt2", b"ELF old")
    old = unpack(out, out)
    built = iter([b"ELF new", b"ELF newer"])

    def compiled(program, package_path, inductor_configs):
        return str(archive(Path(package_path), next(built)))

    monkeypatch.setattr(build_module, "example_inputs", lambda *args: ((), ()))
    monkeypatch.setattr(build_module.torch.export, "export", lambda *a, **k: None)
    monkeypatch.setattr(build_module.torch._inductor, "aoti_compile_and_package", compiled)
    build_module.build(nn.Linear(2, 2), False, out, {}, lambda message: None)
    new = unpacked(out)
    assert new != old and new.read_bytes() == b"ELF new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name, new.name, "decode-float.json"])

    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build_module, "atomic_write", full)
    with pytest.raises(OSError, match="No space"):
        build_module.build(nn.Linear(2, 2), False, out, {}, lambda message: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name, new.name, "decode-float.json"])
    assert unpacked(out) == new and new.read_bytes() == b"ELF new"
