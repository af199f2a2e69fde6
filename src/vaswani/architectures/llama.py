"""LLaMA (Hugging Face ``LlamaForCausalLM``, Llama 3's rescaled rotary frequencies included)
on vaswani's own modules.

A pre-norm decoder-only Transformer with RMSNorm, rotary positions, a SwiGLU feed-forward
and grouped-query attention, no biases: all ``ModelConfig`` options of
:class:`~vaswani.models.DecoderLM`. Qwen2, Mistral and most later checkpoints are this layout
with a difference or two, and their files start from this one's functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor

from ..config import ModelConfig
from . import GGUF, Architecture, Refused, require, unsupported
from .maps import as_float, ends, ends_back, projections, projections_back, specials, tied

DESCRIBED = "LLaMA (pre-norm, RMSNorm, SwiGLU, no biases, rotary positions)"
# what every run exported as LLaMA has (its config.toml leaves them out)
FIXES = {"arch": "decoder", "norm_first": True, "norm": "rmsnorm", "activation": "swiglu",
         "bias": False, "positional": "rope", "qk_norm": False, "post_norms": False,
         "embed_norm": False, "type_vocab_size": 0, "window.size": 0, "rope.nope_every": 0,
         "experts.count": 0}


def fixes(**changes) -> dict:
    """What a LLaMA-layout architecture fixes: LLaMA's settings with a variant's ``changes``
    (a change to None: the variant lets that setting vary)."""
    return {key: value for key, value in {**FIXES, **changes}.items() if value is not None}


def llama_config(*, vocab_size: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 n_layers: int, max_len: int, rope: dict, norm_eps: float,
                 tie_embeddings: bool, pad_id: int = 0, **more) -> ModelConfig:
    """A ModelConfig of LLaMA's layout with these sizes and [model.rope] (``more``: further
    fields)."""
    return ModelConfig(
        arch="decoder", vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
        n_kv_heads=n_kv_heads, d_ff=d_ff, n_layers=n_layers, dropout=0.0, max_len=max_len,
        pad_id=pad_id, norm_first=True, norm="rmsnorm", norm_eps=norm_eps,
        activation="swiglu", bias=False, positional="rope", rope=rope,
        scale_embeddings=False, tie_embeddings=tie_embeddings, **more)


def rope_options(hf: dict) -> dict:
    """The rotary settings of a config (``rope_parameters`` in transformers 5, ``rope_theta``
    and ``rope_scaling`` before) as [model.rope]'s fields."""
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}  # transformers takes an older file's rope_scaling whole
    if not isinstance(params, dict):
        raise ValueError(f"config.json: {field} ({params!r}) must be an object")
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    base = params.get("rope_theta")
    base = hf.get("rope_theta", 10000.0) if base is None else base
    if kind == "default":
        return {"base": _positive(field, "rope_theta", base)}
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
    return {"base": _positive(field, "rope_theta", base), "scaling": "llama3",
            "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_len": original}


