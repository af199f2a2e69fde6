"""Training under ``torchrun --max-restarts``: a rank killed during a step, a save and an
evaluation, each time restarted by torchrun, and the job ends on its own with the run an
uninterrupted job makes (rundir.restarted_into, training/train.py)."""

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests import processes
from tests.processes import free_port
from tests.training.fixtures import cpu_config as config  # several gloo processes
from tests.training.fixtures import reverse_task
from vaswani import rundir

STEPS, SAVE_EVERY, EVAL_EVERY = 24, 4, 5
HELPER = str(Path(__file__).parents[1] / "training" / "die_in.py")


def torchrun(cfg: Path, out: Path, *extra: str, script: str | None = None, env: dict | None = None,
             restarts: int = 0) -> processes.subprocess.CompletedProcess:
    """``vaswani train CONFIG --out OUT`` on 2 gloo processes, ``--standalone`` (a job id of its
    own), ``restarts`` restarts allowed."""
    return processes.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         f"--max-restarts={restarts}", "--monitor-interval=0.5",
         *([script] if script else ["-m", "vaswani"]), "train", str(cfg), "--out", str(out),
         "--no-progress", *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)


def resume_job(run: Path, *extra: str) -> None:
    """``vaswani train --resume RUN`` on two processes, to its end."""
    done = processes.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "vaswani", "train", "--resume", str(run), "--no-progress", *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_run(run: Path, uninterrupted: Path) -> None:
    """Every step logged once, each loss and the final weights within 1e-6 of the job that
    was never interrupted."""
    rows = [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()]
    want = {r["step"]: r["loss"] for r in rundir.read_metrics(uninterrupted / rundir.METRICS)}
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # none missing, none twice
    for r in rows:
        assert abs(r["loss"] - want[r["step"]]) <= 1e-6, r["step"]
    a = load_file(str(run / "last/model.safetensors"))
    b = load_file(str(uninterrupted / "last/model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    base = tmp_path_factory.mktemp("elastic")
    data = reverse_task(base / "pairs.tsv", n=400)
    cfg = config(base / "c.toml", "encoder-decoder", data, dropout=0.1,
                 train={"max_steps": STEPS, "save_every": SAVE_EVERY, "eval_every": EVAL_EVERY,
                        "metric_examples": 8, "schedule": "cosine", "warmup": 4})
    done = torchrun(cfg, base / "straight")
    assert done.returncode == 0, done.stderr[-3000:]
    return cfg, base / "straight"


@pytest.mark.slow
def test_a_job_whose_ranks_are_killed_three_times_finishes_as_if_never_killed(straight,
                                                                            tmp_path):
    cfg, uninterrupted = straight
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    at_step = rng.randint(2, 7)  # during a step
    at_save = rng.choice([8, 12])  # saves every 4 steps: one was made before this one
    at_eval = rng.choice([s for s in (10, 15, 20) if s > at_save + 1])  # evaluations every 5
    plan = f"{rng.randint(0, 1)}:step:{at_step},0:save:{at_save},0:eval:{at_eval}"
    run = tmp_path / "run"
    done = torchrun(cfg, run, script=HELPER, env={"DIE": plan}, restarts=3)
    said = f"seed {seed}, plan {plan}:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, said
    assert done.stderr.count("die_in.py: rank") == 3, said
    # after the save and the evaluation, a checkpoint was there to resume from (after the
    # step, maybe not: a start that saved nothing is cleared, and the restart starts afresh)
    for restart in (2, 3):
        assert f"torchrun restarted this job (restart {restart}); resuming" in done.stderr, said
    try:
        assert_same_run(run, uninterrupted)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{said}") from None


def test_a_restart_never_takes_over_a_run_its_job_did_not_start(straight, tmp_path):
    """The first attempt is refused (the directory holds another job's run); torchrun's
    restarts of it are refused too, and the run is left as it was."""
    cfg, uninterrupted = straight
    before = (uninterrupted / "last/state.json").read_text()
    done = torchrun(cfg, uninterrupted, restarts=1)
    assert done.returncode != 0
    assert "already holds a run" in done.stderr
    assert "torchrun restarted this job" not in done.stderr
    assert (uninterrupted / "last/state.json").read_text() == before
    # each attempt: rank 0's one line, no traceback from either rank (torchrun's own summary
    # of its failed children is its own)
    ours = done.stderr.split("ChildFailedError")[0]
    assert ours.count("vaswani: error:") == 2 and "Traceback" not in ours.replace(
        "Traceback (most recent call last):\n  File \"<frozen runpy>\"", ""), ours[-3000:]


def test_only_the_job_that_started_a_run_continues_it(tmp_path, monkeypatch):
    """Whatever torchrun's restart count says (a restart for a change of membership is not
    counted), the job recorded in launcher.json continues the run, and no other does."""
    (tmp_path / rundir.CONFIG).write_text("")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    assert not rundir.restarted_into(tmp_path)  # a new run: rank 0 has not recorded it yet
    rundir.record_launcher(tmp_path)
    for count in ["0", "1"]:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
        assert rundir.restarted_into(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    assert not rundir.restarted_into(tmp_path)  # another job's run
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert not rundir.restarted_into(tmp_path)  # not under torchrun
    assert not rundir.restarted_into(tmp_path / "nothing-here")


def test_restarts_on_several_machines_with_a_shared_store_are_refused(monkeypatch):
    """torchrun's agents share a store across restarts by default; on several machines their
    restart counts can differ, so a restarted group would wait for itself until the timeout:
    refused at start, naming the setting that gives each attempt a store of its own."""
    from vaswani.training import distributed

    for name, value in [("TORCHELASTIC_USE_AGENT_STORE", "True"),
                        ("TORCHELASTIC_MAX_RESTARTS", "3"), ("GROUP_WORLD_SIZE", "2")]:
        monkeypatch.setenv(name, value)
    distributed._attempt_store.cache_clear()
    with pytest.raises(RuntimeError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        distributed._attempt_store()
    distributed._attempt_store.cache_clear()


@pytest.mark.slow
def test_two_nodes_on_loopback_train_and_one_node_resumes(straight, tmp_path):
    """Two torchrun "nodes" (one process each) meet at a c10d rendezvous on 127.0.0.1, train
    the first half, and one node alone resumes the run to the end: the losses and weights of
    the two-process job that was never split (docs/distributed.md, several machines)."""
    cfg, uninterrupted = straight
    run, port = tmp_path / "run", free_port()

    both(cfg, run, "--set", f"train.max_steps={STEPS // 2}", "--set",
         f"train.schedule_steps={STEPS}", port=port)
    assert json.loads((run / "last/state.json").read_text())["step"] == STEPS // 2
    resume_job(run, "--set", f"train.max_steps={STEPS}")
    assert_same_run(run, uninterrupted)


def environment(pid: int) -> dict[str, str]:
    """The environment a running process was started with."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def start_job(cfg: Path, run: Path, log: Path, steps: int, *extra: str
              ) -> tuple[processes.subprocess.Popen, dict[int, int]]:
    """A two-process job (torchrun, no restarts) in the background, once ``steps`` steps are
    logged: the torchrun process, and each rank's pid."""
    proc = processes.subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "vaswani", "train", str(cfg), "--out", str(run), "--no-progress", *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log.open("w"),
        stderr=processes.subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = run / rundir.METRICS
        if metrics.exists() and len(rundir.read_metrics(metrics)) >= steps:
            break
        time.sleep(0.02)
    ranks = {int(env["RANK"]): pid for pid in processes.descendants(proc.pid)
             if "RANK" in (env := environment(pid))}
    if set(ranks) != {0, 1}:
        processes.kill_tree(proc)
        raise AssertionError(f"no two ranks running:\n{log.read_text()[-2000:]}")
    return proc, ranks


def test_sigterm_to_one_rank_stops_every_rank_saved_and_the_run_resumes(straight, tmp_path):
    """A job scheduler's SIGTERM reaching one process only: every rank stops after the same
    whole step, that step is saved, and resuming ends as the job never stopped."""
    cfg, uninterrupted = straight
    run, log = tmp_path / "run", tmp_path / "log.txt"
    proc, ranks = start_job(cfg, run, log, 3)
    try:
        os.kill(ranks[1], signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        processes.kill_tree(proc)
    text = log.read_text()
    assert "stopped after step" in text, text[-3000:]
    step = json.loads((run / "last/state.json").read_text())["step"]
    assert 3 <= step < STEPS
    resume_job(run)
    assert_same_run(run, uninterrupted)


def test_a_rank_that_hangs_ends_the_job_after_collective_timeout(straight, tmp_path):
    """A rank that stops answering without dying (SIGSTOP: a stuck driver, a frozen machine):
    the other gives up at its next exchange after [train] collective_timeout seconds, with an
    error, instead of waiting forever (a hang would fail the test at its 120 s limit)."""
    cfg, _ = straight
    run, log = tmp_path / "run", tmp_path / "log.txt"
    proc, ranks = start_job(cfg, run, log, 2, "--set", "train.collective_timeout=3", "--set",
                            "train.max_steps=100000")
    try:
        os.kill(ranks[1], signal.SIGSTOP)
        assert processes.wait_gone([ranks[0]], timeout=120) == [], "rank 0 waits forever"
    finally:
        processes.kill_tree(proc)
        for pid in ranks.values():
            if processes.alive(pid):
                os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert "[rank0]" in text and "timed out" in text.lower(), text[-3000:]


def test_collective_timeout_must_be_positive():
    from vaswani.config import TrainConfig

    with pytest.raises(ValueError, match=r"collective_timeout \(0(\.0)?\) must be positive"):
        TrainConfig(collective_timeout=0).validate()


def two_nodes(cfg: Path, run: Path, *extra: str, script: str | None = None,
              env: dict | None = None, port: int | None = None,
              restarts: int = 0) -> processes.subprocess.Popen:
    """One torchrun "node" (one process) of a job that meets at a c10d rendezvous on
    127.0.0.1:``port``, as on several machines, each attempt at a store of its own (the
    documented command line)."""
    return processes.subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
         "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
         f"--rdzv_id=loopback-{port}", f"--max-restarts={restarts}", "--monitor-interval=0.5",
         *([script] if script else ["-m", "vaswani"]), "train", str(cfg), "--out", str(run),
         "--no-progress", *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
             **(env or {})},
        stdout=processes.subprocess.PIPE, stderr=processes.subprocess.PIPE, text=True)


def both(*args, **kwargs) -> str:
    """Both nodes of ``two_nodes(*args, **kwargs)`` run to their end, successfully; their
    standard errors."""
    nodes = [two_nodes(*args, **kwargs) for _ in range(2)]
    errs = []
    try:
        for proc in nodes:
            errs.append(proc.communicate(timeout=400)[1])
    finally:
        for proc in nodes:
            processes.kill_tree(proc)
    said = "\n".join(e[-3000:] for e in errs)
    assert all(proc.returncode == 0 for proc in nodes), said
    return said


@pytest.mark.parametrize("moment", ["step:6", pytest.param("wait:10", marks=pytest.mark.slow)])
def test_two_nodes_restart_after_one_loses_its_process(straight, tmp_path, moment):
    """Several machines: the process of one node is killed; its torchrun restarts it, the
    other node's torchrun restarts its own, and the job ends with the run a job never killed
    makes. Killed during a step, the other rank fails at its next exchange and both torchruns
    count a restart; killed while rank 0 evaluates alone (4 s), the other node's torchrun sees
    the first rejoin the rendezvous and restarts its process as a membership change, which
    it does not count: the two nodes' restart counts then differ, and only rank 0's view of
    the run decides whether the job continues it."""
    cfg, uninterrupted = straight
    run, port = tmp_path / "run", free_port()
    env = {"DIE": f"1:{moment}", "ONCE": str(tmp_path / "died"), "SLOW": "4"}
    said = both(cfg, run, "--set", "train.collective_timeout=30", script=HELPER, env=env,
                port=port, restarts=3)
    assert "die_in.py: rank 1 killed" in said
    assert_same_run(run, uninterrupted)
