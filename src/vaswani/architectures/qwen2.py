"""Qwen2 (Hugging Face ``Qwen2ForCausalLM``) on vaswani's own modules: LLaMA's layout with
biases on the q, k and v projections (``qkv_bias``) and plain rotary frequencies; its sliding
window, off in every released model, is refused where it is on."""

from __future__ import annotations

from ..config import ModelConfig
from . import GGUF, Architecture, Refused
from .llama import (
    GGUF_BLOCKS,
    check_common,
    fixes,
    from_hf,
    gguf_settings,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
    to_hf,
)

DESCRIBED = "Qwen2 (LLaMA's layout with biases on q, k and v)"


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``Qwen2Config`` (config.json as a dict) -> ModelConfig."""
    check_common(hf)
    return llama_config(**sizes(hf, pad_id), qkv_bias=True)


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.Qwen2Config(**hf_fields(c, ids), use_sliding_window=False,
                                      architectures=["Qwen2ForCausalLM"])
    return transformers.Qwen2ForCausalLM(config)


FIXED = fixes(qkv_bias=True)  # LLaMA's layout, with biases on q, k and v


def refuse(c: ModelConfig) -> None:
    refuse_layout(c, DESCRIBED, FIXED)
    if c.rope.scaling != "none":
        raise Refused("rope.scaling", c.rope.scaling, "Qwen2 takes plain rotary frequencies")


ARCHITECTURE = Architecture(
    name="qwen2", hf_types=("qwen2",), hf_class="Qwen2ForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXED, peft=True,
    gguf=GGUF(GGUF_BLOCKS, gguf_settings("qwen2"), biased=("attn_q", "attn_k", "attn_v")))