def _positive(field: str, key: str, value) -> float:
    """``value`` as a float, refused by name unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"config.json: {field}'s {key} ({value!r}) must be a finite number > 0")
    return float(value)


def check_common(hf: dict, *, head_dim: bool = False) -> None:
    """What no LLaMA-layout mapping takes: another activation, biases in the feed-forward,
    a window that acts, mixed layer types; a ``head_dim`` other than hidden / heads unless
    ``head_dim``."""
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "SwiGLU with silu")
    heads = hf["num_attention_heads"]
    if not head_dim and hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        raise unsupported("head_dim", hf["head_dim"], f"hidden_size / num_attention_heads "
                          f"({hf['hidden_size'] // heads})")
    if hf.get("mlp_bias"):
        raise unsupported("mlp_bias", True, "a feed-forward without biases")
    if hf.get("use_sliding_window"):
        raise unsupported("sliding_window", hf.get("sliding_window"),
                          "attention over the whole context (a window shorter than "
                          "max_position_embeddings would act)")
    layer_types = set(hf.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise unsupported("layer_types", sorted(layer_types), "full attention in every layer")


def sizes(hf: dict, pad_id: int | None) -> dict:
    """The sizes every LLaMA-layout config.json gives, as :func:`llama_config`'s arguments."""
    heads = hf["num_attention_heads"]
    return dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
        max_len=hf["max_position_embeddings"], norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        pad_id=(hf.get("pad_token_id") or 0) if pad_id is None else pad_id, rope=rope_options(hf))


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``LlamaConfig`` (config.json as a dict) -> ModelConfig; an option these
    modules cannot honour is an :class:`~vaswani.architectures.Unsupported` naming it."""
    check_common(hf)
    if hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "biases on q, k, v only (Qwen2's) or none")
    return llama_config(**sizes(hf, pad_id))


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``LlamaForCausalLM`` weights (Qwen2's, Mistral's) -> DecoderLM state dict: q, k, v (and
    their biases) stacked into ``in_proj``, gate and up into the SwiGLU ``linear1``. Each
    tensor is taken out of ``hf`` as it is converted, so that an import never holds the
    checkpoint twice."""
    out = ends(hf, config)
    for i in range(config.n_decoder_layers):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update(projections(hf, h, o, config, bias=bool(config.qkv_bias)))
        out[o + "self_block.norm.weight"] = hf.pop(h + "input_layernorm.weight")
        out[o + "ff_block.norm.weight"] = hf.pop(h + "post_attention_layernorm.weight")
    return as_float(out, config)


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    """DecoderLM -> ``LlamaForCausalLM``'s names (Qwen2's, Mistral's): :func:`from_hf`
    run the other way."""
    sd = model.state_dict()
    out = ends_back(model, c, sd)
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out.update(projections_back(sd, o, h, c, bias=bool(c.qkv_bias)))
        out[h + "input_layernorm.weight"] = sd[o + "self_block.norm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[o + "ff_block.norm.weight"]
    return out


def hf_fields(c: ModelConfig, ids: dict[str, int]) -> dict:
    """The config fields LLaMA, Qwen2 and Mistral share, from a run's config."""
    r = c.rope
    rope = {"rope_type": "default", "rope_theta": r.base}
    if r.scaling == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": r.base, "factor": r.factor,
                "low_freq_factor": r.low_freq_factor, "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_len}
    return dict(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                num_hidden_layers=c.n_decoder_layers, num_attention_heads=c.n_heads,
                num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_len,
                rms_norm_eps=c.norm_eps, rope_parameters=rope, tie_word_embeddings=tied(c),
                **specials(ids))


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.LlamaConfig(**hf_fields(c, ids), head_dim=c.head_dim,
                                      attention_bias=False, mlp_bias=False,
                                      architectures=["LlamaForCausalLM"])
    return transformers.LlamaForCausalLM(config)


def refuse_layout(c: ModelConfig, described: str = DESCRIBED, fixed: dict = FIXES, *,
                  any_head_dim: bool = False) -> None:
    """Refuse a run that is not the layout ``fixed`` (LLaMA's ``FIXES``, or a variant's
    :func:`fixes`, the same table its config.toml leaves out) as ``described``: with one head
    width d_model / heads unless ``any_head_dim``, and biases on q, k and v alone only where
    ``fixed`` sets ``qkv_bias``."""
    heads = {} if any_head_dim else {"head_dim": c.d_model // c.n_heads}
    require(c, {**fixed, **heads}, described)
    if bool(c.qkv_bias) != fixed.get("qkv_bias", False):  # None: as `bias`, LLaMA's False
        raise Refused("qkv_bias", c.qkv_bias, f"{described} needs no biases on q, k and v "
                      "alone (those are Qwen2's)")


def refuse(c: ModelConfig) -> None:
    refuse_layout(c)


# llama.cpp's names of a block's tensors -> Hugging Face's
GGUF_BLOCKS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
               "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def gguf_settings(name: str) -> Callable[[Callable], dict]:
    """The settings of a LLaMA-layout GGUF file of architecture ``name`` beyond the sizes
    every file gives, under config.json's names."""
    def settings(read) -> dict:
        return {"rope_theta": float(read(f"{name}.rope.freq_base", 10000.0)),
                "vocab_size": int(read(f"{name}.vocab_size", len(read("tokenizer.ggml.tokens")))),
                "pad_token_id": int(read("tokenizer.ggml.unknown_token_id",
                                         read("tokenizer.ggml.padding_token_id", 0)))}
    return settings


ARCHITECTURE = Architecture(
    name="llama", hf_types=("llama",), hf_class="LlamaForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXES, peft=True,
    gguf=GGUF(GGUF_BLOCKS, gguf_settings("llama"), permuted=True))
