"""What training reports, from rank 0: to a person watching, a progress bar against what ends
the run, or, with ``--no-progress``, a plain line every so often (:class:`Progress`); to files,
one JSON object per log step in ``metrics.jsonl`` (:class:`Report`, which drives both).

With a time budget (``[train] max_minutes``) the bar fills with the budget's seconds and its
ETA is the time left; with steps only it fills with steps. Either way the postfix shows the
step, the loss, the learning rate and tokens/s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from .. import rundir
from ..atomic import append_line, atomic_write_text


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """``update(step, elapsed, **stats)`` after every step; ``close()`` at the end.

    ``bar``: draw a tqdm bar (interactive use); otherwise, if ``lines``, print one line every
    ``every`` seconds (logs, ``--no-progress``)."""

    def __init__(self, *, max_steps: int, budget_s: float, start_step: int, start_elapsed: float,
                 bar: bool, lines: bool, every: float = 60.0, stream=None) -> None:
        self.max_steps, self.budget = max_steps, budget_s
        self.lines, self.every = lines and not bar, every
        self.stream = stream or sys.stderr
        self._last_line = time.perf_counter()
        self._start = (start_step, start_elapsed)
        interactive = self.stream.isatty() if hasattr(self.stream, "isatty") else False
        if budget_s:
            self.bar = tqdm(total=round(budget_s), initial=min(round(start_elapsed),
                                                                round(budget_s)),
                            disable=not bar, unit="s", dynamic_ncols=True, file=self.stream,
                            desc=f"train ({budget_s / 60:g}-minute budget)",
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, "
                                       "{remaining} left{postfix}",
                            mininterval=0.5 if interactive else 30.0)
        else:
            self.bar = tqdm(total=max_steps, initial=start_step, disable=not bar, unit="step",
                            dynamic_ncols=True, desc="train", file=self.stream,
                            mininterval=0.5 if interactive else 30.0)
        self._interactive = interactive

    def update(self, step: int, elapsed: float, **stats) -> None:
        """``elapsed``: training seconds so far (earlier processes of a resumed run included)."""
        if self.budget:
            self.bar.update(min(round(elapsed), round(self.budget)) - self.bar.n)
        else:
            self.bar.update(step - self.bar.n)
        if stats:
            shown = {"step": f"{step}" if self.budget else None, **stats}
            self.bar.set_postfix({k: v for k, v in shown.items() if v is not None},
                                 refresh=self._interactive)
        if self.lines and stats and time.perf_counter() - self._last_line >= self.every:
            self._last_line = time.perf_counter()
            print(self.line(step, elapsed, **stats), file=self.stream, flush=True)

    def eta(self, step: int, elapsed: float) -> float:
        """Seconds left: to the budget's end, or to max_steps at this process's speed."""
        done_steps, done_s = step - self._start[0], elapsed - self._start[1]
        by_steps = (self.max_steps - step) * done_s / done_steps if done_steps > 0 else float("inf")
        if self.budget:
            return min(max(0.0, self.budget - elapsed), by_steps)
        return by_steps

    def line(self, step: int, elapsed: float, **stats) -> str:
        left = self.eta(step, elapsed)
        where = (f"{elapsed / 60:.1f} of {self.budget / 60:g} min, step {step}" if self.budget
                 else f"step {step}/{self.max_steps} ({100 * step / self.max_steps:.0f}%)")
        extra = "".join(f", {k} {v}" for k, v in stats.items())
        eta = "?" if left == float("inf") else _clock(left)
        return f"vaswani train: {where}{extra}, {_clock(elapsed)} elapsed, ETA {eta}"

    def close(self) -> None:
        self.bar.close()


class Report:
    """Everything a run reports, through :meth:`update` after every optimizer step: the bar,
    and with a log line, the bar's postfix and a line in ``metrics.jsonl`` (rank 0), and with
    ``tensorboard`` the line's numbers as TensorBoard scalars in ``RUN_DIR/tensorboard/``."""

    def __init__(self, run_dir: Path, *, main: bool, bar: bool, max_steps: int,
                 budget_s: float, start_step: int, start_elapsed: float,
                 tensorboard: bool = False) -> None:
        self.metrics = run_dir / rundir.METRICS if main else None
        if main:
            rundir.record(run_dir, rundir.METRICS, *([f"{TENSORBOARD}/*"] if tensorboard else []))
        self.progress = Progress(max_steps=max_steps, budget_s=budget_s, start_step=start_step,
                                 start_elapsed=start_elapsed, bar=bar and main, lines=main)
        self.board = None
        if tensorboard and main:
            self.board = tensorboard_writer(run_dir / TENSORBOARD, purge_step=start_step + 1)

    def update(self, step: int, elapsed: float, line: dict | None = None) -> None:
        """After optimizer step ``step`` (``elapsed`` training seconds so far), with a log
        line on log steps: ``step``, ``loss``, ``lr``, ``tokens_per_s``, ``elapsed``, and after
        an evaluation the validation metrics."""
        if line is None:
            self.progress.update(step, elapsed)
            return
        self.progress.update(step, elapsed, loss=f"{line['loss']:.4f}", lr=f"{line['lr']:.2e}",
                             tok_s=f"{line['tokens_per_s']:.0f}")
        if self.metrics is not None:
            append_line(self.metrics, json.dumps(line))
        if self.board is not None:
            for name, value in line.items():
                if name == "peak_memory_mib":
                    for rank, mib in enumerate(value):
                        self.board.add_scalar(f"memory/peak_mib_rank{rank}", mib, step)
                elif name != "step" and isinstance(value, (int, float)):
                    group = "train" if name in TRAIN_KEYS else "valid"  # the rest: evaluation
                    self.board.add_scalar(f"{group}/{name}", value, step)
            self.board.flush()

    def close(self) -> None:
        self.progress.close()
        if self.board is not None:
            self.board.close()


TENSORBOARD = rundir.TENSORBOARD
# a log line's training numbers; an evaluation adds valid_loss, valid_ppl and task metrics
TRAIN_KEYS = ("loss", "lr", "tokens_per_s", "grad_norm", "elapsed", "skipped_steps",
              "schedule_steps")


def tensorboard_writer(directory: Path, purge_step: int):
    """A SummaryWriter; a resumed run drops the events logged after its checkpoint
    (``purge_step``), as metrics.jsonl does."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("[train] tensorboard = true needs TensorBoard: "
                          "pip install 'vaswani[tensorboard]'") from None
    return SummaryWriter(str(directory), purge_step=purge_step)


def trim_metrics(run_dir: Path, step: int) -> None:
    """Drop log lines written after the checkpoint a run resumes from (and any line cut
    short by a kill)."""
    path = run_dir / rundir.METRICS
    if path.exists():
        rows = [r for r in rundir.read_metrics(path) if r["step"] <= step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
