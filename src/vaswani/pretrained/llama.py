"""LLaMA-family checkpoints (Hugging Face layout) on vaswani's own modules: LLaMA (Llama 3's
rescaled rotary frequencies included), Qwen2 and Mistral.

They are pre-norm decoder-only Transformers with RMSNorm, rotary positions, a SwiGLU
feed-forward and grouped-query attention: all ``ModelConfig`` options of
:class:`~vaswani.models.DecoderLM`. Qwen2 adds biases to the q, k and v projections
(``qkv_bias``); Mistral is LLaMA's layout (its sliding window is refused where it would act).
This module maps configs and weights (Hugging Face names); ``gguf.py`` reads GGUF files into
the same names. What a config asks that these modules cannot do is refused by name, never
approximated.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..config import ModelConfig

FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}


def llama_config(*, vocab_size: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 n_layers: int, max_len: int, rope_base: float, norm_eps: float,
                 tie_embeddings: bool, pad_id: int = 0, **more) -> ModelConfig:
    return ModelConfig(
        arch="decoder", vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
        n_kv_heads=n_kv_heads, d_ff=d_ff, n_layers=n_layers, dropout=0.0, max_len=max_len,
        pad_id=pad_id, norm_first=True, norm="rmsnorm", norm_eps=norm_eps,
        activation="swiglu", bias=False, positional="rope", rope_base=rope_base,
        scale_embeddings=False, tie_embeddings=tie_embeddings, **more)


class Unsupported(ValueError):
    """A checkpoint's config asks for something vaswani's modules do not do."""


def unsupported(field: str, value, why: str) -> Unsupported:
    """The error for config.json's ``field`` = ``value``, saying what vaswani does (``why``);
    the GPT-2 and Gemma 3 mappings raise it too."""
    return Unsupported(f"config.json: {field} = {value!r} is not supported: {why}")


def rope_options(hf: dict) -> dict:
    """The rotary settings of a config (``rope_parameters`` in transformers 5, ``rope_theta``
    and ``rope_scaling`` before) as ModelConfig fields."""
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}  # transformers takes an older file's rope_scaling whole
    if not isinstance(params, dict):
        raise ValueError(f"config.json: {field} ({params!r}) must be an object")
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    base = params.get("rope_theta")
    base = hf.get("rope_theta", 10000.0) if base is None else base
    if kind == "default":
        return {"rope_base": _positive(field, "rope_theta", base)}
    if kind != "llama3":
        raise unsupported(field, kind, "plain rotary frequencies or Llama 3's "
                          "(\"llama3\") only")
    low = _positive(field, "low_freq_factor", params.get("low_freq_factor"))
    high = _positive(field, "high_freq_factor", params.get("high_freq_factor"))
    factor = _positive(field, "factor", params.get("factor"))
    original = params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
    if factor < 1 or high <= low:
        raise ValueError(f"config.json: {field}'s factor ({factor}) must be >= 1 and its "
                         f"high_freq_factor ({high}) above its low_freq_factor ({low})")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ValueError(f"config.json: {field}'s original_max_position_embeddings "
                         f"({original!r}) must be a whole number >= 1")
    return {"rope_base": _positive(field, "rope_theta", base), "rope_scaling": "llama3",
            "rope_factor": factor, "rope_low_freq_factor": low, "rope_high_freq_factor": high,
            "rope_original_max_len": original}


def _positive(field: str, key: str, value) -> float:
    """``value`` as a float, refused by name unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"config.json: {field}'s {key} ({value!r}) must be a finite number > 0")
    return float(value)


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``LlamaConfig``, ``Qwen2Config`` or ``MistralConfig`` (config.json as a
    dict) -> ModelConfig; an option these modules cannot honour is an :class:`Unsupported`
    naming it."""
    family = hf.get("model_type", "llama")
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "SwiGLU with silu")
    heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        raise unsupported("head_dim", hf["head_dim"], f"hidden_size / num_attention_heads "
                      f"({hf['hidden_size'] // heads})")
    if family == "llama" and hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "biases on q, k, v only (Qwen2's) or none")
    if hf.get("mlp_bias"):
        raise unsupported("mlp_bias", True, "a feed-forward without biases")
    if hf.get("use_sliding_window") or (family == "mistral" and hf.get("sliding_window")
                                        and hf["sliding_window"] < hf["max_position_embeddings"]):
        raise unsupported("sliding_window", hf.get("sliding_window"),
                      "attention over the whole context (a window shorter than "
                      "max_position_embeddings would act)")
    layer_types = set(hf.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise unsupported("layer_types", sorted(layer_types), "full attention in every layer")
    return llama_config(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
        max_len=hf["max_position_embeddings"], norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        pad_id=(hf.get("pad_token_id") or 0) if pad_id is None else pad_id,
        qkv_bias=True if family == "qwen2" else None, **rope_options(hf))


def convert_state_dict(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face ``LlamaForCausalLM`` (Qwen2's, Mistral's) weights -> DecoderLM state dict.

    q, k, v (and their biases) are stacked into ``in_proj``; gate and up into the SwiGLU
    ``linear1``. Each tensor is taken out of ``hf`` as it is converted, so that an import
    never holds the checkpoint twice.
    """
    out = {"embed.token.weight": take(hf, "model.embed_tokens.weight", config.vocab_size,
                                      config.d_model),
           "decoder.norm.weight": take(hf, "model.norm.weight", config.d_model)}
    if not config.tie_embeddings:
        out["output_proj.weight"] = take(hf, "lm_head.weight", config.vocab_size,
                                         config.d_model)
    for i in range(config.n_decoder_layers):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update(projections(hf, h, o, config, bias=bool(config.qkv_bias)))
        out[o + "self_block.norm.weight"] = hf.pop(h + "input_layernorm.weight")
        out[o + "ff_block.norm.weight"] = hf.pop(h + "post_attention_layernorm.weight")
    return as_float(out, config)


