"""Phi-3 (Hugging Face ``Phi3ForCausalLM``) on vaswani's own modules: LLaMA's layout with
q, k and v in one projection (``qkv_proj``) and the gate and up projections in one
(``gate_up_proj``), which is how vaswani keeps them too (``in_proj``, ``linear1``): the
weights carry over whole. Its sliding window, where the config has one, makes every layer
local (``sliding_window``, no global layer). Rotary frequencies rescaled for long contexts
("longrope") and rotation of part of each head are refused.
"""

from __future__ import annotations

from torch import Tensor

from ..config import ModelConfig
from . import GGUF, Architecture, Refused, unsupported
from .llama import (
    check_common,
    fixes,
    gguf_settings,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
)
from .maps import as_float, ends, ends_back, take, widths

# a block's tensors: Phi-3's names -> vaswani's, both ways
LAYER = {"self_attn.qkv_proj": "self_attn.in_proj", "self_attn.o_proj": "self_attn.out_proj",
         "mlp.gate_up_proj": "feed_forward.linear1", "mlp.down_proj": "feed_forward.linear2",
         "input_layernorm": "self_block.norm", "post_attention_layernorm": "ff_block.norm"}


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``Phi3Config`` (config.json as a dict) -> ModelConfig."""
    check_common(hf)
    params = hf.get("rope_parameters") or {}
    partial = hf.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise unsupported("partial_rotary_factor", partial, "rotary positions over whole heads")
    window = hf.get("sliding_window") or 0
    config = llama_config(**sizes(hf, pad_id))
    if window and window < config.max_len:  # every layer attends to the last `window` tokens
        config = config.replace(window={"size": window}, rope={"local_base": config.rope.base})
    return config


def _shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, rows = c.d_model, widths(c)
    return {"self_attn.qkv_proj": (sum(rows.values()), d), "self_attn.o_proj": (d, rows["q"]),
            "mlp.gate_up_proj": (2 * c.d_ff, d), "mlp.down_proj": (d, c.d_ff),
            "input_layernorm": (d,), "post_attention_layernorm": (d,)}


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``Phi3ForCausalLM`` weights -> DecoderLM state dict, renamed only (each checked
    against the config's sizes and taken out of ``hf`` as it is converted)."""
    shapes = _shapes(config)
    out = ends(hf, config)
    for i in range(config.n_decoder_layers):
        for theirs, ours in LAYER.items():
            out[f"decoder.layers.{i}.{ours}.weight"] = take(
                hf, f"model.layers.{i}.{theirs}.weight", *shapes[theirs])
    return as_float(out, config)


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    sd = model.state_dict()
    out = ends_back(model, c, sd)
    for i in range(c.n_decoder_layers):
        for theirs, ours in LAYER.items():
            out[f"model.layers.{i}.{theirs}.weight"] = sd[f"decoder.layers.{i}.{ours}.weight"]
    return out


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.Phi3Config(**hf_fields(c, ids), sliding_window=c.window.size or None,
                                     original_max_position_embeddings=c.max_len,
                                     architectures=["Phi3ForCausalLM"])
    return transformers.Phi3ForCausalLM(config)


FIXED = fixes(**{"window.size": None})  # LLaMA's layout; a window or none


def refuse(c: ModelConfig) -> None:
    refuse_layout(c, "Phi-3 (LLaMA's layout, fused projections)", FIXED)
    if c.window.size and (c.window.global_every or c.rope.local_base != c.rope.base):
        raise Refused("window.global_every", c.window.global_every, "Phi-3's window is every "
                      "layer's, with one rotary base")
    if c.rope.scaling != "none":
        raise Refused("rope.scaling", c.rope.scaling, "Phi-3 here takes plain rotary "
                      "frequencies")


def _gguf_settings(read) -> dict:
    return {**gguf_settings("phi3")(read),
            "sliding_window": read("phi3.attention.sliding_window", None)}


ARCHITECTURE = Architecture(
    name="phi3", hf_types=("phi3",), hf_class="Phi3ForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXED,
    gguf=GGUF({"attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
               "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj",
               "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"},
              _gguf_settings))
