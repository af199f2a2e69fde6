"""How training spreads over its processes, ``[train] parallel``, as one object that the
Trainer (loop.py) and its checkpoints (state.py) call the same way whatever the choice:

* :class:`Single`: one process, the whole model;
* :class:`DDP`: one process a GPU (or CPU), each with the whole model; PyTorch's
  ``DistributedDataParallel`` averages the gradients over the processes in the backward of a
  step's last micro-batch;
* :class:`FSDP`: each process holds a slice of every weight, gradient and optimizer moment
  (PyTorch's FSDP2, sharding.py); weights are gathered for a layer while it runs. Even one
  process is sharded then (over a process group of one), so that a run's checkpoints are
  the same at any size.

Each answers: which model to build (``build``), which module the forward and backward run
through (``wrap``), whether this backward reduces gradients (``sync``), what a value computed
on the slices is whole (``full``), the whole weights to save or evaluate (``full_weights``,
``evaluation_model``), and what a checkpoint holds (``save``, ``optimizer_state``, ``load``).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from .. import checkpoint, rundir
from ..config import FinetuneConfig, ModelConfig, RunConfig
from ..models import build_model
from ..models.finetune import add_adapters, has_adapters, new_parts
from . import sharding
from .distributed import Dist
from .optimizers import Optimizers


class Single:
    """One process, the whole model: every method the identity, or nothing to do."""

    group_of_one = False  # whether it needs a process group with one process

    def __init__(self, dist: Dist) -> None:
        self.dist = dist

    def build(self, config: ModelConfig, device: torch.device, precision: str, *,
              initialise: bool = True, adapters: FinetuneConfig | None = None,
              trainable: tuple[str, ...] = ()) -> nn.Module:
        """The model to train; ``initialise=False`` when every weight is loaded next (a
        resumed run, a fine-tune without a new head): its random draws would be overwritten.
        With ``adapters``, a LoRA run's, added (``add_adapters``; its base run's weights are
        loaded next, with ``frozen=True``)."""
        model = build_model(config, device, initialise=initialise)
        if adapters is not None:
            add_adapters(model, adapters, trainable=trainable)
        return model

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The module the training step's forward and backward run through."""
        return model

    @contextlib.contextmanager
    def sync(self, wrapped: nn.Module, sync: bool):
        """A backward in this block reduces the gradients over the processes only if
        ``sync`` (a step's last micro-batch); the others accumulate locally."""
        yield

    def full(self, t: Tensor) -> Tensor:
        """A value computed over this process's part (the gradient norm), made whole."""
        return t

    def full_weights(self, model: nn.Module) -> checkpoint.Weights:
        """The whole weights, on rank 0, for saving or evaluating (every process calls it:
        a collective where the model is sharded)."""
        return model

    def evaluation_model(self, model: nn.Module, weights: checkpoint.Weights,
                         config: RunConfig, device: torch.device) -> nn.Module:
        """The model rank 0 evaluates, holding ``weights`` (from :meth:`full_weights`)."""
        return model

    def save(self, model: nn.Module, optimizer: Optimizers, run_dir: Path) -> Path | None:
        """Write what each process holds apart (every process calls it); returns the folder
        that goes into ``last/`` with the checkpoint, or None."""
        return None

    def optimizer_state(self, optimizer: Optimizers) -> dict:
        """What of the optimizer goes into the checkpoint's trainer state."""
        return {"optimizer": optimizer.state_dict()}

    def load(self, model: nn.Module, optimizer: Optimizers,
             run_dir: Path) -> tuple[dict, dict]:
        """Load the run's ``last/`` into ``model`` and ``optimizer``; returns (trainer state,
        the saved state.json). A sharded run's checkpoint is read whole."""
        last = checkpoint.find_last(run_dir)
        if (last / rundir.SHARDED).is_dir():
            trainer_state, saved = checkpoint.read_last(run_dir)
            sharding.load_sharded(model, optimizer, last / rundir.SHARDED)
        else:
            trainer_state, saved = checkpoint.load_last(run_dir, model)
            optimizer.load_state_dict(trainer_state["optimizer"], model, last)
        return trainer_state, saved


