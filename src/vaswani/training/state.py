"""What makes a training run stoppable and resumable exactly: the stop request a signal sets,
the check that a saved optimizer state fits the model, and the errors a run stops with."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


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


def all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())
