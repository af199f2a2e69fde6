"""LLaMA-family checkpoints (Hugging Face layout) on vaswani's own modules.

LLaMA is a pre-norm decoder-only Transformer with RMSNorm, rotary positions, a SwiGLU
feed-forward, grouped-query attention and no biases: all ``ModelConfig`` options of
:class:`~vaswani.models.DecoderLM`. This module maps config and weights (Hugging Face names);
``gguf.py`` reads GGUF files into the same names.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig


def llama_config(*, vocab_size: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 n_layers: int, max_len: int, rope_base: float, norm_eps: float,
                 tie_embeddings: bool, pad_id: int = 0) -> ModelConfig:
    return ModelConfig(
        arch="decoder", vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
        n_kv_heads=n_kv_heads, d_ff=d_ff, n_layers=n_layers, dropout=0.0, max_len=max_len,
        pad_id=pad_id, norm_first=True, norm="rmsnorm", norm_eps=norm_eps,
        activation="swiglu", bias=False, positional="rope", rope_base=rope_base,
        scale_embeddings=False, tie_embeddings=tie_embeddings)


def config_from_hf(hf: dict) -> ModelConfig:
    """A Hugging Face ``LlamaConfig`` (config.json as a dict) -> ModelConfig."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (silu)")
    if hf.get("rope_scaling"):
        raise ValueError("rope_scaling is not supported")
    rope_theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta")
    return llama_config(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
        max_len=hf["max_position_embeddings"], rope_base=float(rope_theta or 10000.0),
        norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=hf.get("tie_word_embeddings", False),
        pad_id=hf.get("pad_token_id") or 0)


def convert_state_dict(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face ``LlamaForCausalLM`` weights -> DecoderLM state dict.

    q, k, v are stacked into ``in_proj``; gate and up into the SwiGLU ``linear1``.
    """
    out = {"embed.token.weight": hf["model.embed_tokens.weight"],
           "decoder.norm.weight": hf["model.norm.weight"]}
    if config.tie_embeddings:
        out["output_proj.weight"] = out["embed.token.weight"]
    else:
        out["output_proj.weight"] = hf["lm_head.weight"]
    for i in range(config.n_decoder_layers):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[o + "self_attn.in_proj.weight"] = torch.cat(
            [hf[h + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")])
        out[o + "self_attn.out_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[o + "feed_forward.linear1.weight"] = torch.cat(
            [hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
        out[o + "feed_forward.linear2.weight"] = hf[h + "mlp.down_proj.weight"]
        out[o + "self_block.norm.weight"] = hf[h + "input_layernorm.weight"]
        out[o + "ff_block.norm.weight"] = hf[h + "post_attention_layernorm.weight"]
    return {k: v.float().contiguous() for k, v in out.items()}
