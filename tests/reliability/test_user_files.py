"""No command deletes what it did not write. A folder with a user's file inside every entry that
bears one of vaswani's names (and at each of those names) is given to train, import and export,
with and without ``--overwrite``: every byte of the user's stays. A run directory lists what
vaswani wrote (rundir.MANIFEST); only that is ever removed."""

import hashlib
import json
import shutil

import pytest

from tests.reliability.checkpoints import bert_folder, llama_gguf
from tests.training.fixtures import config, reverse_task
from vaswani import rundir
from vaswani.cli import main

FOLDERS = ("last", "last.tmp", "last.old", "tokenizer", "checkpoints", "tensorboard",
           "sharded.tmp")
MARK = b"users-own-bytes"  # in every file of the user's
# in a run's directory, last.tmp/ and last.old/ are the save's scratch (whatever a save killed
# part-way left in them is vaswani's); the user's files go in the others
THEIRS = tuple(name for name in FOLDERS if name not in ("last.tmp", "last.old"))
FILES = ("model.safetensors", "loss.png", "averaged.safetensors", "config.toml",
         "metrics.jsonl", "launcher.json", "chat_template.jinja")


def users_bytes(folder):
    """path -> sha256 of every file of the user's under ``folder``."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and MARK in p.read_bytes()}


def fill(folder, *, names=True, folders=FOLDERS):
    """The user's files: inside each of vaswani's folders, and (``names``) at vaswani's file
    names too; beside them a note and a folder of their own."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in folders:
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "precious.bin").write_text(f"users-own-bytes: {name}")
    if names:
        for name in FILES:
            (folder / name).write_text(f"users-own-bytes: {name}")
    (folder / "notes.txt").write_text("users-own-bytes: notes")
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "train.tsv").write_text("users-own-bytes: a\tb\n")
    return users_bytes(folder)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("sources")
    data = reverse_task(base / "pairs.tsv", n=200)
    cfg = config(base / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 2, "eval_every": 1000, "save_every": 1,
                        "keep_checkpoints": 2})
    return {"cfg": cfg, "bert": bert_folder(base / "bert"), "gguf": llama_gguf(base / "m.gguf"),
            "cache": base / "cache"}


def command(kind, sources, out):
    if kind == "train":
        return ["train", str(sources["cfg"]), "--out", str(out), "--no-progress"]
    source = sources["bert"] if kind == "import-bert" else sources["gguf"]
    return ["import", kind.removeprefix("import-"), str(source), "--out", str(out),
            "--cache", str(sources["cache"])]


@pytest.mark.parametrize("kind", ["train", "import-bert", "import-gguf"])
def test_a_folder_of_the_users_is_never_written_over(kind, sources, tmp_path, capsys):
    out = tmp_path / "out"
    before = fill(out)
    for extra in ([], ["--overwrite"]):
        assert main(command(kind, sources, out) + extra) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "which vaswani did not write" in err, err
        assert users_bytes(out) == before
    # nothing at vaswani's names, but files of the user's inside its folders: still refused
    for name in FILES:
        (out / name).unlink()
    before = users_bytes(out)
    assert main(command(kind, sources, out) + ["--overwrite"]) == 2
    assert "last/precious.bin" in capsys.readouterr().err
    assert users_bytes(out) == before


