"""Mistral (Hugging Face ``MistralForCausalLM``) on vaswani's own modules: LLaMA's layout;
its sliding window is refused where it would act (shorter than the context)."""

from __future__ import annotations

from ..config import ModelConfig
from . import Architecture, unsupported
from .llama import (
    FIXES,
    check_common,
    from_hf,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
    to_hf,
)


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``MistralConfig`` (config.json as a dict) -> ModelConfig."""
    check_common(hf)
    window = hf.get("sliding_window")
    if window and window < hf["max_position_embeddings"]:
        raise unsupported("sliding_window", window, "attention over the whole context (a "
                          "window shorter than max_position_embeddings would act)")
    return llama_config(**sizes(hf, pad_id))


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.MistralConfig(**hf_fields(c, ids), head_dim=c.head_dim,
                                        sliding_window=None,
                                        architectures=["MistralForCausalLM"])
    return transformers.MistralForCausalLM(config)


def refuse(c: ModelConfig) -> None:
    refuse_layout(c, "Mistral (LLaMA's layout)")


ARCHITECTURE = Architecture(
    name="mistral", hf_types=("mistral",), hf_class="MistralForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXES, peft=True)
