"""The three model families and :func:`build_model`."""

from __future__ import annotations

import os

import torch
from torch import nn

from ..config import ModelConfig
from ..config.family import family
from ..cpu import fast_paths
from .common import fill_buffers, init_weights, is_sharded
from .decoder_lm import DecoderLM
from .encoder_classifier import EncoderClassifier
from .encoder_decoder import EncoderDecoder


def build_model(config: ModelConfig, device: torch.device | str | None = None, *,
                initialise: bool = True, fast: bool | None = None) -> nn.Module:
    """The model of ``config.arch``'s family (config/family.py) on ``device`` (default:
    torch's default device, as for any ``nn.Module``: the CPU unless
    ``torch.set_default_device`` or a ``with torch.device`` block says otherwise), freshly
    initialised; ``model.config is config``. Built on the
    meta device first (shapes only: no memory, no random draws), then allocated on
    ``device`` and initialised once, so a large model is not first made and initialised on
    the CPU and then copied. (``device="meta"`` returns it unallocated: FSDP shards it
    first, then each rank allocates and initialises its slices.)

    ``initialise=False`` leaves the parameters' values undefined, for a model whose weights
    are loaded next (``checkpoint.load_weights`` refuses a file that misses one): drawing
    random weights only to overwrite them was most of a pretrained model's load.

    ``fast``: a CPU's faster paths swapped in (vaswani.cpu: the same function, the same
    parameters); False keeps nn/'s modules as written, the reference. By default, on a CPU
    and on the meta device (a model built there for a CPU, or loaded on one); a model that
    will run elsewhere is built with ``fast=False`` (on a GPU each of them would only fall
    back to nn/'s, at a Python cost per call)."""
    device = torch.get_default_device() if device is None else torch.device(device)
    check_fits(config, device)
    with torch.device("meta"):
        model = family(config.arch).model(config)
        if device.type in ("cpu", "meta") if fast is None else fast:
            fast_paths(model)
    if device.type != "meta":
        with torch.device(device):  # what initialising makes on the side goes there too
            materialise(model, device)
            if initialise:
                init_weights(model, config.pad_id)
            else:
                fill_buffers(model)
    return model


def memory_of(device: torch.device) -> int | None:
    """The bytes of memory ``device`` has in all (None where it cannot say)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_fits(config: ModelConfig, device: torch.device) -> None:
    """Refuse, before anything is made, a model whose float32 numbers alone are more than
    ``device`` has memory (a mistyped ``d_model = 2**40`` or ``n_layers = 10**8``)."""
    need, have = 4 * config.numbers(), memory_of(device)
    if have is not None and need > have:
        raise ValueError(f"the model needs about {need / 2**30:,.1f} GiB for its weights alone "
                         f"(d_model {config.d_model}, d_ff {config.d_ff}, {config.n_layers} "
                         f"layers, max_len {config.max_len:,}"
                         + (f", vocabulary {config.vocab_size:,}" if config.vocab_size else "")
                         + f"), more than the {have / 2**30:,.1f} GiB this {device.type} has")


def materialise(model: nn.Module, device: torch.device | str) -> None:
    """Allocate a meta-device model's tensors on ``device`` (values undefined: initialise or
    load them next); the names that share one parameter (a tied output head) share the new
    one. A sharded model goes through ``to_empty``, which FSDP follows to each rank's slices.
    Another gets each tensor from ``torch.empty``: ``to_empty``'s ``empty_like`` of a meta
    tensor runs PyTorch's Python meta functions, whose first call imports sympy, about half
    a second of every command that loads a model."""
    if any(is_sharded(p) for p in model.parameters()):
        first: dict[int, str] = {}
        ties = [(name, first.setdefault(id(p), name))
                for name, p in model.named_parameters(remove_duplicate=False)]
        model.to_empty(device=device)  # a new tensor for every name: tie them again
        for name, owner in ties:
            if name != owner:
                module, _, attr = name.rpartition(".")
                setattr(model.get_submodule(module), attr, model.get_parameter(owner))
        return
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                           requires_grad=p.requires_grad)
            setattr(module, name, made[id(p)])
        for name, b in list(module.named_buffers(recurse=False, remove_duplicate=False)):
            setattr(module, name, torch.empty(b.shape, dtype=b.dtype, device=device))


def parameter_counts(model: nn.Module) -> tuple[list[tuple[str, int]], int]:
    """(parameters of each top-level part, total with shared (tied) weights counted once)."""
    parts = [(name, sum(p.numel() for p in child.parameters()))
             for name, child in model.named_children()]
    return parts, sum(p.numel() for p in model.parameters())


__all__ = ["DecoderLM", "EncoderClassifier", "EncoderDecoder", "build_model",
           "materialise", "parameter_counts"]