def as_float(out: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Every tensor float32 and contiguous, replaced one at a time (a bfloat16 checkpoint is
    not held twice); a tied output projection is the embedding itself."""
    for name in out:
        out[name] = out[name].float().contiguous()
    if config.tie_embeddings:
        out["output_proj.weight"] = out["embed.token.weight"]
    return out


def take(hf: dict[str, Tensor], name: str, *shape: int) -> Tensor:
    """The tensor ``name`` taken out of ``hf`` (:func:`sized`)."""
    return sized(hf.pop(name), name, *shape)


def sized(tensor: Tensor, name: str, *shape: int) -> Tensor:
    """``tensor`` (the checkpoint's ``name``), refused by name unless it has ``shape``: a
    transposed or reshaped tensor would otherwise fail in a concatenation, unnamed, or load
    as wrong weights."""
    if tuple(tensor.shape) != shape:
        raise ValueError(f"the checkpoint's {name} has shape {tuple(tensor.shape)}, but the "
                         f"config's sizes give {shape}")
    return tensor


def projections(hf: dict[str, Tensor], h: str, o: str, config: ModelConfig, *,
                bias: bool = False) -> dict[str, Tensor]:
    """One layer's linear weights, taken out of Hugging Face's LLaMA names (prefix ``h``)
    into vaswani's (prefix ``o``), each checked against ``config``'s sizes: q, k, v (and their
    biases) stacked into ``in_proj``, gate and up into the gated feed-forward's ``linear1``.
    Qwen2, Mistral and Gemma 3 name them alike."""
    d, ff = config.d_model, config.d_ff
    head = config.head_dim or d // config.n_heads
    rows = {"q": config.n_heads * head, "k": (config.n_kv_heads or config.n_heads) * head}
    rows["v"] = rows["k"]
    out = {o + "self_attn.in_proj.weight": torch.cat(
        [take(hf, h + f"self_attn.{n}_proj.weight", rows[n], d) for n in ("q", "k", "v")])}
    if bias:
        out[o + "self_attn.in_proj.bias"] = torch.cat(
            [take(hf, h + f"self_attn.{n}_proj.bias", rows[n]) for n in ("q", "k", "v")])
    out[o + "self_attn.out_proj.weight"] = take(hf, h + "self_attn.o_proj.weight", d, rows["q"])
    out[o + "feed_forward.linear1.weight"] = torch.cat(
        [take(hf, h + f"mlp.{n}_proj.weight", ff, d) for n in ("gate", "up")])
    out[o + "feed_forward.linear2.weight"] = take(hf, h + "mlp.down_proj.weight", d, ff)
    return out

