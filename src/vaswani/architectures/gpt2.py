"""GPT-2 (Hugging Face ``GPT2LMHeadModel``) on vaswani's own modules.

GPT-2 is a pre-LN decoder-only Transformer with LayerNorm (with biases), learned positions,
GELU's tanh approximation ("gelu_new") and biases in every projection; its ``Conv1D`` layers
store ``Linear`` weights transposed. A run trained here with sinusoidal positions or scaled
embeddings is written as GPT-2 exactly: the sinusoids become the learned table, the scale is
folded into the input embedding (then untied from the output projection).
"""

from __future__ import annotations

from torch import Tensor

from ..config import ModelConfig
from . import Architecture, Refused, require, unsupported
from .maps import as_float, input_embeddings, positions, specials, tied

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
# a block's layers, GPT-2's names -> vaswani's (the export reads them the other way)
LINEARS = {"attn.c_attn": "self_attn.in_proj", "attn.c_proj": "self_attn.out_proj",
           "mlp.c_fc": "feed_forward.linear1", "mlp.c_proj": "feed_forward.linear2"}
NORMS = {"ln_1": "self_block.norm", "ln_2": "ff_block.norm"}
DESCRIBED = "GPT-2 (pre-LN, LayerNorm with biases, learned positions)"


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
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
        max_len=hf["n_positions"], pad_id=pad_id or 0, norm_first=True, norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), activation=ACTIVATIONS[act], bias=True,
        positional="learned", scale_embeddings=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``GPT2LMHeadModel`` (or ``GPT2Model``) weights -> DecoderLM state dict, each tensor
    taken out of ``hf`` as it is converted."""
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


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    """DecoderLM (learned or sinusoidal positions, LayerNorm) -> ``GPT2LMHeadModel``'s
    names, Linear weights transposed into ``Conv1D``'s (in, out)."""
    sd = model.state_dict()
    out = {"transformer.wte.weight": input_embeddings(model, c),
           "transformer.wpe.weight": positions(model, c),
           "transformer.ln_f.weight": sd["decoder.norm.weight"],
           "transformer.ln_f.bias": sd["decoder.norm.bias"],
           "lm_head.weight": sd["output_proj.weight"]}
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for theirs, ours in LINEARS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"].t()
            out[h + theirs + ".bias"] = sd[o + ours + ".bias"]
        for theirs, ours in NORMS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"]
            out[h + theirs + ".bias"] = sd[o + ours + ".bias"]
    return out


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model,
        n_layer=c.n_decoder_layers, n_head=c.n_heads, n_inner=c.d_ff,
        activation_function={"gelu_tanh": "gelu_new"}.get(c.activation, c.activation),
        resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.attn_dropout,
        layer_norm_epsilon=c.norm_eps, tie_word_embeddings=tied(c),
        architectures=["GPT2LMHeadModel"], **specials(ids))
    return transformers.GPT2LMHeadModel(config)


FIXES = {"arch": "decoder", "norm_first": True, "norm": "layernorm", "bias": True,
         "qk_norm": False, "post_norms": False, "embed_norm": False, "type_vocab_size": 0,
         "window.size": 0, "experts.count": 0}  # what every run exported as GPT-2 has


def refuse(c: ModelConfig) -> None:
    require(c, {**FIXES, "head_dim": c.d_model // c.n_heads}, DESCRIBED)
    if c.positional not in ("learned", "sinusoidal"):
        raise Refused("positional", c.positional, "GPT-2 takes learned or sinusoidal")
    if c.activation not in ("gelu", "gelu_tanh", "relu"):
        raise Refused("activation", c.activation, "GPT-2 takes gelu, gelu_tanh or relu")
    if c.n_kv_heads != c.n_heads:
        raise Refused("n_kv_heads", c.n_kv_heads, "GPT-2 has one key/value head per query head")
    if c.qkv_bias is not None and c.qkv_bias != c.bias:
        raise Refused("qkv_bias", c.qkv_bias, "GPT-2 has no biases on q, k and v alone "
                      "(Qwen2 does, with rotary positions)")


ARCHITECTURE = Architecture(
    name="gpt2", hf_types=("gpt2",), hf_class="GPT2LMHeadModel",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXES)
