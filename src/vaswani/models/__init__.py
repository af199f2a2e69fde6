"""The three model families and :func:`build_model`."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .common import init_weights
from .decoder_lm import DecoderLM
from .encoder_classifier import EncoderClassifier
from .encoder_decoder import EncoderDecoder

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "encoder-decoder": EncoderDecoder,
    "decoder": DecoderLM,
    "encoder": EncoderClassifier,
}


def build_model(config: ModelConfig, device: torch.device | str | None = None) -> nn.Module:
    """The model for ``config.arch`` on ``device`` (default: torch's default device, as for
    any ``nn.Module``: the CPU unless ``torch.set_default_device`` or a ``with torch.device``
    block says otherwise), freshly initialised; ``model.config is config``. Built on the
    meta device first (shapes only: no memory, no random draws), then allocated on
    ``device`` and initialised once, so a large model is not first made and initialised on
    the CPU and then copied. (``device="meta"`` returns it unallocated: FSDP shards it
    first, then each rank allocates and initialises its slices.)"""
    device = torch.get_default_device() if device is None else torch.device(device)
    with torch.device("meta"):
        model = ARCHITECTURES[config.arch](config)
    if device.type != "meta":
        with torch.device(device):  # what initialising makes on the side goes there too
            materialise(model, device)
            init_weights(model, config.pad_id)
    return model


def materialise(model: nn.Module, device: torch.device | str) -> None:
    """Allocate a meta-device model's tensors on ``device`` (values undefined: initialise or
    load them next). ``to_empty`` makes a new tensor for every name, so the names that shared
    one parameter (a tied output head) are tied again."""
    first: dict[int, str] = {}
    ties = []
    for name, p in model.named_parameters(remove_duplicate=False):
        ties.append((name, first.setdefault(id(p), name)))
    model.to_empty(device=device)
    for name, owner in ties:
        if name != owner:
            module, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module), attr, model.get_parameter(owner))


def parameter_counts(model: nn.Module) -> tuple[list[tuple[str, int]], int]:
    """(parameters of each top-level part, total with shared (tied) weights counted once)."""
    parts = [(name, sum(p.numel() for p in child.parameters()))
             for name, child in model.named_children()]
    return parts, sum(p.numel() for p in model.parameters())


__all__ = ["ARCHITECTURES", "DecoderLM", "EncoderClassifier", "EncoderDecoder", "build_model",
           "materialise", "parameter_counts"]
