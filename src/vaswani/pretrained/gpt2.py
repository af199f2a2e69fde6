"""GPT-2 checkpoints (Hugging Face layout) on vaswani's own modules.

GPT-2 is a pre-LN decoder-only Transformer with LayerNorm (with biases), learned positions,
GELU's tanh approximation ("gelu_new") and biases in every projection; its ``Conv1D`` layers
store ``Linear`` weights transposed. What a config asks that these modules cannot do is
refused by name, never approximated.
"""

from __future__ import annotations

from torch import Tensor

from ..config import ModelConfig
from .llama import as_float, unsupported

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
# a block's layers, GPT-2's names -> vaswani's (the export reads them the other way)
LINEARS = {"attn.c_attn": "self_attn.in_proj", "attn.c_proj": "self_attn.out_proj",
           "mlp.c_fc": "feed_forward.linear1", "mlp.c_proj": "feed_forward.linear2"}
NORMS = {"ln_1": "self_block.norm", "ln_2": "ff_block.norm"}


def config_from_hf(hf: dict, pad_id: int = 0) -> ModelConfig:
    """A Hugging Face ``GPT2Config`` (config.json as a dict) -> ModelConfig."""
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise unsupported("activation_function", act, ", ".join(ACTIVATIONS))
    for field, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if hf.get(field, ok) != ok:
            raise unsupported(field, hf[field], f"{ok!r} only")
    d = hf["n_embd"]
    return ModelConfig(
        arch="decoder", vocab_size=hf["vocab_size"], d_model=d, n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d, n_layers=hf["n_layer"], dropout=0.0,
        max_len=hf["n_positions"], pad_id=pad_id, norm_first=True, norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), activation=ACTIVATIONS[act], bias=True,
        positional="learned", scale_embeddings=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def convert_state_dict(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face ``GPT2LMHeadModel`` (or ``GPT2Model``) weights -> DecoderLM state dict,
    each tensor taken out of ``hf`` as it is converted."""
    for name in [k for k in hf if k.startswith("transformer.")]:
        hf[name.removeprefix("transformer.")] = hf.pop(name)
    out = {"embed.token.weight": hf.pop("wte.weight"),
           "embed.position.weight": hf.pop("wpe.weight"),
           "decoder.norm.weight": hf.pop("ln_f.weight"), "decoder.norm.bias": hf.pop("ln_f.bias")}
    if not config.tie_embeddings:
        out["output_proj.weight"] = hf.pop("lm_head.weight")
    for i in range(config.n_decoder_layers):
        h, o = f"h.{i}.", f"decoder.layers.{i}."
        for theirs, ours in LINEARS.items():
            out[o + ours + ".weight"] = hf.pop(h + theirs + ".weight").t()  # Conv1D: (in, out)
            out[o + ours + ".bias"] = hf.pop(h + theirs + ".bias")
        for theirs, ours in NORMS.items():
            out[o + ours + ".weight"] = hf.pop(h + theirs + ".weight")
            out[o + ours + ".bias"] = hf.pop(h + theirs + ".bias")
    return as_float(out, config)
