"""Training under faults: signals and kill -9 at random moments, two processes on one run
directory, a full disk while saving, non-finite losses, a cut-short log line, a failed start.

Each test asserts that the previous good state is intact and that the next command either
works or says exactly why (one line, exit status 2, no traceback)."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.processes import alive, descendants, free_port, kill_tree, wait_gone
from tests.training.fixtures import config, reverse_task
from vaswani import atomic, checkpoint, rundir
from vaswani.cli import main
from vaswani.training.train import Launch, train

STEPS = 30


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A config with dropout (so random-number state matters) and a straight run of it."""
    base = tmp_path_factory.mktemp("faults")
    data = reverse_task(base / "pairs.tsv", n=400)
    cfg = config(base / "c.toml", "encoder-decoder", data, dropout=0.1,
                 model={"d_model": 48, "d_ff": 96},
                 train={"max_steps": STEPS, "save_every": 1000, "eval_every": 1000,
                        "schedule": "cosine", "warmup": 5})
    straight = base / "straight"
    train(str(cfg), [], out=str(straight), launch=Launch(progress=False))
    return cfg, straight


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rundir.read_metrics(run / "metrics.jsonl")}


def assert_same_run(a: Path, b: Path) -> None:
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, STEPS + 1))
    for step in la:
        assert abs(la[step] - lb[step]) <= 1e-6, step
    wa = load_file(str(a / "last/model.safetensors"))
    wb = load_file(str(b / "last/model.safetensors"))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=1e-6, msg=name)


def start_training(cfg: Path, run: Path, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vaswani", "train", str(cfg), "--out",
                             str(run), "--no-progress", *extra],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len(losses(run)) >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"training did not reach step {n} (exit {proc.poll()})")


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # never leave a training process behind
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_at_a_random_moment_resumes_exactly(setup, tmp_path, sig):
    """A signal lands anywhere (inside a step, in the log write, between steps); the run
    saves after a whole step, exits 130, and resuming gives the straight run to 1e-6."""
    cfg, straight = setup
    rng = random.Random(sig)
    for trial in range(3):
        run = tmp_path / f"run{trial}"
        proc = start_training(cfg, run, tmp_path / f"log{trial}.txt")
        wait_for_steps(run, 1 + trial * 4, proc)
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(sig)
        assert finish(proc) == 130, (tmp_path / f"log{trial}.txt").read_text()[-2000:]
        log = (tmp_path / f"log{trial}.txt").read_text()
        assert "stopped after step" in log and "Traceback" not in log
        step = json.loads((run / "last/state.json").read_text())["step"]
        assert 0 < step < STEPS
        train(None, [], resume=str(run), launch=Launch(progress=False))
        assert_same_run(straight, run)


def test_kill_9_at_random_moments_always_leaves_a_resumable_run(setup, tmp_path):
    """kill -9 (no handler runs) while checkpoints are being written every step: the run
    resumes from its newest complete checkpoint and ends as the straight run."""
    cfg, straight = setup
    rng = random.Random(9)
    for trial in range(3):
        run = tmp_path / f"run{trial}"
        proc = start_training(cfg, run, tmp_path / "log.txt", "--set", "train.save_every=1")
        wait_for_steps(run, 2 + trial * 5, proc)
        time.sleep(rng.uniform(0, 0.1))
        proc.kill()
        proc.wait()
        checkpoint.find_last(run)  # a complete checkpoint exists
        train(None, [], resume=str(run), launch=Launch(progress=False))
        assert_same_run(straight, run)


