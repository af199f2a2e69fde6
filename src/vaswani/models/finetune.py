"""A run's ``[finetune]`` applied to a built model: LoRA adapters on its chosen projections.

A LoRA run (``method = "lora"``) keeps only what it trains: the adapters, and a classifier's
new head. Those are the parameters left trainable (``requires_grad``) here, and they are what
its checkpoints hold (checkpoint.model_tensors); the frozen weights are its ``[train]
init_from`` run's, read from there whenever the run is built again.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..config import FinetuneConfig, ModelConfig
from ..config.family import family
from ..nn.lora import LoRA, add_lora
from .common import assign


def new_parts(config: ModelConfig) -> tuple[str, ...]:
    """The parameters a fine-tune of a ``config`` model draws anew and trains, by the start of
    their names, rather than reading them from its base: a classifier's head."""
    return ("head.",) if family(config.arch).classes else ()


def add_adapters(model: nn.Module, finetune: FinetuneConfig, *,
                 trainable: tuple[str, ...] = ()) -> list[str]:
    """``finetune``'s adapters added to ``model`` in place (every other parameter frozen,
    but those whose names start with one of ``trainable``: a new classifier head); returns
    the adapted layers' names."""
    wrapped = add_lora(model, tuple(finetune.targets), rank=finetune.rank, alpha=finetune.alpha,
                       dropout=finetune.dropout)
    for name, p in model.named_parameters():
        if trainable and name.startswith(trainable):
            p.requires_grad_(True)
    return wrapped


def draw_adapters(model: nn.Module) -> None:
    """Every LoRA layer's A drawn again and B zeroed, in the order :func:`add_adapters` draws
    them, each A whole and then cut to this rank's slice where it is sharded: a model whose
    adapters were added on the meta device before FSDP sharded it (training/sharding.py)
    starts from the adapters a single process draws."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRA):
                for a in module.lora_A.values():
                    assign(a, LoRA.draw_a(torch.empty(a.shape, dtype=a.dtype, device=a.device)))
                for b in module.lora_B.values():
                    b.zero_()


def base_names(model: nn.Module) -> dict[str, str]:
    """Each tensor of an adapted ``model``'s state dict that is not an adapter, by name, with
    the name it has in the base run's weights, where no adapters were (a LoRA layer at ``p``
    holds its frozen layer's weight as ``p.base.weight``; the base run has ``p.weight``)."""
    wrapped = [f"{name}." for name, m in model.named_modules() if isinstance(m, LoRA)]
    out = {}
    for name in model.state_dict():
        within = next((p for p in wrapped if name.startswith(p)), None)
        if within is None:
            out[name] = name
        elif name.startswith(f"{within}base."):  # not lora_A. / lora_B.
            out[name] = within + name[len(f"{within}base."):]
    return out


def base_sha256(path: Path) -> str:
    """The sha256 a weights file (checkpoint.write_tensors) records of its tensors, read from
    its header alone ("" for a file written before checksums)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("sha256", "")


def check_base(path: Path, finetune: FinetuneConfig, run: Path | str) -> Path:
    """``path``, the weights a LoRA run starts from, if they are those its adapters were
    trained on; otherwise an error naming both."""
    if not path.exists():
        raise FileNotFoundError(f"{run} holds LoRA adapters trained on {path.parent} ([train] "
                                f"init_from), whose weights ({path}) are not there: put that "
                                "run back where it was")
    found = base_sha256(path)
    if finetune.base_sha256 and found != finetune.base_sha256:
        raise ValueError(f"{run} holds LoRA adapters trained on the weights in {path}, which "
                         f"have changed since (sha256 {finetune.base_sha256[:12]}..., now "
                         f"{found[:12]}...): the adapters would adapt another model; restore "
                         "that run's weights, or train new adapters")
    return path


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` holds LoRA layers (then it saves and loads its trainable parts
    only)."""
    return any(isinstance(m, LoRA) for m in model.modules())


def saved_names(model: nn.Module) -> set[str] | None:
    """The parameter names a checkpoint of ``model`` holds: the trainable ones where it has
    adapters, else None (every tensor of its state dict)."""
    if not has_adapters(model):
        return None
    return {name for name, p in model.named_parameters() if p.requires_grad}
