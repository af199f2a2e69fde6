"""Sharded data parallelism, ``[train] parallel = "fsdp"``: PyTorch's FSDP2 and its sharded
checkpoints (torch.distributed.checkpoint, DCP), as torchtune and torchtitan use them.

With DDP every rank holds the whole model, its gradients and both AdamW moments: 16 bytes a
parameter in fp32. ``fully_shard`` splits each parameter into one slice a rank (a DTensor);
a unit's full parameters exist only while the unit runs, gathered just before and freed just
after, and its gradients are reduce-scattered back into slices. So each rank holds about
1/N of the parameters, gradients and optimizer state, plus one unit's full parameters at a
time. The units here: every transformer layer, then the root (the embeddings, the output head
tied to them, the final norms), which stays gathered between forward and backward.

Every rank builds the model on the meta device and shards it before any memory is allocated
(:func:`build`), so a rank only ever holds its slices: the model never exists whole on one
rank at start-up, and weights from ``init_from`` are cut into slices one tensor at a time.

What the rest of training sees:

- the optimizer is made after :func:`shard` (over the DTensor slices) and steps each rank's
  slice; gradient clipping's norm is a DTensor, summed over the ranks;
- :func:`full_tensors` gathers the fp32 weights to rank 0's memory, one tensor at a time: for
  the single-file weights (best, last, kept checkpoints) that every other command reads, and
  for evaluation, which rank 0 runs alone on an unsharded copy, as with DDP. (Evaluating the
  sharded model itself would make every rank run the same decoding in lockstep, and leave
  FSDP's record of the forward order, which its backward prefetching follows, differing
  between ranks that evaluated and ranks that did not: a deadlock at the next backward.);
- :func:`save_sharded` / :func:`load_sharded` write and read every rank's slices of the model
  and the optimizer (keyed by parameter name), which DCP re-slices when the number of ranks
  changes: a run saved by 2 processes resumes in 1, and one saved by 1 in 2;
- a LoRA run is sharded with its adapters in their layers' units: each rank holds a slice of
  every frozen weight and every adapter, and only the adapters (and a classifier's new head)
  have gradients, optimizer state and a place in the checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..config import FinetuneConfig, ModelConfig
from ..models import build_model, materialise
from ..models.common import fill_buffers, init_weights
from ..models.finetune import add_adapters, draw_adapters, has_adapters, saved_names
from ..nn.layers import Stack
from .optimizers import Optimizers


def build(config: ModelConfig, device: torch.device, precision: str = "fp32", *,
          initialise: bool = True, adapters: FinetuneConfig | None = None,
          trainable: tuple[str, ...] = ()) -> nn.Module:
    """The model for ``config``, sharded, holding this rank's slices only: built on the meta
    device (shapes, no memory), sharded, then each rank allocates its slices on ``device`` and
    initialises them (``init_weights`` draws each whole matrix, one at a time, and keeps the
    rank's slice: the weights a single process starts from, with the same seed). Peak memory
    at start-up is the slices plus the largest single matrix, not the model. Weights from
    ``init_from`` are loaded into the slices the same way (checkpoint.load_weights);
    ``initialise=False`` when they all are (the slices' tables are filled, nothing drawn).

    With ``adapters`` (a LoRA run) the adapters are added before sharding, so that FSDP
    shards them with their layer's frozen weights and reduces their gradients; they are drawn
    last, as a single process draws them (models/finetune.py ``draw_adapters``), and the base
    run's weights go into the frozen slices (``checkpoint.load_weights(..., frozen=True)``).
    ``trainable``: as ``add_adapters``'s (a classifier's new head)."""
    model = build_model(config, "meta", fast=device.type == "cpu")
    if adapters is not None:
        add_adapters(model, adapters, trainable=trainable)  # meta: nothing drawn yet
    model = shard(model, device, precision)
    materialise(model, device)
    if initialise:
        init_weights(model, config.pad_id)
    else:
        fill_buffers(model)
    draw_adapters(model)
    return model


def shard(model: nn.Module, device: torch.device | str, precision: str = "fp32") -> nn.Module:
    """Shard ``model`` in place over the default process group, on a mesh of ``device``'s
    type (FSDP's own default is the GPU wherever there is one: CPU processes on a one-GPU
    machine would each ask for a GPU of their own): each layer of each :class:`Stack` a unit,
    the rest the root's. Make the optimizer after. bf16: layers compute in bf16, gradients
    are reduced and the sharded master weights kept in fp32."""
    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    for module in model.modules():
        if isinstance(module, Stack):
            for layer in module.layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (all of a plain one)."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered (a collective), a plain tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as one state dict in rank 0's CPU memory (a collective; the other
    ranks get ``{}``), each tied tensor under its first name, as checkpoint.model_tensors
    gives for an unsharded model."""
    kept = saved_names(model)  # a LoRA run's: its trainable parameters alone
    state = get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=kept is not None))
    if kept is None:  # one name per tied parameter, and the buffers
        kept = {name for name, _ in model.named_parameters()}
        kept |= {name for name, _ in model.named_buffers()}
    return {k: v.contiguous() for k, v in state.items() if k in kept}


def save_sharded(model: nn.Module, optimizer: Optimizers, folder: Path) -> None:
    """Every rank writes its slices of the weights and the optimizer state into ``folder``
    (a collective; DCP writes the metadata that maps slices to names last). A LoRA run's
    frozen weights are not written: they are its base run's."""
    model_state, optim_state = _state_dicts(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))


def load_sharded(model: nn.Module, optimizer: Optimizers, folder: Path) -> None:
    """Load what :func:`save_sharded` wrote, re-sliced for this many ranks, into ``model``
    and ``optimizer`` (sharded or not: a single unsharded process reads it too)."""
    model_state, optim_state = _state_dicts(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(folder))  # every tensor asked for, or an error
    adapted = has_adapters(model)  # (the frozen weights are not among them)
    set_state_dict(model, tuple(optimizer), model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"],
                   options=StateDictOptions(ignore_frozen_params=adapted, strict=not adapted))


def _state_dicts(model: nn.Module, optimizer: Optimizers) -> tuple[dict, dict]:
    """The model's and the optimizer's state as DCP saves and loads them. A LoRA run's hold
    its trainable parameters alone: its frozen weights are its base run's, loaded from
    there (``ignore_frozen_params`` drops a tied weight under its first name only)."""
    kept = saved_names(model)
    model_state, optim_state = get_state_dict(model, tuple(optimizer), options=StateDictOptions(
        ignore_frozen_params=kept is not None))
    if kept is not None:
        model_state = {k: v for k, v in model_state.items() if k in kept}
    return model_state, optim_state


def training_bytes(model: nn.Module, optimizer: Optimizers) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (its slices under
    FSDP; the gathered copies that exist only while a unit runs are not counted)."""
    params = list(model.parameters())
    out = {"parameters": sum(local(p).nbytes for p in params),
           "gradients": sum(local(p.grad).nbytes for p in params if p.grad is not None),
           "optimizer": sum(local(v).nbytes for s in optimizer.state.values()
                            for v in s.values() if isinstance(v, torch.Tensor))}
    out["total"] = sum(out.values())
    return out
