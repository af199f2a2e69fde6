"""The training loop: optimizer steps over micro-batches, evaluation, checkpoints, logging.

One optimizer step:

1. fetch ``grad_accum`` micro-batches (this rank's share of each global batch);
2. count their targets and sum the count over ranks: ``N`` is the step's global token count;
3. for each micro-batch, backward ``loss_sum * world / N`` (DDP averages gradients over ranks,
   hence ``* world``), syncing gradients only on the last one;
4. clip, step the optimizer, step the LR schedule (once per optimizer step).

So accumulation and data parallelism give the same update as one big batch.
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
from tqdm import tqdm

from .. import rundir
from ..config import RunConfig
from ..evaluation.metrics import perplexity
from ..models import build_model
from ..tasks import TaskData, task_for
from .distributed import Dist
from .schedules import lr_factor


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


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict, model: nn.Module,
                          where: Path) -> None:
    """A saved optimizer state must fit the parameters it is loaded into. PyTorch matches them
    by position only, and the fused AdamW kernel does not check shapes: a mismatch (a model
    changed between save and load) would corrupt memory instead of failing."""
    names = {id(p): name for name, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    if len(indices) != len(params):
        raise ValueError(f"{where}: the saved optimizer state holds {len(indices)} parameters "
                         f"but the model has {len(params)}; it belongs to another model")
    for i, p in zip(indices, params, strict=True):
        for key, value in saved["state"].get(i, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                raise ValueError(f"{where}: the saved optimizer state's {key} for "
                                 f"{names.get(id(p), i)} has shape {tuple(value.shape)}, the "
                                 f"parameter {tuple(p.shape)}; it belongs to another model")


class Trainer:
    def __init__(self, cfg: RunConfig, data: TaskData, run_dir: Path, *, device: torch.device,
                 dist: Dist | None = None, resume: bool = False, progress: bool = True) -> None:
        dist = dist or Dist()
        self.cfg, self.data, self.run_dir, self.device, self.dist = cfg, data, run_dir, device, dist
        t = cfg.train
        torch.manual_seed(t.seed)  # same initial weights on every rank
        self.model = build_model(cfg.model).to(device)
        self.optimizer = make_optimizer(self.model, t)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, schedule=t.schedule, warmup=t.warmup,
                                                max_steps=t.max_steps, min_ratio=t.min_lr / t.lr))
        self.task = task_for(cfg)
        self.batches = self.task.batches(data, dist.rank, dist.world)
        if t.best_metric not in self.task.metrics:
            raise ValueError(f"best_metric ({t.best_metric!r}) must be one of "
                             f"{list(self.task.metrics)} for this task")
        self.step = 0
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        self.best: float | None = None
        self.bad_evals = 0
        self.progress = progress and dist.is_main
        self._fit_start = time.perf_counter()
        torch.manual_seed(t.seed + dist.rank)  # dropout differs across ranks, as it should
        if resume:
            self._restore()
        elif t.init_from:  # fine-tuning: pretrained body, freshly initialised head
            rundir.load_weights(self.model, Path(t.init_from) / rundir.BEST, fresh=("head.",))
        self.train_model: nn.Module = self.model
        if dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.train_model = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if t.compile:
            self.train_model = torch.compile(self.train_model)

    # --- state -------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"step": self.step, "micro_batches": self.step * self.cfg.train.grad_accum,
                "elapsed": round(self.elapsed + time.perf_counter() - self._fit_start, 1),
                "best": self.best, "bad_evals": self.bad_evals,
                "best_metric": self.cfg.train.best_metric,
                "data_fingerprint": self.data.fingerprint()}

    def _trainer_state(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 "rng_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore(self) -> None:
        trainer_state, state = rundir.load_last(self.run_dir, self.model)
        if state.get("data_fingerprint") != self.data.fingerprint():
            raise ValueError(f"the training data differs from the data {self.run_dir} was "
                             "trained on; resume with the same [data] files")
        check_optimizer_state(self.optimizer, trainer_state["optimizer"], self.model,
                              rundir.find_last(self.run_dir))
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        if self.dist.is_main or not self.dist.enabled:
            torch.set_rng_state(trainer_state["rng_cpu"])
        if "rng_cuda" in trainer_state and self.device.type == "cuda":
            torch.cuda.set_rng_state(trainer_state["rng_cuda"], self.device)
        self.step, self.best, self.bad_evals = state["step"], state["best"], state["bad_evals"]
        self.elapsed = state.get("elapsed", 0.0)
        self._trim_metrics(self.step)

    def _trim_metrics(self, step: int) -> None:
        """Drop log lines written after the checkpoint we resume from."""
        path = self.run_dir / rundir.METRICS
        if self.dist.is_main and path.exists():
            lines = [ln for ln in path.read_text().splitlines()
                     if ln.strip() and json.loads(ln)["step"] <= step]
            rundir.atomic_write_text(path, "".join(ln + "\n" for ln in lines))

    def save_last(self) -> None:
        if self.dist.is_main:
            rundir.save_last(self.run_dir, self.model, self._trainer_state(), self._state())
        self.dist.barrier()

    # --- one optimizer step -------------------------------------------------------------
    def train_step(self) -> tuple[float, int]:
        """One optimizer step on the next global batch; returns (mean smoothed loss, input
        tokens processed)."""
        t = self.cfg.train
        micro = [self.to_device(self.batches.micro_batch(self.step * t.grad_accum + k))
                 for k in range(t.grad_accum)]
        loss_sum, total = self.accumulate(micro)
        self.optimizer_step()
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

    def optimizer_step(self) -> None:
        """Clip, update, advance the schedule by one optimizer step, clear gradients."""
        if self.cfg.train.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
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
            with autocast:
                _, batch_nll, n = self.task.loss(model, self.to_device(batch), 0.0)
            nll += float(batch_nll)
            count += int(n)
        result = {}
        if count:
            result["valid_loss"] = nll / count
            result["valid_ppl"] = perplexity(result["valid_loss"])
        if t.metric_examples:
            with autocast:
                result.update(self.task.metric(model, self.data, self.batches,
                                               t.metric_examples, self.device))
        return result

    def _improved(self, value: float) -> bool:
        lower_is_better = self.cfg.train.best_metric == "valid_loss"
        if self.best is None or math.isnan(self.best):
            return True
        return value < self.best if lower_is_better else value > self.best

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to ``max_steps`` (or early stop); returns the last evaluation."""
        t = self.cfg.train
        metrics_path = self.run_dir / rundir.METRICS
        interactive = sys.stderr.isatty()
        bar = tqdm(total=t.max_steps, initial=self.step, disable=not self.progress,
                   unit="step", dynamic_ncols=True,
                   desc=f"train ({t.max_minutes:g}-minute budget)" if t.max_minutes else "train",
                   mininterval=0.5 if interactive else 30.0)
        tokens, clock = 0, time.perf_counter()
        started = self._fit_start = clock
        last_eval: dict = {}
        stop = False
        try:
            while self.step < t.max_steps and not stop:
                lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
                loss, n = self.train_step()
                tokens += n
                bar.update(1)
                out_of_time = self._out_of_time(started)
                is_eval = (self.step % t.eval_every == 0 or self.step == t.max_steps
                           or out_of_time)
                if self.step % t.log_every == 0 or is_eval:
                    elapsed = time.perf_counter() - clock
                    line = {"step": self.step, "loss": loss, "lr": lr,
                            "tokens_per_s": tokens / max(elapsed, 1e-9),
                            "elapsed": round(self.elapsed + time.perf_counter() - started, 1)}
                    tokens, clock = 0, time.perf_counter()
                    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                                    tok_s=f"{line['tokens_per_s']:.0f}",
                                    refresh=interactive)  # a log file gets a line per 30 s
                    if is_eval:
                        stop = self._eval_step(line) or out_of_time
                        last_eval = {k: v for k, v in line.items() if k.startswith("valid")
                                     or k in self.task.metrics}
                    if self.dist.is_main:
                        with metrics_path.open("a") as f:
                            f.write(json.dumps(line) + "\n")
                if self.step % t.save_every == 0 or stop or self.step == t.max_steps:
                    self.save_last()
        except KeyboardInterrupt:
            bar.close()
            self.save_last()  # nothing lost: resume with --resume
            raise
        bar.close()
        return last_eval

    def _out_of_time(self, started: float) -> bool:
        """Whether [train] max_minutes is spent (decided on rank 0, shared with all ranks)."""
        limit = self.cfg.train.max_minutes * 60
        if not limit:
            return False
        flag = torch.tensor([float(self.elapsed + time.perf_counter() - started >= limit)],
                            device=self.device)
        return bool(self.dist.broadcast(flag).item())

    def _eval_step(self, line: dict) -> bool:
        """Evaluate on rank 0, keep the best weights, decide early stopping (on every rank)."""
        t = self.cfg.train
        stop = torch.zeros(1, device=self.device)
        if self.dist.is_main:
            result = self.evaluate()
            line.update(result)
            value = result.get(t.best_metric)
            if value is not None and self._improved(value):
                self.best, self.bad_evals = value, 0
                rundir.save_weights(self.model, self.run_dir / rundir.BEST)
            else:
                self.bad_evals += 1
            if t.patience and self.bad_evals >= t.patience:
                stop[0] = 1
        self.dist.broadcast(stop)
        return bool(stop.item())
