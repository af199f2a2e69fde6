"""What makes a training run stoppable and resumable exactly: the stop request a signal sets,
the state a run is in (:class:`RunState`), what it keeps on disk and resumes from
(:class:`Checkpoints`: ``last/``, the best weights, the kept checkpoints), and the errors a
run stops with.

``last/`` holds the state after a whole optimizer step: the weights, the optimizer, every
rank's random-number generators, and :class:`RunState` with the data's fingerprint, so that a
run stopped and resumed takes exactly the steps a straight run takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .. import checkpoint
from ..config import RunConfig
from ..data.encode import TaskData
from .distributed import Dist, RankZeroFailed
from .optimizers import Optimizers
from .parallel import Single
from .progress import trim_metrics


class StopRequest:
    """A request to stop training, set by a signal handler (the CLI's, for SIGINT/SIGTERM).

    The training loop polls it between optimizer steps, so that what it then saves (step
    count, weights, optimizer, random-number generators) belongs to one moment; evaluation
    polls it too and is abandoned. While nothing polls it (start-up, reading data), and on a
    second request, :meth:`signal` raises ``KeyboardInterrupt`` at once instead: nothing is
    saved then, and the last checkpoint stays as it was.
    """

    def __init__(self) -> None:
        self.requested = False
        self.polling = False

    def signal(self, name: str = "SIGINT") -> None:
        if self.requested or not self.polling:
            raise KeyboardInterrupt(name)
        self.requested = True


class Stopped(KeyboardInterrupt):
    """Training stopped on request after a complete step, which was saved (an interrupt,
    handled: what a caller catching KeyboardInterrupt expects)."""

    def __init__(self, run_dir: Path, step: int) -> None:
        super().__init__(f"stopped after step {step}; the run is saved: continue it with "
                         f"vaswani train --resume {run_dir}")
        self.step = step


class Diverged(ValueError):
    """The loss or the gradients stayed non-finite; the last checkpoint was kept."""


class SkipCounter:
    """Optimizer steps skipped for a non-finite loss or gradient, counted on the device so
    that no step waits for the device to say whether it was skipped: the run's total, the
    current streak, and the step at which a streak first grew past ``limit`` (-1: none yet).
    :meth:`read` brings them to the host (one wait), on the steps that log or save."""

    def __init__(self, device: torch.device, *, limit: int, total: int = 0) -> None:
        self.limit = limit
        self.total = torch.tensor(total, dtype=torch.int64, device=device)
        self.streak = torch.zeros((), dtype=torch.int64, device=device)
        self.over_at = torch.full((), -1, dtype=torch.int64, device=device)

    def count(self, finite: torch.Tensor, step: int) -> None:
        """Step ``step`` (1-based) was skipped unless ``finite`` (a 0-dim bool tensor)."""
        skipped = (~finite).long()
        self.total += skipped
        self.streak.add_(1).mul_(skipped)
        self.over_at.masked_fill_((self.streak > self.limit) & (self.over_at < 0), step)

    def read(self) -> tuple[int, int | None]:
        """(skipped steps in the run, the step at which a streak passed the limit or None)."""
        total, over_at = torch.stack([self.total, self.over_at]).tolist()
        return total, None if over_at < 0 else over_at


def all_finite(weights: checkpoint.Weights) -> bool:
    tensors = weights.values() if isinstance(weights, dict) else weights.parameters()
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


@dataclass
class RunState:
    """Where a run is: saved in ``last/state.json`` with every checkpoint."""

    step: int = 0  # optimizer steps taken
    elapsed: float = 0.0  # training seconds, earlier processes of a resumed run included
    best: float | None = None  # the best validation score so far ([train] best_metric)
    bad_evals: int = 0  # evaluations since it last improved (early stopping)
    skipped: int = 0  # steps whose loss or gradient was not finite (they update nothing)
    planned_steps: int | None = None  # the schedule's length as the time budget allows


class Checkpoints:
    """What a run keeps in its directory (rank 0 writes; every rank takes part in gathering
    the random-number state): ``last/`` every ``save_every`` steps, the best weights after an
    evaluation that improved, the last ``keep_checkpoints`` checkpoints' weights."""

    def __init__(self, cfg: RunConfig, run_dir: Path, data: TaskData, dist: Dist,
                 device: torch.device, parallel: Single,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        self.cfg, self.run_dir, self.data, self.dist, self.device = cfg, run_dir, data, dist, device
        self.parallel = parallel  # what each process holds (parallel.py)
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None  # fp16

    def save(self, model: nn.Module, optimizer: Optimizers, state: RunState) -> None:
        """``last/`` (and a kept checkpoint), after a whole step. Every rank calls it: a
        sharded run's ranks each write their slices, then rank 0 the weights in one file."""
        saved = self._state_json(state)
        trainer_state = self._trainer_state(optimizer)  # a collective: every rank
        folder = self.parallel.save(model, optimizer, self.run_dir)  # a sharded run's slices
        weights = self.parallel.full_weights(model)  # a collective when sharded
        failure = None
        if self.dist.is_main:
            try:
                require_finite(weights, state.step, self.run_dir)
                checkpoint.save_last(self.run_dir, weights, trainer_state, saved,
                                     sharded=folder)
                if self.cfg.train.keep_checkpoints:
                    checkpoint.save_checkpoint(self.run_dir, weights, state.step,
                                               self.cfg.train.keep_checkpoints)
            except Exception as error:  # the other ranks must hear of it, not wait for it
                failure = error
        self.agree(failure, f"saving step {state.step}")

    def agree(self, failure: Exception | None, doing: str) -> None:
        """After a part of the work that rank 0 does alone (saving, evaluating): every rank
        learns whether it failed and raises too, instead of waiting at the next collective
        for a rank that has left (until the process group's timeout, many minutes later).
        Rank 0 raises its own error; the others say what rank 0 was ``doing``."""
        code = 0 if failure is None else 1 if isinstance(failure, Diverged) else 2
        code = int(self.dist.broadcast(torch.tensor([code], device=self.device)).item())
        if failure is not None:
            raise failure
        if code == 1:
            raise Diverged(f"rank 0 found the weights no longer finite while {doing}; the "
                           f"last checkpoint in {self.run_dir} is kept")
        if code == 2:
            raise RankZeroFailed(f"rank 0 failed while {doing} (its error says why); the last "
                               f"checkpoint in {self.run_dir} is kept")

    def judge(self, state: RunState, result: dict) -> tuple[bool, bool]:
        """After an evaluation on rank 0: whether ``[train] best_metric`` improved (the
        caller then saves the weights with :meth:`save_best`), and whether early stopping
        (``patience``) says to stop."""
        t = self.cfg.train
        value = result.get(t.best_metric)
        better = value is not None and improved(value, state.best,
                                                t.best_metric == "valid_loss")
        if better:
            state.best, state.bad_evals = value, 0
        else:
            state.bad_evals += 1
        return better, bool(t.patience) and state.bad_evals >= t.patience

    def save_best(self, weights: checkpoint.Weights, state: RunState) -> None:
        """The best weights so far (rank 0: the model, or a sharded model's gathered
        tensors)."""
        require_finite(weights, state.step, self.run_dir)
        checkpoint.save_best(self.run_dir, weights)

    def restore(self, model: nn.Module, optimizer: Optimizers) -> RunState:
        """Load ``last/`` into the model, the optimizer and the random-number generators;
        returns the run's state. Resuming on other data is refused."""
        trainer_state, saved = self.parallel.load(model, optimizer, self.run_dir)
        check_saved_state(saved, checkpoint.find_last(self.run_dir) / "state.json")
        recorded = saved.get("data_fingerprint")
        same = recorded == self.data.fingerprint() or (  # runs saved before encoded datasets
            "fingerprint_format" not in saved and recorded == self.data.legacy_fingerprint())
        if not same:
            raise ValueError(f"the training data differs from the data {self.run_dir} was "
                             "trained on; resume with the same [data] files")
        if self.scaler is not None and "grad_scaler" in trainer_state:
            self.scaler.load_state_dict(trainer_state["grad_scaler"])
        ranks = trainer_state.get("rng_cpu_ranks") or [trainer_state["rng_cpu"]]
        if len(ranks) == self.dist.world:
            torch.set_rng_state(ranks[self.dist.rank])
        elif self.dist.is_main:  # a different number of processes: rank 0 continues its own
            torch.set_rng_state(trainer_state["rng_cpu"])
        if "rng_cuda" in trainer_state and self.device.type == "cuda":
            torch.cuda.set_rng_state(trainer_state["rng_cuda"], self.device)
        state = RunState(step=saved["step"], elapsed=saved.get("elapsed", 0.0),
                         best=saved["best"], bad_evals=saved["bad_evals"],
                         skipped=saved.get("skipped_steps", 0),
                         planned_steps=saved.get("planned_steps"))
        if self.dist.is_main:
            trim_metrics(self.run_dir, state.step)
        return state

    def _trainer_state(self, optimizer: Optimizers) -> dict:
        """Optimizer and random-number state (every rank's: dropout differs per rank). A
        sharded optimizer is saved with the sharded weights instead."""
        rng = torch.get_rng_state()
        out = {"rng_cpu": rng, "rng_cpu_ranks": self.dist.all_gather(rng)}
        out.update(self.parallel.optimizer_state(optimizer))
        if self.device.type == "cuda":
            out["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        if self.scaler is not None:
            out["grad_scaler"] = self.scaler.state_dict()
        return out

    def _state_json(self, state: RunState) -> dict:
        return {"step": state.step, "micro_batches": state.step * self.cfg.train.grad_accum,
                "elapsed": round(state.elapsed, 1), "best": state.best,
                "bad_evals": state.bad_evals, "skipped_steps": state.skipped,
                "best_metric": self.cfg.train.best_metric,
                "data_fingerprint": self.data.fingerprint(), "fingerprint_format": 2,
                "planned_steps": state.planned_steps}


def check_saved_state(saved: dict, path: Path) -> None:
    """``state.json``'s counts must be counts: a hand edit or a damaged file is refused by
    name, not resumed from step -1 nor blamed on the data."""
    for key in ("step", "bad_evals", "skipped_steps", "micro_batches"):
        value = saved.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{path} is damaged: {key} ({value!r}) must be a whole number "
                             ">= 0; the run cannot be resumed from it")
    best = saved.get("best")
    if isinstance(best, bool) or not isinstance(best, int | float | None):
        raise ValueError(f"{path} is damaged: best ({best!r}) must be a number or null; the "
                         "run cannot be resumed from it")


def improved(value: float, best: float | None, lower_is_better: bool) -> bool:
    """Whether ``value`` beats ``best``; a NaN or infinite score never does."""
    if not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value < best if lower_is_better else value > best


def require_finite(weights: checkpoint.Weights, step: int, run_dir: Path) -> None:
    """Weights that are no longer finite are never saved: the run stops, keeping the last
    checkpoint."""
    if not all_finite(weights):
        raise Diverged(f"the weights are no longer finite at step {step}; the last "
                       f"checkpoint in {run_dir} is kept (lower [train] lr?)")

