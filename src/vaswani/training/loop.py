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
checkpoint always holds the state after a whole step: resuming from it is exact (state.py saves
and restores it; progress.py reports what happens).

A time budget shapes the schedule: a cosine (or wsd) schedule is planned over ``max_steps``,
but the budget may end the run long before. So, past the warm-up, the steps the budget reaches
are estimated from the speed so far (every log line; rank 0's estimate, shared) and the
schedule decays over that many instead: the rate reaches its floor as the budget ends.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from .. import checkpoint, devices, rundir
from ..checkpoint.quantized import load_frozen
from ..config import RunConfig
from ..data.batching import Batch
from ..devices import peak_resident_bytes
from ..evaluation.metrics import perplexity
from ..models.finetune import add_adapters, check_base, new_parts
from ..nn.layers import Stack
from ..tasks import Task, TaskData
from . import parallel
from .distributed import Dist
from .feed import Feed
from .optimizers import make_optimizer
from .progress import Report
from .schedules import DECAYING, lr_factor
from .state import Checkpoints, Diverged, RunState, SkipCounter, Stopped, StopRequest


class _Abandoned(Exception):
    """An evaluation cut short by a stop request."""


class Trainer:
    """A model, its optimizer and the task's batches, and the loop that trains them. The
    run's state (step, best score, ...) is ``self.state``; ``resume`` restores it, with the
    weights, the optimizer and the random-number generators, from the run's ``last/``."""

    def __init__(self, cfg: RunConfig, task: Task, data: TaskData, run_dir: Path, *,
                 device: torch.device, dist: Dist | None = None, resume: bool = False,
                 progress: bool = True, stop: StopRequest | None = None) -> None:
        dist = dist or Dist()
        self.cfg, self.task, self.data, self.run_dir = cfg, task, data, run_dir
        self.device, self.dist, self.progress = device, dist, progress
        self.stop = stop or StopRequest()
        t = cfg.train
        torch.manual_seed(t.seed)  # same initial weights on every rank
        self.parallel = parallel.for_run(t.parallel, dist)  # one process, DDP or FSDP
        fresh = new_parts(cfg.model)  # a classifier's new head
        # resumed, or fine-tuned with no new head, every weight is loaded: none drawn first
        loaded = resume or bool(t.init_from and not fresh)
        base = Path(t.init_from) / rundir.BEST
        if lora := cfg.finetune.lora:  # the weights its adapters were trained on, still
            check_base(base, cfg.finetune, run_dir)
        qlora = cfg.finetune.quantize  # QLoRA: the frozen weights read into int8/int4 layers
        if qlora:  # adapters on the frozen int8/int4 layers: all that is trained and saved
            self.model = load_frozen(cfg.model, base, qlora, device)
            add_adapters(self.model, cfg.finetune, trainable=fresh)
        else:  # LoRA: built with its adapters (sharded: before the slices are cut)
            self.model = self.parallel.build(cfg.model, device, t.precision,
                                             initialise=not loaded, trainable=fresh,
                                             adapters=cfg.finetune if lora else None)
        for module in self.model.modules():  # [train] checkpoint_activations: every stack
            if isinstance(module, Stack):
                module.checkpoint_activations = t.checkpoint_activations
        if t.init_from and (lora or not resume) and not qlora:  # pretrained (into the slices)
            checkpoint.load_weights(self.model, base, fresh=fresh,  # (LoRA: on resume too,
                                    frozen=bool(lora))  # into its frozen weights)
        self.optimizer = make_optimizer(self.model, t)
        self.batches = task.batches(data, dist.rank, dist.world)
        self.feed = Feed(self.batches, device, t.grad_accum)
        # fp16 gradients underflow without a scale; it adapts, and resumes with the run
        self.scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
        self.checkpoints = Checkpoints(cfg, run_dir, data, dist, device, self.parallel,
                                       self.scaler)
        torch.manual_seed(t.seed + dist.rank)  # dropout differs across ranks, as it should
        self.state = RunState()
        if resume:
            self.state = self.checkpoints.restore(self.model, self.optimizer)
        # steps with a non-finite loss or gradient, counted on the device
        self.skips = SkipCounter(device, limit=t.max_skipped_steps, total=self.state.skipped)
        self.grad_norm = torch.full((), math.nan, device=device)  # the last step's, unclipped
        self.train_model = self.parallel.wrap(self.model, device)  # what the step runs through
        if t.compiles(device):  # and the task's criterion (tasks/base.py) is compiled too
            self.train_model = torch.compile(self.train_model)
        self.report = Report(run_dir, main=dist.is_main, bar=progress, max_steps=t.max_steps,
                             budget_s=t.max_minutes * 60, start_step=self.state.step,
                             start_elapsed=self.state.elapsed, tensorboard=t.tensorboard)

    def autocast(self):
        """Autocast to the run's precision (a no-op context for fp32)."""
        dtype = devices.AUTOCAST[self.cfg.train.precision]
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    # --- the learning rate ----------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        t = self.cfg.train
        return t.lr * lr_factor(step, schedule=t.schedule, warmup=t.warmup,
                                max_steps=self.state.planned_steps or t.schedule_steps,
                                min_ratio=t.min_lr / t.lr, cooldown=t.cooldown)

    def replan(self, elapsed: float) -> None:
        """With a time budget and a schedule that decays (cosine, wsd): decay over the steps
        the budget reaches at the speed so far (never more than planned; rank 0 decides for
        every rank)."""
        t, state = self.cfg.train, self.state
        if not (t.max_minutes and t.schedule in DECAYING) or state.step < max(t.warmup, 20):
            return
        estimate = state.step * t.max_minutes * 60 / max(elapsed, 1e-9)
        planned = torch.tensor([float(min(t.schedule_steps, max(state.step + 1, estimate)))],
                               device=self.device)
        planned = int(self.dist.broadcast(planned).item())
        if planned < t.schedule_steps and state.planned_steps is None and self.dist.is_main:
            print(f"vaswani train: at this speed the {t.max_minutes:g}-minute budget reaches "
                  f"about {planned:,} of {t.schedule_steps:,} steps; the {t.schedule} schedule now "
                  "decays over the steps the budget reaches (re-estimated as training goes)",
                  file=sys.stderr, flush=True)
        state.planned_steps = planned if planned < t.schedule_steps else None

    # --- one optimizer step -------------------------------------------------------------
    def train_step(self) -> tuple[Tensor, int, float]:
        """One optimizer step on the next global batch; returns (mean smoothed loss, a
        0-dim tensor on the device, input tokens processed, the learning rate it used).

        Nothing in a step waits for the device (on a GPU the host queues the next step's
        kernels while this one runs): the loss stays a tensor until a log line reads it, and
        a non-finite step is skipped by the optimizer itself (see :meth:`optimizer_step`)."""
        micro = self.feed.take(self.state.step)  # built ahead, on a GPU (feed.py)
        tokens = sum(b.tokens for b in micro) * self.dist.world  # about, over ranks
        loss_sum, total = self.accumulate(micro)
        lr = self.optimizer_step(loss_sum)
        return loss_sum / total, tokens, lr

    def accumulate(self, micro: list[Batch]) -> tuple[Tensor, float]:
        """Backward over micro-batches, each loss scaled by world / (targets in the global
        batch). Returns (smoothed loss sum over all ranks, a float64 tensor on the device;
        global target count)."""
        t, model = self.cfg.train, self.train_model
        model.train()
        total = float(sum(b.targets for b in micro))  # counted on the host when batched
        if self.dist.enabled:  # targets in the global batch
            count = torch.tensor([total], dtype=torch.float64, device=self.device)
            total = float(self.dist.all_sum(count).item())
        if total == 0:
            raise RuntimeError("a training batch has no targets")
        scale = self.dist.world / total
        autocast = self.autocast()
        loss_sum = torch.zeros(1, dtype=torch.float64, device=self.device)
        for k, batch in enumerate(micro):
            last = k == len(micro) - 1
            with self.parallel.sync(self.train_model, last):  # reduce in the last backward
                with autocast:
                    loss, _, _ = self.task.loss(model, batch, t.label_smoothing)
                self.scaler.scale(loss * scale).backward()
            loss_sum += loss.detach().double()
        return self.dist.all_sum(loss_sum)[0], total

    def optimizer_step(self, loss_sum: Tensor | None = None) -> float:
        """Set this step's learning rate, clip, update and clear the gradients; returns the
        rate. A non-finite loss (``loss_sum``) or gradient norm skips the update (the step
        still counts, and consumes its batch, so batches stay a function of the step).

        The skip is decided on the device where the optimizer can (fused AdamW, see
        :meth:`Optimizers.step`). The skips are counted on the device too and read by
        :meth:`settle` on the steps that log or save."""
        t, state = self.cfg.train, self.state
        lr = self.lr_at(state.step)
        self.optimizer.set_lr(lr / t.lr)  # each optimizer's peak rate, scaled alike
        for optimizer in self.optimizer:
            self.scaler.unscale_(optimizer)  # (no-op unless fp16)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              t.clip_norm if t.clip_norm > 0 else math.inf)
        self.grad_norm = norm = self.parallel.full(norm).detach()  # before clipping (log lines)
        finite_loss = (torch.ones((), dtype=torch.bool, device=norm.device) if loss_sum is None
                       else torch.isfinite(loss_sum))
        if self.scaler.is_enabled():
            # fp16: an overflowing gradient is the scaler's to handle: it skips the update
            # and lowers the scale; only a non-finite loss counts towards divergence (this
            # path reads the loss's finiteness on the host, as the scaler reads its own)
            finite = finite_loss
            if bool(finite_loss):
                for optimizer in self.optimizer:
                    self.scaler.step(optimizer)
                self.scaler.update()
        else:
            finite = finite_loss & torch.isfinite(norm)
            self.optimizer.step(finite)  # skips the update on the device where it can
        self.skips.count(finite, state.step + 1)
        self.optimizer.zero_grad()
        state.step += 1
        return lr

    def settle(self) -> None:
        """Read the device's skip counters into the run's state (waits for the device);
        raise :class:`Diverged` if more than ``max_skipped_steps`` steps in a row were
        skipped."""
        t = self.cfg.train
        self.state.skipped, streak = self.skips.read()
        if streak is not None:
            raise Diverged(
                f"training diverged: the loss or gradients were not finite for "
                f"{t.max_skipped_steps + 1} steps in a row (up to step {streak}); "
                f"the last checkpoint in {self.run_dir} is kept. Lower [train] lr, or "
                "raise max_skipped_steps")

    # --- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None) -> dict:
        """Validation NLL (mean per target), perplexity and the task metric, of ``model``
        (the trained model by default)."""
        t = self.cfg.train
        model = (model or self.model).eval()
        nll = count = 0.0
        autocast = self.autocast()
        for i, batch in enumerate(self.batches.valid_batches()):
            if t.eval_batches and i >= t.eval_batches:
                break
            if self.stop.requested:
                raise _Abandoned
            with autocast:
                _, batch_nll, n = self.task.loss(model, batch.to(self.device), 0.0)
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

    def _eval_step(self) -> tuple[dict, bool]:
        """Evaluate on rank 0, keep the best weights, decide early stopping (on every rank);
        returns (the evaluation, whether to stop). An evaluation cut short by a stop request
        records nothing. A sharded model is gathered (every rank takes part) into an
        unsharded copy that rank 0 evaluates alone (sharding.py says why)."""
        flags, result = torch.zeros(2, device=self.device), {}  # (stop, improved)
        weights = self.parallel.full_weights(self.model)
        failure = None
        if self.dist.is_main:
            try:
                result = self._evaluate_and_keep_best(weights, flags)
            except Exception as error:  # the other ranks must hear of it, not wait for it
                failure = error
        self.checkpoints.agree(failure, f"evaluating step {self.state.step}")
        self.dist.broadcast(flags)
        return result, bool(flags[0])

    def _evaluate_and_keep_best(self, weights: checkpoint.Weights, flags: Tensor) -> dict:
        """Rank 0's part of :meth:`_eval_step`: evaluate, judge, save the best weights."""
        model = self.parallel.evaluation_model(self.model, weights, self.cfg, self.device)
        try:
            result = self.evaluate(model)
        except _Abandoned:
            return {}
        if result:
            better, stop = self.checkpoints.judge(self.state, result)
            flags[0] = float(stop)
            if better:
                self.checkpoints.save_best(weights, self.state)
        return result

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to ``max_steps`` (or early stop, or the time budget); returns the last
        evaluation. Raises :class:`Stopped` after saving when asked to stop."""
        t, state, report = self.cfg.train, self.state, self.report
        tokens, clock = 0, time.perf_counter()
        began, before = clock, state.elapsed  # this process's start; earlier processes' time
        last_eval: dict = {}
        done = False
        self.stop.polling = True
        try:
            while state.step < t.max_steps and not done:
                loss, n, lr = self.train_step()
                tokens += n
                state.elapsed = before + time.perf_counter() - began
                out_of_time, stop = self._should_stop()
                is_eval = (state.step % t.eval_every == 0 or state.step == t.max_steps
                           or out_of_time) and not stop
                line = None
                if state.step % t.log_every == 0 or is_eval or stop:
                    self.settle()  # the step's one wait for the device
                    line = {"step": state.step, "loss": float(loss), "lr": lr,
                            "grad_norm": float(self.grad_norm),
                            "peak_memory_mib": self.peak_memory(),
                            "tokens_per_s": tokens / max(time.perf_counter() - clock, 1e-9),
                            "elapsed": round(state.elapsed, 1)}
                    if state.skipped:
                        line["skipped_steps"] = state.skipped
                    tokens, clock = 0, time.perf_counter()
                    self.replan(line["elapsed"])
                    if state.planned_steps:
                        line["schedule_steps"] = state.planned_steps
                    if is_eval:
                        last_eval, early_stop = self._eval_step()
                        line.update(last_eval)
                        done = early_stop or out_of_time
                report.update(state.step, state.elapsed, line)
                if is_eval and not stop:  # asked to stop during the evaluation?
                    stop = self._should_stop()[1]
                if state.step % t.save_every == 0 or done or stop or state.step == t.max_steps:
                    self.settle()
                    state.elapsed = before + time.perf_counter() - began
                    self.checkpoints.save(self.model, self.optimizer, state)
                if stop:
                    raise Stopped(self.run_dir, state.step)
        finally:
            self.stop.polling = False
            self.feed.close()
            report.close()
        loss = last_eval.get("valid_loss")
        if loss is not None and not math.isfinite(loss):
            raise Diverged(f"training diverged: the validation loss is {loss} at step "
                           f"{state.step} ({state.skipped} of {state.step} steps skipped for a "
                           f"loss or gradient that was not finite); {self.run_dir}'s last "
                           "checkpoint is kept. Lower train.lr (or muon_lr)")
        return last_eval

    def peak_memory(self) -> list[float]:
        """Each rank's peak memory so far, MiB: CUDA memory allocated on a GPU, the process's
        resident set on a CPU (a collective: every rank calls it on the same steps)."""
        if self.device.type == "cuda":
            mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            mib = peak_resident_bytes() / 2**20
        every = self.dist.all_gather(torch.tensor([mib], dtype=torch.float64,
                                                  device=self.device))
        return [round(float(x), 1) for x in every]

    def _should_stop(self) -> tuple[bool, bool]:
        """(time budget spent, stop requested), agreed by every rank: rank 0's clock decides
        the budget; a stop request on any rank stops them all."""
        limit = self.cfg.train.max_minutes * 60
        spent = bool(limit) and self.state.elapsed >= limit
        if not self.dist.enabled:  # decided on the host: no wait for the device
            return spent, self.stop.requested
        flags = torch.tensor([float(spent and self.dist.is_main), float(self.stop.requested)],
                             device=self.device)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])
