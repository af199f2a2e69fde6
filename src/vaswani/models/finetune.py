"""A run's ``[finetune]`` applied to a built model: LoRA adapters on its chosen projections.

A LoRA run (``method = "lora"``) keeps only what it trains: the adapters, and a classifier's
new head. Those are the parameters left trainable (``requires_grad``) here, and they are what
its checkpoints hold (checkpoint.model_tensors); the frozen weights are its ``[train]
init_from`` run's, read from there whenever the run is built again.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..config import FinetuneConfig
from ..nn.lora import LoRA, add_lora


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