@pytest.mark.parametrize("kind", ["train", "import-bert", "import-gguf"])
def test_overwrite_of_a_run_removes_only_what_it_wrote(kind, sources, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(command(kind, sources, out)) == 0
    written = rundir.written(out)
    assert rundir.CONFIG in written and rundir.BEST in written
    assert main(command(kind, sources, out)) == 2  # a run is there
    assert "already holds a run" in capsys.readouterr().err
    before = users_bytes(out) | fill(out, names=False, folders=THEIRS)
    for extra in ([], ["--overwrite"]):  # the user's files in its way
        assert main(command(kind, sources, out) + extra) == 2
    assert "checkpoints/precious.bin" in capsys.readouterr().err
    assert users_bytes(out) == before
    for name in THEIRS:  # the user moves them away; the notes and data/ stay
        (out / name / "precious.bin").unlink()
    before = users_bytes(out)
    assert before
    assert main(command(kind, sources, out) + ["--overwrite"]) == 0
    assert users_bytes(out) == before
    assert not (out / "sharded.tmp").exists()  # the user's empty folders went with vaswani's


def test_a_folder_holding_only_a_users_file_in_last_is_not_cleared(sources, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "last").mkdir(parents=True)
    (out / "last" / "precious.bin").write_text("users-own-bytes")
    assert main(command("train", sources, out)) == 2
    assert "holds last/precious.bin, which vaswani did not write" in capsys.readouterr().err
    assert (out / "last" / "precious.bin").read_text() == "users-own-bytes"


def test_a_resumed_run_refuses_a_users_file_its_next_checkpoint_would_replace(sources, tmp_path,
                                                                               capsys):
    out = tmp_path / "run"
    assert main(command("train", sources, out)) == 0
    (out / "last" / "notes.txt").write_text("users-own-bytes")
    assert main(["train", "--resume", str(out), "--no-progress", "--set",
                 "train.max_steps=4"]) == 2
    assert "last/notes.txt, which vaswani did not write" in capsys.readouterr().err
    assert (out / "last" / "notes.txt").read_text() == "users-own-bytes"


def test_a_run_from_before_the_manifest_is_overwritten_by_its_layout(sources, tmp_path):
    """tests/fixtures/legacy's runs were written by an earlier version (no vaswani_run.json):
    their files are recognised by the layout, the user's beside them are kept."""
    from pathlib import Path

    legacy = Path(__file__).parents[1] / "fixtures" / "legacy" / "translation"
    assert not (legacy / rundir.MANIFEST).exists()
    out = tmp_path / "old"
    shutil.copytree(legacy, out)
    (out / "notes.txt").write_text("users-own-bytes")
    owned, theirs, others = rundir.survey(out)
    assert theirs == [] and others == ["notes.txt"]
    assert rundir.CONFIG in owned and rundir.BEST in owned
    assert main(command("train", sources, out) + ["--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "users-own-bytes"


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_export_into_a_folder_of_the_users_keeps_every_byte(copy_run, tmp_path, overwrite,
                                                            capsys):
    pytest.importorskip("ctranslate2", reason="vaswani[export] is not installed")
    out = tmp_path / "out"
    before = fill(out)
    (out / "model.bin").write_text("users-own-bytes: model.bin")  # a name the ct2 export writes
    before = users_bytes(out)
    code = main(["export", str(copy_run[0]), "--format", "ct2", "--out", str(out), *overwrite])
    assert code == 2
    assert "Traceback" not in capsys.readouterr().err
    assert users_bytes(out) == before


def test_what_a_killed_save_leaves_in_last_tmp_does_not_stop_a_resume(sources, tmp_path):
    """A kill -9 in the middle of a save leaves last.tmp/ with a library's temporary file in
    it: the save's scratch, vaswani's, removed by the next save; the run resumes."""
    out = tmp_path / "run"
    assert main(command("train", sources, out)) == 0
    (out / "last.tmp").mkdir()
    (out / "last.tmp" / ".tmpQ2tJVl").write_bytes(b"half a tensor")
    assert main(["train", "--resume", str(out), "--no-progress", "--set",
                 "train.max_steps=3"]) == 0
    assert not (out / "last.tmp").exists()


# --- the lock file and the manifest: only vaswani's own names -----------------------------------

def plant_lock(out, outside, kind):
    """A ``.lock`` in ``out`` that is not vaswani's: a user's file, a symbolic link to a file
    elsewhere, or a second name (hard link) of one."""
    out.mkdir(parents=True, exist_ok=True)
    outside.write_text("users-own-bytes: a secret elsewhere")
    if kind == "file":
        (out / ".lock").write_text("users-own-bytes: my lock notes")
    elif kind == "symlink":
        (out / ".lock").symlink_to(outside)
    else:
        (out / ".lock").hardlink_to(outside)


@pytest.mark.parametrize("lock", ["file", "symlink", "hardlink"])
@pytest.mark.parametrize("kind", ["train", "import-bert", "import-gguf"])
def test_a_lock_file_that_is_not_vaswanis_is_refused_untouched(kind, lock, sources, tmp_path,
                                                               capsys):
    out, outside = tmp_path / "out", tmp_path / "elsewhere.txt"
    plant_lock(out, outside, lock)
    before = users_bytes(tmp_path)
    for extra in ([], ["--overwrite"]):
        assert main(command(kind, sources, out) + extra) == 2
        err = capsys.readouterr().err
        assert "not vaswani's lock file" in err and ".lock" in err, err
        assert "Traceback" not in err and "secret" not in err and "lock notes" not in err
        assert users_bytes(tmp_path) == before
    assert (out / ".lock").is_symlink() == (lock == "symlink")


def test_a_lock_file_of_an_earlier_version_is_taken(sources, tmp_path):
    """Earlier versions wrote the pid alone (and left the file empty on a clean exit)."""
    for previous in ("", "4242"):
        out = tmp_path / f"old{previous}"
        out.mkdir()
        (out / ".lock").write_text(previous)
        assert main(command("train", sources, out)) == 0
        assert (out / ".lock").read_text().split() == ["vaswani", "run", "lock:", "free"]


def manifest_claims(out, *entries):
    """The manifest edited to claim more than vaswani wrote."""
    path = out / rundir.MANIFEST
    names = json.loads(path.read_text())["written"] if path.exists() else []
    path.write_text(json.dumps({"written": names + list(entries)}))


PLANTED = ("tensorboard/my_notes.md", "tensorboard/sub/notes.md", "checkpoints/mine.safetensors",
           "checkpoints/step-1/inner.txt", "last/sharded/notes.md")


@pytest.mark.parametrize("manifest", ["vaswani's", "edited", "none (an earlier version)"])
@pytest.mark.parametrize("kind", ["train", "import-gguf"])
def test_overwrite_keeps_users_files_in_vaswanis_folders(kind, manifest, sources, tmp_path,
                                                          capsys):
    """Files of the user's under tensorboard/, checkpoints/ and last/sharded/, with the
    manifest vaswani wrote, one claiming "*", "checkpoints/*" and the user's names, and none
    at all (a run from before the manifest, recognised by its layout): --overwrite refuses,
    naming them, and no byte of theirs changes; once they are moved it goes through."""
    out = tmp_path / "run"
    assert main(command(kind, sources, out)) == 0
    if manifest == "edited":
        manifest_claims(out, "*", "checkpoints/*", "tensorboard/*", "last/*", "../elsewhere",
                        *PLANTED)
    elif manifest.startswith("none"):
        (out / rundir.MANIFEST).unlink()
    for rel in PLANTED:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(f"users-own-bytes: {rel}")
    before = users_bytes(out)
    assert main(command(kind, sources, out) + ["--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "which vaswani did not write" in err and "Traceback" not in err, err
    assert users_bytes(out) == before
    owned = rundir.survey(out)[0]
    assert not [rel for rel in owned if rel in PLANTED]
    for rel in PLANTED:
        (out / rel).rename(tmp_path / rel.replace("/", "_"))
    assert main(command(kind, sources, out) + ["--overwrite"]) == 0


def test_a_manifest_names_only_vaswanis_layout():
    assert rundir.in_layout("checkpoints/step-000100.safetensors")
    assert rundir.in_layout("tensorboard/*") and rundir.in_layout("last/sharded/*")
    for name in ("*", "checkpoints/*", "last/*", "tensorboard/notes.md", "../x", "notes.txt",
                 "checkpoints/step-1/x.safetensors", "last/notes.txt"):
        assert not rundir.in_layout(name), name
