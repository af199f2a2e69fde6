"""Where an export may go: never over the run it exports, never over a user's files.
``--overwrite`` replaces only the names a previous export listed in ``vaswani_export.json``."""

import json
import shutil

import pytest

from vaswani.cli import main
from vaswani.export import MANIFEST, export

pytest.importorskip("ctranslate2", reason="vaswani[export] is not installed")


@pytest.fixture
def run(copy_run, tmp_path):
    """A private copy of the copy-task run, so a wrong export could only hurt this copy."""
    here = tmp_path / "runs" / "copy"
    shutil.copytree(copy_run[0], here)
    return here


def listing(path):
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


@pytest.mark.parametrize("where", ["run", "parent", "inside"])
def test_out_that_is_contains_or_lies_inside_the_run_is_refused(run, where, capsys):
    out = {"run": run, "parent": run.parent, "inside": run / "export"}[where]
    before = listing(run.parent)
    assert main(["export", str(run), "--format", "ct2", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert {"run": "is the run directory itself", "parent": "contains",
            "inside": "lies inside"}[where] in err
    assert listing(run.parent) == before


def test_overwrite_keeps_the_users_files_and_removes_only_what_it_wrote(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "user.txt").write_text("mine")
    (out / "notes").mkdir()
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        export(run, "ct2", out)
    export(run, "ct2", out, overwrite=True)
    written = json.loads((out / MANIFEST).read_text())["written"]
    assert "model.bin" in written and "user.txt" not in written
    assert (out / "user.txt").read_text() == "mine" and (out / "notes").is_dir()

    # a stale name from the first export is removed by the second; the user's stay
    (out / "model.bin").rename(out / "old-model.bin")
    (out / MANIFEST).write_text(json.dumps({"written": written + ["old-model.bin"]}))
    export(run, "ct2", out, overwrite=True)
    assert not (out / "old-model.bin").exists()
    assert (out / "model.bin").exists() and (out / "user.txt").read_text() == "mine"
    assert sorted(json.loads((out / MANIFEST).read_text())["written"]) == sorted(written)


def test_a_users_file_with_an_exports_name_is_never_replaced(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.bin").write_text("the user's own model.bin")
    with pytest.raises(FileExistsError, match="model.bin, which vaswani did not write"):
        export(run, "ct2", out, overwrite=True)
    assert listing(out) == ["model.bin"]
    assert (out / "model.bin").read_text() == "the user's own model.bin"


def test_a_listing_cannot_point_outside_the_folder(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "precious.txt").write_text("keep")
    (out / MANIFEST).write_text(json.dumps({"written": ["../precious.txt", "..", "/etc"]}))
    export(run, "ct2", out, overwrite=True)
    assert (tmp_path / "precious.txt").read_text() == "keep"


def test_out_dot_exports_into_the_current_folder(run, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", str(run), "--format", "ct2", "--out", "."]) == 0
    assert (here / "model.bin").exists() and (here / MANIFEST).exists()
    assert not [p for p in here.iterdir() if p.name.startswith(".")]  # no build folder left



@pytest.mark.parametrize("sub", ["", "sub"])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_out_that_is_a_file_or_lies_under_one_is_refused_by_name(run, tmp_path, sub, overwrite,
                                                                 capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    out = file / sub if sub else file
    assert main(["export", str(run), "--format", "ct2", "--out", str(out), *overwrite]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Errno" not in err
    assert f"{file} is a file, not a folder" in err
    assert file.read_text() == "mine"


class SafetensorError(Exception):
    """What safetensors raises when its write fails (its own type, not an OSError)."""


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device"),  # CTranslate2 and ONNX: Python's own error
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
])
def test_a_full_disk_mid_export_is_said_in_one_line_and_the_last_export_stays(
        run, tmp_path, monkeypatch, capsys, failure):
    from vaswani.export import ct2

    out = tmp_path / "out"
    assert main(["export", str(run), "--format", "ct2", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    write = ct2.write

    def fills_the_disk(run, dest, **kw):
        write(run, dest, **kw)  # a whole export in the build folder, then the disk is full
        raise failure

    monkeypatch.setattr(ct2, "write", fills_the_disk)
    assert main(["export", str(run), "--format", "ct2", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"could not write {out}" in err and "No space left on device" in err
    assert f"nothing was written to {out}" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no build folder


def test_an_error_of_the_program_mid_export_is_not_called_a_full_disk(run, tmp_path,
                                                                       monkeypatch):
    from vaswani.export import ct2

    def a_bug(run, dest, **kw):
        raise RuntimeError("a mapping bug")

    monkeypatch.setattr(ct2, "write", a_bug)
    with pytest.raises(RuntimeError, match="a mapping bug"):
        export(run, "ct2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
