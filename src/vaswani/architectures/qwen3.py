"""Qwen3 (Hugging Face ``Qwen3ForCausalLM``) on vaswani's own modules: LLaMA's layout with
an RMSNorm over each head's queries and keys before the rotation (``qk_norm``, Gemma 3's
too, but with plain weights), heads whose width is set apart from ``hidden_size / heads``
(``head_dim``) and no biases on q, k and v (Qwen2's are gone)."""

from __future__ import annotations

from torch import Tensor

from ..config import ModelConfig
from . import GGUF, Architecture, unsupported
from .llama import (
    GGUF_BLOCKS,
    check_common,
    fixes,
    gguf_settings,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
)
from .llama import from_hf as llama_from_hf
from .llama import to_hf as llama_to_hf
from .maps import take

NORMS = ("self_attn.q_norm", "self_attn.k_norm")


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``Qwen3Config`` (config.json as a dict) -> ModelConfig."""
    check_common(hf, head_dim=True)
    if hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "no biases on the attention's projections")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    return llama_config(**sizes(hf, pad_id), head_dim=head_dim, qk_norm=True)


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``Qwen3ForCausalLM`` weights -> DecoderLM state dict: LLaMA's, and each layer's q and
    k norms."""
    norms = {f"decoder.layers.{i}.{n}.weight":
             take(hf, f"model.layers.{i}.{n}.weight", config.head_dim).float().contiguous()
             for i in range(config.n_decoder_layers) for n in NORMS}
    return {**llama_from_hf(hf, config, settings), **norms}


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    sd = model.state_dict()
    return {**llama_to_hf(model, c),
            **{f"model.layers.{i}.{n}.weight": sd[f"decoder.layers.{i}.{n}.weight"]
               for i in range(c.n_decoder_layers) for n in NORMS}}


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.Qwen3Config(**hf_fields(c, ids), head_dim=c.head_dim,
                                      attention_bias=False, use_sliding_window=False,
                                      architectures=["Qwen3ForCausalLM"])
    return transformers.Qwen3ForCausalLM(config)


FIXED = fixes(qk_norm=True)  # LLaMA's layout, with norms on q and k


def refuse(c: ModelConfig) -> None:
    refuse_layout(c, "Qwen3 (LLaMA's layout with norms on q and k)", FIXED,
                  any_head_dim=True)


ARCHITECTURE = Architecture(
    name="qwen3", hf_types=("qwen3",), hf_class="Qwen3ForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXED, peft=True,
    gguf=GGUF({**GGUF_BLOCKS, "attn_q_norm": "self_attn.q_norm",
               "attn_k_norm": "self_attn.k_norm"}, gguf_settings("qwen3")))