def test_a_second_process_on_the_same_run_directory_is_refused(setup, tmp_path, capsys):
    cfg, _ = setup
    run = tmp_path / "run"
    first = start_training(cfg, run, tmp_path / "first.txt", "--set", "train.max_steps=100000")
    try:
        wait_for_steps(run, 2, first)
        assert main(["train", str(cfg), "--out", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"is in use by another vaswani process (pid {first.pid})" in err
        assert main(["train", "--resume", str(run), "--no-progress"]) == 2  # resume too
        assert "is in use by another vaswani process" in capsys.readouterr().err
        first.send_signal(signal.SIGINT)
        assert finish(first) == 130
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    steps = [r["step"] for r in rundir.read_metrics(run / "metrics.jsonl")]
    assert steps == sorted(set(steps))  # one writer: no step logged twice


def test_a_lock_left_by_a_killed_process_is_taken_over(setup, tmp_path, capsys):
    cfg, _ = setup
    run = tmp_path / "run"
    proc = start_training(cfg, run, tmp_path / "log.txt", "--set", "train.max_steps=100000",
                          "--set", "train.save_every=1")
    wait_for_steps(run, 2, proc)
    proc.kill()  # kill -9: the lock file keeps the dead pid, the kernel dropped the lock
    proc.wait()
    assert (run / ".lock").read_text().split()[-2:] == ["pid", str(proc.pid)]
    train(None, ["train.max_steps=4"], resume=str(run), launch=Launch(progress=False))
    assert f"left locked by process {proc.pid}, which is no longer running; taking over" in \
        capsys.readouterr().err
    assert (run / ".lock").read_text().split() == ["vaswani", "run", "lock:", "free"]  # no pid


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(setup, tmp_path, capsys,
                                                              monkeypatch):
    cfg, _ = setup
    run = tmp_path / "run"
    train(str(cfg), ["train.max_steps=4", "train.schedule_steps=6"], out=str(run),
          launch=Launch(progress=False))
    before = (run / "last/model.safetensors").read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 0 vs 3; "
                           "PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", disk_full)
    assert main(["train", "--resume", str(run), "--no-progress",
                 "--set", "train.max_steps=6"]) == 2
    err = capsys.readouterr().err
    assert "could not write" in err and "trainer.pt" in err and "Traceback" not in err
    assert (run / "last/model.safetensors").read_bytes() == before
    assert not (run / "last.tmp").exists()
    monkeypatch.setattr(torch, "save", real_save)
    assert main(["train", "--resume", str(run), "--no-progress",
                 "--set", "train.max_steps=6"]) == 0


def test_the_disk_full_message_names_the_cause(tmp_path):
    error = atomic.write_error(tmp_path / "x", OSError(errno.ENOSPC, "No space left on device"))
    assert "the disk is full" in str(error) and "intact" in str(error)


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(setup, tmp_path, monkeypatch,
                                                             capsys):
    """A NaN loss updates nothing and is counted; a long streak stops the run with an error,
    the last checkpoint and the best weights untouched."""
    from vaswani.tasks.translation import Translation

    cfg, _ = setup
    real_loss = Translation.loss
    poisoned: set[int] = set()
    calls = {"n": 0}

    def loss(self, model, batch, smoothing):
        loss_sum, nll, n = real_loss(self, model, batch, smoothing)
        calls["n"] += 1
        if model.training and calls["n"] in poisoned:
            loss_sum = loss_sum * float("nan")
        return loss_sum, nll, n

    monkeypatch.setattr(Translation, "loss", loss)
    poisoned.update({3, 4})
    run = tmp_path / "run"
    summary = train(str(cfg), ["train.max_steps=8", "train.eval_every=4", "train.save_every=4"],
                    out=str(run), launch=Launch(progress=False))
    assert summary["skipped_steps"] == 2 and summary["steps"] == 8
    assert json.loads((run / "last/state.json").read_text())["skipped_steps"] == 2
    good = (run / "last/model.safetensors").read_bytes()
    best = (run / "model.safetensors").read_bytes()
    calls["n"] = 0
    poisoned.clear()
    poisoned.update(range(1, 100))
    assert main(["train", "--resume", str(run), "--no-progress", "--set", "train.max_steps=40",
                 "--set", "train.schedule_steps=40", "--set", "train.max_skipped_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "training diverged" in err and "for 4 steps in a row" in err
    assert (run / "last/model.safetensors").read_bytes() == good
    assert (run / "model.safetensors").read_bytes() == best


def test_a_cut_short_log_line_does_not_block_resume(setup, tmp_path):
    cfg, _ = setup
    run = tmp_path / "run"
    train(str(cfg), ["train.max_steps=4", "train.save_every=2", "train.schedule_steps=6"],
          out=str(run), launch=Launch(progress=False))
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "loss": 1.2, "lr"')  # a kill in the middle of a write
    with pytest.warns(UserWarning, match=r"metrics.jsonl:5: not a complete log line"):
        train(None, ["train.max_steps=6"], resume=str(run), launch=Launch(progress=False))
    assert [r["step"] for r in rundir.read_metrics(run / "metrics.jsonl")] == list(range(1, 7))


def test_a_failed_start_leaves_nothing_and_a_killed_start_is_cleared(setup, tmp_path, capsys):
    cfg, _ = setup
    run = tmp_path / "run"
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\n" * 50 + "no tab here\n")
    assert main(["train", str(cfg), "--out", str(run), "--set", f"data.train={bad}",
                 "--no-progress"]) == 2
    assert "bad.tsv:51: expected 2 tab-separated columns" in capsys.readouterr().err
    assert not run.exists()  # it created the directory; it removed it
    # what a kill -9 during start-up leaves: a config and a tokenizer, no weights
    run.mkdir()
    rundir.record(run, "config.toml", "tokenizer/meta.json")  # listed before it is written
    (run / "config.toml").write_text("[model]\n")
    (run / "tokenizer").mkdir()
    assert main(["train", str(cfg), "--out", str(run), "--no-progress",
                 "--set", "train.max_steps=2"]) == 0
    assert "holds the start of a run that saved no weights; starting over" in \
        capsys.readouterr().err
    # a user's own files are neither removed nor trained over without --overwrite
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["train", str(cfg), "--out", str(other), "--no-progress"]) == 2
    assert "is not empty (notes.txt)" in capsys.readouterr().err
    assert main(["train", str(cfg), "--out", str(other), "--no-progress", "--overwrite",
                 "--set", "train.max_steps=2"]) == 0
    assert (other / "notes.txt").read_text() == "keep me"


def test_a_killed_torchrun_takes_its_ranks_with_it(setup, tmp_path):
    """torchrun starts each rank in a session of its own: when torchrun itself is killed
    (SIGKILL, the OOM killer), its ranks must not run on, orphaned, holding the run's lock
    (training/distributed.py die_with_launcher)."""
    cfg, _ = setup
    run, log = tmp_path / "ranks", tmp_path / "log.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "vaswani", "train",
         str(cfg), "--out", str(run), "--no-progress", "--set", "train.max_steps=100000"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log.open("w"),
        stderr=subprocess.STDOUT)
    ranks = []
    try:
        wait_for_steps(run, 2, proc, timeout=180)
        ranks = descendants(proc.pid)
        assert len(ranks) >= 2, log.read_text()[-2000:]
        proc.kill()
        proc.wait()
        assert wait_gone(ranks, timeout=15) == [], log.read_text()[-2000:]
    finally:
        kill_tree(proc)
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_pids_of_this_test_are_gone():
    """No training process of this module outlives it (each test kills what it started)."""
    out = subprocess.run(["pgrep", "-f", "vaswani train .*faults"], capture_output=True,
                         text=True)
    assert out.stdout.strip() == "" or all(int(p) != os.getpid() for p in out.stdout.split())


def test_a_run_that_diverged_says_so_and_its_last_weights_are_named_when_used(setup, tmp_path,
                                                                              capsys):
    """lr 1e30: every loss after the first step is not finite, so no best weights are ever
    kept. Training fails saying it diverged (not exit 0 with a NaN validation loss), and a
    command that then falls back on last/ says so."""
    cfg, _ = setup
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--no-progress", "--set",
                 "train.lr=1e30", "--set", "train.max_steps=6", "--set",
                 "train.eval_every=3", "--set", "train.max_skipped_steps=100"]) == 2
    err = capsys.readouterr().err
    assert "training diverged: the validation loss is nan" in err, err
    assert not (run / rundir.BEST).exists() and (run / "last" / "COMPLETE").exists()
    (tmp_path / "in.txt").write_text("abc\n")
    assert main(["translate", str(run), "--input", str(tmp_path / "in.txt")]) == 0
    assert f"{run} has no best weights" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_resuming_a_cuda_run_without_a_gpu_names_trains_own_setting(setup, tmp_path, capsys):
    """`vaswani train` has no --device flag: the way out it names is its config's."""
    cfg, _ = setup
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--no-progress", "--set",
                 "train.max_steps=2"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress", "--set",
                 "train.device=cuda"]) == 2
    err = capsys.readouterr().err
    assert "use --set train.device=cpu" in err and "--device cpu" not in err
