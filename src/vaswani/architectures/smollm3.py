"""SmolLM3 (Hugging Face ``SmolLM3ForCausalLM``) on vaswani's own modules: LLaMA's layout
in which every fourth layer (``no_rope_layer_interval``) takes no positions at all, "NoPE"
(``[model.rope] nope_every``): its queries and keys are not rotated. Any other pattern of
``no_rope_layers`` and a sliding window that would act are refused."""

from __future__ import annotations

from ..config import ModelConfig
from . import Architecture, unsupported
from .llama import (
    check_common,
    fixes,
    from_hf,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
    to_hf,
)


def nope_every(no_rope_layers: list[int]) -> int:
    """The N of "every N-th layer takes no positions" that ``no_rope_layers`` (1: the layer
    rotates, 0: it does not) follows; 0 where every layer rotates."""
    every = next((i + 1 for i, rotates in enumerate(no_rope_layers) if not rotates), 0)
    expected = [0 if every and (i + 1) % every == 0 else 1 for i in range(len(no_rope_layers))]
    if list(no_rope_layers) != expected:
        raise unsupported("no_rope_layers", no_rope_layers, "every N-th layer without "
                          "positions, the others rotated")
    return every


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``SmolLM3Config`` (config.json as a dict) -> ModelConfig."""
    check_common(hf)
    if hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "no biases on the attention's projections")
    n = hf["num_hidden_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    layers = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    given = sizes(hf, pad_id)
    rope = {**given.pop("rope"), "nope_every": nope_every(layers)}
    return llama_config(**given, rope=rope)


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    every = c.rope.nope_every
    config = transformers.SmolLM3Config(
        **hf_fields(c, ids), use_sliding_window=False, attention_bias=False,
        no_rope_layers=[0 if every and (i + 1) % every == 0 else 1
                        for i in range(c.n_decoder_layers)],
        no_rope_layer_interval=every or c.n_decoder_layers + 1,
        architectures=["SmolLM3ForCausalLM"])
    return transformers.SmolLM3ForCausalLM(config)


FIXED = fixes(**{"rope.nope_every": None})  # LLaMA's layout; layers without positions


def refuse(c: ModelConfig) -> None:
    refuse_layout(c, "SmolLM3 (LLaMA's layout, some layers without positions)", FIXED)


ARCHITECTURE = Architecture(
    name="smollm3", hf_types=("smollm3",), hf_class="SmolLM3ForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXED, peft=True)
