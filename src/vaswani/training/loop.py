"""The training loop: optimizer steps over micro-batches, evaluation, checkpoints, logging.

One optimizer step:

1. fetch ``grad_accum`` micro-batches (this rank's share of each global batch);
2. count their targets and sum the count over ranks: ``N`` is the step's global token count;
3. for each micro-batch, backward ``loss_sum * world / N`` (DDP averages gradients over ranks,
   hence ``* world``), syncing gradients only on the last one;
4. set the learning rate of this step (schedules.py), clip, update, clear the gradients.

So accumulation and data parallelism give the same update as one big batch. A step whose
loss or gradient norm is not finite updates nothing (it is counted and logged); more than
``[train] max_skipped_steps`` of them in a row stop the run, keeping the last checkpoint.

Stopping (Ctrl-C, SIGTERM, the time budget, early stopping) happens between steps, so a saved
checkpoint always holds the state after a whole step: resuming from it is exact.

A time budget shapes the schedule: a cosine schedule is planned over ``max_steps``, but the
budget may end the run long before. So, past the warm-up, the steps the budget reaches are
estimated from the speed so far (every log line; rank 0's estimate, shared) and the cosine
decays over that many instead: the rate reaches its floor as the budget ends.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from .. import atomic, checkpoint, rundir
from ..config import RunConfig
from ..evaluation.metrics import perplexity
from ..models import build_model
from ..tasks import Task, TaskData
from .distributed import Dist
from .progress import Progress
from .schedules import lr_factor
from .state import Diverged, Stopped, StopRequest, all_finite, check_optimizer_state


class _Abandoned(Exception):
    """An evaluation cut short by a stop request."""


def make_optimizer(model: nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms, biases).

    ``fused=True``: one kernel per parameter updates it in place, where the default
    (``foreach``) makes several temporary copies of every parameter per step.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


class Trainer:
    def __init__(self, cfg: RunConfig, task: Task, data: TaskData, run_dir: Path, *,
                 device: torch.device, dist: Dist | None = None, resume: bool = False,
                 progress: bool = True, stop: StopRequest | None = None) -> None:
        dist = dist or Dist()
        self.cfg, self.task, self.data, self.run_dir = cfg, task, data, run_dir
        self.device, self.dist = device, dist
        t = cfg.train
        torch.manual_seed(t.seed)  # same initial weights on every rank
        self.model = build_model(cfg.model).to(device)
        self.optimizer = make_optimizer(self.model, t)
        self.batches = self.task.batches(data, dist.rank, dist.world)
        self.stop = stop or StopRequest()
        self.step = 0
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        self.best: float | None = None
        self.bad_evals = 0
        self.skipped = self.skipped_in_a_row = 0  # steps with a non-finite loss or gradient
        self.planned_steps: int | None = None  # the schedule's length as the budget allows
        self.progress = progress and dist.is_main  # a bar; without it, a line now and then
        self._fit_start = time.perf_counter()
        torch.manual_seed(t.seed + dist.rank)  # dropout differs across ranks, as it should
        if resume:
            self._restore()
        elif t.init_from:  # fine-tuning: pretrained body, freshly initialised head
            checkpoint.load_weights(self.model, Path(t.init_from) / rundir.BEST, fresh=("head.",))
        self.train_model: nn.Module = self.model
        if dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.train_model = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if t.compile:
            self.train_model = torch.compile(self.train_model)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        t = self.cfg.train
        return t.lr * lr_factor(step, schedule=t.schedule, warmup=t.warmup,
                                max_steps=self.planned_steps or t.schedule_steps,
                                min_ratio=t.min_lr / t.lr)

    def replan(self, elapsed: float) -> None:
        """With a time budget and a cosine schedule: decay over the steps the budget reaches
        at the speed so far (never more than planned; rank 0 decides for every rank)."""
        t = self.cfg.train
        if not (t.max_minutes and t.schedule == "cosine") or self.step < max(t.warmup, 20):
            return
        estimate = self.step * t.max_minutes * 60 / max(elapsed, 1e-9)
        planned = torch.tensor([float(min(t.schedule_steps, max(self.step + 1, estimate)))],
                               device=self.device)
        planned = int(self.dist.broadcast(planned).item())
        if planned < t.schedule_steps and self.planned_steps is None and self.dist.is_main:
            print(f"vaswani train: at this speed the {t.max_minutes:g}-minute budget reaches "
                  f"about {planned:,} of {t.schedule_steps:,} steps; the cosine schedule now "
                  "decays over the steps the budget reaches (re-estimated as training goes)",
                  file=sys.stderr, flush=True)
        self.planned_steps = planned if planned < t.schedule_steps else None

    # --- state -------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"step": self.step, "micro_batches": self.step * self.cfg.train.grad_accum,
                "elapsed": round(self.elapsed + time.perf_counter() - self._fit_start, 1),
                "best": self.best, "bad_evals": self.bad_evals, "skipped_steps": self.skipped,
                "best_metric": self.cfg.train.best_metric,
                "data_fingerprint": self.data.fingerprint(), "fingerprint_format": 2,
                "planned_steps": self.planned_steps}

    def _trainer_state(self) -> dict:
        """Optimizer and random-number state (every rank's: dropout differs per rank)."""
        rng = torch.get_rng_state()
        state = {"optimizer": self.optimizer.state_dict(), "rng_cpu": rng,
                 "rng_cpu_ranks": self.dist.all_gather(rng)}
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore(self) -> None:
        trainer_state, state = checkpoint.load_last(self.run_dir, self.model)
        recorded = state.get("data_fingerprint")
        same = recorded == self.data.fingerprint() or (  # runs saved before encoded datasets
            "fingerprint_format" not in state and recorded == self.data.legacy_fingerprint())
        if not same:
            raise ValueError(f"the training data differs from the data {self.run_dir} was "
                             "trained on; resume with the same [data] files")
        check_optimizer_state(self.optimizer, trainer_state["optimizer"], self.model,
                              checkpoint.find_last(self.run_dir))
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        ranks = trainer_state.get("rng_cpu_ranks") or [trainer_state["rng_cpu"]]
        if len(ranks) == self.dist.world:
            torch.set_rng_state(ranks[self.dist.rank])
        elif self.dist.is_main:  # a different number of processes: rank 0 continues its own
            torch.set_rng_state(trainer_state["rng_cpu"])
        if "rng_cuda" in trainer_state and self.device.type == "cuda":
            torch.cuda.set_rng_state(trainer_state["rng_cuda"], self.device)
        self.step, self.best, self.bad_evals = state["step"], state["best"], state["bad_evals"]
        self.skipped = state.get("skipped_steps", 0)
        self.elapsed = state.get("elapsed", 0.0)
        self.planned_steps = state.get("planned_steps")
        self._trim_metrics(self.step)

    def _trim_metrics(self, step: int) -> None:
        """Drop log lines written after the checkpoint we resume from (and any line cut
        short by a kill)."""
        path = self.run_dir / rundir.METRICS
        if self.dist.is_main and path.exists():
            rows = [r for r in rundir.read_metrics(path) if r["step"] <= step]
            atomic.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))

    def save_last(self) -> None:
        if self.dist.is_main:
            self._require_finite_weights()
            checkpoint.save_last(self.run_dir, self.model, self._trainer_state(), self._state())
        else:
            self._trainer_state()  # the collective gathering every rank's RNG state
        self.dist.barrier()

    def _require_finite_weights(self) -> None:
        if not all_finite(self.model):
            raise Diverged(f"the weights are no longer finite at step {self.step}; the last "
                           f"checkpoint in {self.run_dir} is kept (lower [train] lr?)")

    # --- one optimizer step -------------------------------------------------------------
    def train_step(self) -> tuple[float, int]:
        """One optimizer step on the next global batch; returns (mean smoothed loss, input
        tokens processed)."""
        t = self.cfg.train
        micro = [self.to_device(self.batches.micro_batch(self.step * t.grad_accum + k))
                 for k in range(t.grad_accum)]
        loss_sum, total = self.accumulate(micro)
        self.optimizer_step(finite_loss=math.isfinite(loss_sum))
        tokens = sum(self.task.tokens(b) for b in micro) * self.dist.world  # about, over ranks
        return loss_sum / total, tokens

    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def accumulate(self, micro: list) -> tuple[float, float]:
        """Backward over micro-batches, each loss scaled by world / (targets in the global
        batch). Returns (smoothed loss sum over all ranks, global target count)."""
        t, model = self.cfg.train, self.train_model
        model.train()
        count = torch.tensor([float(sum(self.task.count(b) for b in micro))],
                             dtype=torch.float64, device=self.device)
        total = float(self.dist.all_sum(count).item())  # targets in the global batch
        if total == 0:
            raise RuntimeError("a training batch has no targets")
        scale = self.dist.world / total
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=t.bf16)
        loss_sum = torch.zeros(1, dtype=torch.float64, device=self.device)
        for k, batch in enumerate(micro):
            last = k == len(micro) - 1
            sync = contextlib.nullcontext() if last or not self.dist.enabled else model.no_sync()
            with sync:
                with autocast:
                    loss, _, _ = self.task.loss(model, batch, t.label_smoothing)
                (loss * scale).backward()
            loss_sum += loss.detach().double()
        return float(self.dist.all_sum(loss_sum).item()), total

    def optimizer_step(self, finite_loss: bool = True) -> None:
        """Set this step's learning rate, clip, update and clear the gradients. A non-finite
        loss or gradient norm skips the update (the step still counts, and consumes its
        batch, so batches stay a function of the step)."""
        t = self.cfg.train
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              t.clip_norm if t.clip_norm > 0 else math.inf)
        if finite_loss and math.isfinite(float(norm)):
            self.optimizer.step()
            self.skipped_in_a_row = 0
        else:
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row > t.max_skipped_steps:
                raise Diverged(
                    f"training diverged: the loss or gradients were not finite for "
                    f"{self.skipped_in_a_row} steps in a row (up to step {self.step + 1}); the "
                    f"last checkpoint in {self.run_dir} is kept. Lower [train] lr, or raise "
                    "max_skipped_steps")
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    # --- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation NLL (mean per target), perplexity and the task metric."""
        t = self.cfg.train
        model = self.model.eval()
        nll = count = 0.0
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=t.bf16)
        for i, batch in enumerate(self.batches.valid_batches()):
            if t.eval_batches and i >= t.eval_batches:
                break
            if self.stop.requested:
                raise _Abandoned
            with autocast:
                _, batch_nll, n = self.task.loss(model, self.to_device(batch), 0.0)
            nll += float(batch_nll)
            count += int(n)
        result = {}
        if count:
            result["valid_loss"] = nll / count
            result["valid_ppl"] = perplexity(result["valid_loss"])
        if t.metric_examples and not self.stop.requested:
            with autocast:
                result.update(self.task.metric(model, self.data, self.batches,
                                               t.metric_examples, self.device))
        return result

    def _improved(self, value: float) -> bool:
        if not math.isfinite(value):
            return False  # a NaN or infinite score never replaces the best weights
        if self.best is None or not math.isfinite(self.best):
            return True
        lower_is_better = self.cfg.train.best_metric == "valid_loss"
        return value < self.best if lower_is_better else value > self.best

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to ``max_steps`` (or early stop, or the time budget); returns the last
        evaluation. Raises :class:`Stopped` after saving when asked to stop."""
        t = self.cfg.train
        bar = Progress(max_steps=t.max_steps, budget_s=t.max_minutes * 60,
                       start_step=self.step, start_elapsed=self.elapsed,
                       bar=self.progress, lines=self.dist.is_main)
        tokens, clock = 0, time.perf_counter()
        started = self._fit_start = clock
        last_eval: dict = {}
        done = False
        self.stop.polling = True
        try:
            while self.step < t.max_steps and not done:
                lr = self.lr_at(self.step)  # the rate this step uses
                loss, n = self.train_step()
                tokens += n
                bar.update(self.step, self.elapsed + time.perf_counter() - started)
                out_of_time, stop = self._should_stop(started)
                is_eval = (self.step % t.eval_every == 0 or self.step == t.max_steps
                           or out_of_time) and not stop
                if self.step % t.log_every == 0 or is_eval or stop:
                    elapsed = time.perf_counter() - clock
                    line = {"step": self.step, "loss": loss, "lr": lr,
                            "tokens_per_s": tokens / max(elapsed, 1e-9),
                            "elapsed": round(self.elapsed + time.perf_counter() - started, 1)}
                    if self.skipped:
                        line["skipped_steps"] = self.skipped
                    tokens, clock = 0, time.perf_counter()
                    self.replan(line["elapsed"])
                    if self.planned_steps:
                        line["schedule_steps"] = self.planned_steps
                    bar.update(self.step, line["elapsed"], loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                               tok_s=f"{line['tokens_per_s']:.0f}")
                    if is_eval:
                        done = self._eval_step(line) or out_of_time
                        last_eval = {k: v for k, v in line.items() if k.startswith("valid")
                                     or k in self.task.metrics}
                    if self.dist.is_main:
                        rundir.append_metrics(self.run_dir / rundir.METRICS, line)
                if is_eval and not stop:  # asked to stop during the evaluation?
                    stop = self._should_stop(started)[1]
                if self.step % t.save_every == 0 or done or stop or self.step == t.max_steps:
                    self.save_last()
                    if t.keep_checkpoints and self.dist.is_main:
                        checkpoint.save_checkpoint(self.run_dir, self.model, self.step,
                                               t.keep_checkpoints)
                if stop:
                    raise Stopped(self.run_dir, self.step)
        finally:
            self.stop.polling = False
            bar.close()
        return last_eval

    def _should_stop(self, started: float) -> tuple[bool, bool]:
        """(time budget spent, stop requested), agreed by every rank: rank 0's clock decides
        the budget; a stop request on any rank stops them all."""
        limit = self.cfg.train.max_minutes * 60
        spent = bool(limit) and self.elapsed + time.perf_counter() - started >= limit
        flags = torch.tensor([float(spent and self.dist.is_main), float(self.stop.requested)],
                             device=self.device)
        if self.dist.enabled:
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    def _eval_step(self, line: dict) -> bool:
        """Evaluate on rank 0, keep the best weights, decide early stopping (on every rank).
        An evaluation cut short by a stop request records nothing."""
        t = self.cfg.train
        stop = torch.zeros(1, device=self.device)
        if self.dist.is_main:
            try:
                result = self.evaluate()
            except _Abandoned:
                result = None
            if result is not None:
                line.update(result)
                value = result.get(t.best_metric)
                if value is not None and self._improved(value):
                    self.best, self.bad_evals = value, 0
                    self._require_finite_weights()
                    checkpoint.save_weights(self.model, self.run_dir / rundir.BEST)
                else:
                    self.bad_evals += 1
                if t.patience and self.bad_evals >= t.patience:
                    stop[0] = 1
        self.dist.broadcast(stop)
        return bool(stop.item())
