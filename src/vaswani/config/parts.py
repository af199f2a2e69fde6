"""The sections of ``[model]`` beyond the paper: ``[model.rope]``, ``[model.window]`` and
``[model.experts]``, one for each piece of math the paper does not have and nn/ holds in a
module of its own (nn/rotary.py, nn/window.py, nn/moe.py). A model that uses none of them
writes none::

    [model]
    arch = "decoder"
    positional = "rope"

    [model.rope]
    base = 500000.0

Run directories written before these sections existed name their keys flat in ``[model]``
(``rope_base``, ``sliding_window``, ``n_experts``, ...); :data:`FLAT` says where each one
went, and :func:`nest` moves them on read, so every older run still loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .base import ConfigBase


@dataclass(frozen=True)
class RopeConfig(ConfigBase):
    """With `positional = "rope"`: the rotary embeddings' frequencies (nn/rotary.py)."""

    SECTION = "model.rope"

    base: float = 10000.0
    """The rotary embeddings' base (the global layers', where some are local)."""
    scaling: Literal["none", "llama3"] = "none"
    """Rescaled frequencies for a longer context: "llama3" (Llama 3.1's), with the four
    factors below."""
    factor: float = 8.0
    """With `scaling = "llama3"`: how much the longest wavelengths are stretched."""
    low_freq_factor: float = 1.0
    """With `scaling = "llama3"`: wavelengths over original / this are stretched."""
    high_freq_factor: float = 4.0
    """With `scaling = "llama3"`: wavelengths under original / this are kept."""
    original_max_len: int = 8192
    """With `scaling = "llama3"`: the context the model was first trained on."""
    local_base: float = 10000.0
    """With `[model.window]`: the local layers' base (Gemma 3: 10,000 against 1,000,000)."""
    nope_every: int = 0
    """Every this-many-th layer (the 4th, 8th, ... for 4) takes no positions at all, "NoPE"
    (SmolLM3: 4); 0 = every layer rotates its queries and keys."""

    def validate(self) -> None:
        if self.base <= 0:
            raise ValueError(f"base ({self.base}) must be positive")
        if self.nope_every < 0:
            raise ValueError(f"nope_every ({self.nope_every}) must not be negative")


@dataclass(frozen=True)
class WindowConfig(ConfigBase):
    """A language model's local layers: sliding-window attention (nn/window.py)."""

    SECTION = "model.window"

    size: int = 0
    """Local layers attend to the last this-many tokens, themselves included; 0 = none
    (every layer attends to the whole context)."""
    global_every: int = 0
    """Every this-many-th layer is global (Gemma 3: 6), the others local; 0 = every layer
    local (Mistral, Phi-3)."""

    def validate(self) -> None:
        for name in ("size", "global_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")


@dataclass(frozen=True)
class ExpertsConfig(ConfigBase):
    """A language model's feed-forward blocks as a mixture of experts (nn/moe.py)."""

    SECTION = "model.experts"

    count: int = 0
    """How many experts each layer has, each a feed-forward block of `d_ff` (Qwen3-MoE: 128);
    0 = one dense block of [model]'s `d_ff`."""
    per_token: int = 2
    """The experts each token is routed to (Qwen3-MoE: 8)."""
    d_ff: int | None = None
    """Each expert's inner width; None = [model]'s `d_ff`."""
    renormalize: bool = False
    """The chosen experts' router probabilities rescaled to sum to 1."""
    aux_loss: float = 0.001
    """The load-balancing loss's weight in the training loss (the Switch Transformer's, over
    each micro-batch's tokens, as transformers takes it over each forward's; 0 = none)."""

    def validate(self) -> None:
        if self.count < 0:
            raise ValueError(f"count ({self.count}) must not be negative")
        if self.count and not 1 <= self.per_token <= self.count:
            raise ValueError(f"per_token ({self.per_token}) must be between 1 and count "
                             f"({self.count})")
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff ({self.d_ff}) must be positive")
        if self.aux_loss < 0:
            raise ValueError(f"aux_loss ({self.aux_loss}) must not be negative")


# Where each flat [model] key of an older run went: old name -> (section, key).
FLAT = {
    "rope_base": ("rope", "base"), "rope_scaling": ("rope", "scaling"),
    "rope_factor": ("rope", "factor"), "rope_low_freq_factor": ("rope", "low_freq_factor"),
    "rope_high_freq_factor": ("rope", "high_freq_factor"),
    "rope_original_max_len": ("rope", "original_max_len"),
    "local_rope_base": ("rope", "local_base"), "nope_every": ("rope", "nope_every"),
    "sliding_window": ("window", "size"), "global_every": ("window", "global_every"),
    "n_experts": ("experts", "count"), "experts_per_token": ("experts", "per_token"),
    "expert_d_ff": ("experts", "d_ff"), "renormalize_experts": ("experts", "renormalize"),
    "router_aux_loss": ("experts", "aux_loss"),
}


def nest(model: dict[str, Any]) -> dict[str, Any]:
    """``[model]`` as a dict with an older run's flat keys moved into their sections (a new
    dict; the sections' own dicts are copied). A key given both ways is an error naming
    both."""
    out = {key: dict(value) if isinstance(value, dict) else value
           for key, value in model.items() if key not in FLAT}
    for old, (section, key) in FLAT.items():
        if old not in model:
            continue
        part = out.setdefault(section, {})
        if not isinstance(part, dict):
            continue  # a section given as something else: from_dict names it
        if key in part:
            raise ValueError(f"[model] {old} and [model.{section}] {key} are the same setting "
                             f"(the first is its name before [model.{section}] existed); give "
                             "one")
        part[key] = model[old]
    return out
