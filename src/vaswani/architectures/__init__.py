"""Checkpoint architectures: one file each (gpt2.py, llama.py, qwen2.py, mistral.py,
gemma3.py, bert.py, ...), holding everything vaswani knows of it and nothing else:

* its config mapping both ways: a Hugging Face ``config.json`` -> a :class:`ModelConfig`
  (``config_from_hf``), a run's config -> ``transformers``' model (``hf_model``);
* its weight map both ways: the checkpoint's tensors -> vaswani's names (``from_hf``),
  a vaswani model -> the checkpoint's names (``to_hf``);
* what it refuses: an option of ``config.json`` vaswani's modules cannot honour
  (:func:`unsupported`), a run option the architecture has no place for (``refuse``).

A run records its architecture as ``[model] architecture`` (`vaswani import` writes it);
import and export dispatch on that name, and its config.toml holds only what varies: the
settings the architecture fixes (``fixes``: RMSNorm, SwiGLU, rotary positions, ...) are left
out when written and filled in when read (:func:`fixes`, handed to config/'s readers). A
run that names none (one trained here, or written before the field existed) is read as the
architecture its fields match (:func:`of`), as every earlier version of the export did.

Adding an architecture is adding a file here that defines ``ARCHITECTURE``: the package
finds its files itself (:func:`known`), so nothing else changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..config import ModelConfig
from ..config.family import family


@dataclass(frozen=True)
class GGUF:
    """How llama.cpp's converter writes an architecture into a GGUF file (its
    ``general.architecture`` is ``name``, or the architecture's name); pretrained/gguf.py
    reads any."""

    blocks: dict[str, str]  # a block's tensor ("attn_q") -> Hugging Face's ("self_attn.q_proj")
    settings: Callable[[Callable], dict]  # read(key, default) -> config.json's other fields
    biased: tuple[str, ...] = ()  # the block tensors that have a bias too
    permuted: bool = False  # q and k rows permuted into interleaved rotary pairs
    norms_plus_one: bool = False  # norm weights stored with Gemma's 1 added
    name: str = ""  # llama.cpp's name for it, where not the architecture's ("qwen3moe")


@dataclass(frozen=True)
class Architecture:
    """One checkpoint architecture: its names, its config and weight maps, its refusals."""

    name: str  # [model] architecture
    hf_types: tuple[str, ...]  # the config.json model_type values it imports
    hf_class: str  # the transformers class `vaswani export --format hf` writes
    config_from_hf: Callable[..., ModelConfig]  # (config.json as a dict, pad_id=) -> config
    from_hf: Callable[[dict, ModelConfig, dict], dict]  # (tensors, config, config.json as a
    #                      dict) -> vaswani's tensors, each taken out of the checkpoint's
    to_hf: Callable[[Any, ModelConfig], dict]  # (vaswani model, config) -> checkpoint tensors
    hf_model: Callable[[ModelConfig, dict], Any]  # (config, special ids) -> an empty HF model
    refuse: Callable[[ModelConfig], None]  # raises Refused for a run option with no place
    fixes: dict[str, Any]  # the [model] settings every run of it has ("norm": "rmsnorm",
    #                      "window.size": 0): a run's config.toml leaves them out (fixes())
    peft: bool = False  # its projections are the q/k/v/o/gate/up/down that peft adapts
    gguf: GGUF | None = None  # how llama.cpp writes it; None: not read from GGUF files


class Unsupported(ValueError):
    """A checkpoint's config asks for something vaswani's modules do not do."""


def unsupported(field: str, value, why: str) -> Unsupported:
    """The error for config.json's ``field`` = ``value``, saying what vaswani does
    (``why``)."""
    return Unsupported(f"config.json: {field} = {value!r} is not supported: {why}")


class Refused(ValueError):
    """A run option an architecture has no place for: ``[model] option = value``."""

    def __init__(self, option: str, value, why: str) -> None:
        super().__init__(f"{ModelConfig.where(option)} = {value!r}: {why}")
        self.option, self.value, self.why = option, value, why


def require(c: ModelConfig, needs: dict[str, Any], described: str) -> None:
    """Refuse the first option of ``c`` that differs from ``needs``, saying that
    ``described`` needs it."""
    for option, value in needs.items():
        if c.setting(option) != value:
            raise Refused(option, c.setting(option), f"{described} needs {value!r}")


@cache
def known() -> dict[str, Architecture]:
    """Every architecture, by name: each module of this package that defines
    ``ARCHITECTURE``."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        record = getattr(importlib.import_module(f"{__name__}.{module.name}"), "ARCHITECTURE",
                         None)
        if record is not None:
            found[record.name] = record
    return dict(sorted(found.items()))


def named(name: str) -> Architecture:
    """The architecture called ``name``; a ValueError naming the known ones otherwise."""
    if name not in known():
        raise ValueError(f"[model] architecture ({name!r}) must be one of "
                         f"{', '.join(map(repr, known()))}")
    return known()[name]


def fixes(name: str) -> dict[str, Any]:
    """The settings the architecture called ``name`` fixes: what
    :meth:`~vaswani.config.ModelConfig.to_dict` leaves out of a run that names it and
    :meth:`~vaswani.config.ModelConfig.from_dict` fills in."""
    return named(name).fixes


def for_gguf(name: str, where: str) -> Architecture:
    """The architecture of a GGUF file whose ``general.architecture`` is ``name``."""
    for record in known().values():
        if record.gguf is not None and (record.gguf.name or record.name) == name:
            return record
    ours = ", ".join(a.gguf.name or n for n, a in known().items() if a.gguf is not None)
    raise ValueError(f"{where}: architecture {name!r} is not supported ({ours})")


def for_hf(model_type, where: str = "config.json") -> Architecture:
    """The architecture that imports a config.json of ``model_type``."""
    for record in known().values():
        if model_type in record.hf_types:
            return record
    types = sorted(t for r in known().values() for t in r.hf_types)
    raise ValueError(f"{where}: model_type {model_type!r} is not supported; vaswani imports "
                     f"{', '.join(types)}")


def of(c: ModelConfig) -> Architecture:
    """The architecture of a run: the one ``[model] architecture`` names, or for a run that
    names none, the one its fields match (an encoder is BERT; a decoder with rotary positions
    Qwen3-MoE where it has experts, Gemma 3 where it has Gemma's norms, window or activation,
    else Qwen2 with biases on q, k and v alone, Mistral where it was imported from one, else
    LLaMA; any other decoder GPT-2). A translator has none."""
    if c.architecture:
        return named(c.architecture)
    kind = family(c.arch)
    if kind.cross:
        raise Refused("arch", c.arch, "no Hugging Face seq2seq class (Marian, FSMT, BART) "
                      "matches vaswani's encoder-decoder exactly; use --format ct2 or onnx")
    if c.positional == "none":
        raise Refused("positional", c.positional, "sinusoidal, learned or rope")
    if not kind.decoder:
        return named("bert")
    if c.positional != "rope":
        return named("gpt2")
    if c.experts.count:
        return named("qwen3_moe")
    if c.qk_norm or c.post_norms or c.window.size or c.activation == "geglu_tanh":
        return named("gemma3")
    if c.qkv_bias:
        return named("qwen2")
    return named("mistral" if c.origin.startswith("Mistral") else "llama")