class DDP(Single):
    """One process a device, each with the whole model; gradients averaged by DDP."""

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    @contextlib.contextmanager
    def sync(self, wrapped: nn.Module, sync: bool):
        if sync:
            yield
        else:
            with wrapped.no_sync():
                yield


class FSDP(Single):
    """Each process holds a slice of every weight (sharding.py)."""

    group_of_one = True  # FSDP shards over a process group, even of one process

    def build(self, config: ModelConfig, device: torch.device, precision: str, *,
              initialise: bool = True, adapters: FinetuneConfig | None = None,
              trainable: tuple[str, ...] = ()) -> nn.Module:
        """Each process allocates and initialises its slices only (a LoRA run's adapters
        sharded with their layers)."""
        return sharding.build(config, device, precision, initialise=initialise,
                              adapters=adapters, trainable=trainable)

    @contextlib.contextmanager
    def sync(self, wrapped: nn.Module, sync: bool):
        """Without a sync the local gradients are whole: with ``grad_accum`` > 1 a process
        holds the full gradients until the step's last backward."""
        wrapped.set_requires_gradient_sync(sync)
        yield

    def full(self, t: Tensor) -> Tensor:
        return sharding.full(t)

    def full_weights(self, model: nn.Module) -> checkpoint.Weights:
        return sharding.full_tensors(model)

    def evaluation_model(self, model: nn.Module, weights: checkpoint.Weights,
                         config: RunConfig, device: torch.device) -> nn.Module:
        """An unsharded copy, which rank 0 evaluates alone (sharding.py says why); a LoRA
        run's, its base run's weights with the gathered adapters."""
        adapters, fresh = config.finetune if has_adapters(model) else None, new_parts(config.model)
        whole = Single.build(self, config.model, device, config.train.precision,
                             initialise=False, adapters=adapters, trainable=fresh)
        if adapters is not None:  # the weights come next: the base run's, then the gathered
            checkpoint.load_weights(whole, Path(config.train.init_from) / rundir.BEST,
                                    fresh=fresh, frozen=True)
        checkpoint.load_tensors(whole, weights, "the gathered weights")
        return whole

    def save(self, model: nn.Module, optimizer: Optimizers, run_dir: Path) -> Path:
        """Every process writes its slices of the weights and the optimizer state."""
        folder = run_dir / (rundir.SHARDED + ".tmp")  # moved into last/ when whole
        if self.dist.is_main:
            rundir.record(run_dir, f"{rundir.LAST}/{rundir.SHARDED}/*")  # as sharded.tmp/ is
            shutil.rmtree(folder, ignore_errors=True)  # a save killed part-way
        self.dist.barrier()
        sharding.save_sharded(model, optimizer, folder)
        return folder

    def optimizer_state(self, optimizer: Optimizers) -> dict:
        return {}  # saved with the slices

    def load(self, model: nn.Module, optimizer: Optimizers,
             run_dir: Path) -> tuple[dict, dict]:
        """Any number of processes reads a sharded run's slices; an unsharded run's
        checkpoint is refused."""
        last = checkpoint.find_last(run_dir)
        if not (last / rundir.SHARDED).is_dir():
            raise ValueError(f"{last} was saved by unsharded training (parallel = 'ddp'); "
                             "resume it with --set train.parallel=ddp")
        return super().load(model, optimizer, run_dir)  # the slices, as any process reads them


def parallel_class(name: str, world: int) -> type[Single]:
    """The class for ``[train] parallel = name`` with ``world`` processes."""
    if name == "fsdp":
        return FSDP
    return DDP if world > 1 else Single


def for_run(name: str, dist: Dist) -> Single:
    return parallel_class(name, dist.world)(dist)
