"""Gemma 3 text checkpoints (Hugging Face ``Gemma3ForCausalLM``, ``model_type``
"gemma3_text") on vaswani's own modules.

Gemma 3 is LLaMA's layout (RMSNorm, rotary positions, grouped-query attention, no biases)
with five differences, each a ``ModelConfig`` option:

* heads wider than ``hidden_size / heads`` (``head_dim``);
* an RMSNorm over each head's queries and keys before the rotation (``qk_norm``);
* a second norm on each sublayer's output before the residual sum (``post_norms``);
* a gated feed-forward with GELU's tanh approximation (``activation = "geglu_tanh"``);
* embeddings scaled by sqrt(hidden_size) (``scale_embeddings``).

Its norms multiply by ``1 + weight``; the weights are stored here with the 1 added, as
llama.cpp's converter stores them, so the norm is vaswani's plain RMSNorm. Five of every six
layers are local: they attend to the last ``[model.window] size`` tokens with their own
rotary base (``[model.rope] local_base``; ``[model.window] global_every``).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from ..config import ModelConfig
from ..nn.layers import Residual, outputs
from . import GGUF, Architecture, Refused, require, unsupported
from .llama import GGUF_BLOCKS
from .maps import as_float, projections, projections_back, specials, take


class SandwichResidual(Residual):
    """Gemma's residual block (``post_norms``): pre-LN with a second norm on the sublayer's
    output before the sum, x = x + dropout(out_norm(sublayer(norm(x))))."""

    def __init__(self, norm: nn.Module, out_norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__(norm, dropout, norm_first=True)
        self.out_norm = out_norm

    def forward(self, x: Tensor, sublayer: nn.Module, **kwargs) -> tuple[Tensor, Tensor | None]:
        out, extra = outputs(sublayer(self.norm(x), **kwargs))
        return x + self.dropout(self.out_norm(out)), extra


NORMS = {"input_layernorm": "self_block.norm", "post_attention_layernorm": "self_block.out_norm",
         "pre_feedforward_layernorm": "ff_block.norm",
         "post_feedforward_layernorm": "ff_block.out_norm",
         "self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}


def _rope_bases(hf: dict) -> tuple[float, float]:
    """(global base, local base): transformers 5's ``rope_parameters`` per layer type, or
    ``rope_theta`` and ``rope_local_base_freq`` before."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention", {})
    local = params.get("sliding_attention", {})
    scaling = hf.get("rope_scaling") or {}
    for kind in (full.get("rope_type", "default"), local.get("rope_type", "default"),
                 scaling.get("rope_type", scaling.get("type", "default"))):
        if kind != "default":
            raise unsupported("rope_scaling", kind, "plain rotary frequencies only (Gemma 3's "
                              "128k-context models rescale theirs)")
    return (float(full.get("rope_theta") or hf.get("rope_theta") or 1_000_000.0),
            float(local.get("rope_theta") or hf.get("rope_local_base_freq") or 10_000.0))


def global_every(layer_types: list[str]) -> int:
    """The N of "every N-th layer is global" that ``layer_types`` follows (0: none is),
    or an :class:`~vaswani.architectures.Unsupported` naming another pattern."""
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    every = full[0] + 1 if full else 0
    expected = ["full_attention" if every and (i + 1) % every == 0 else "sliding_attention"
                for i in range(len(layer_types))]
    if layer_types != expected:
        raise unsupported("layer_types", layer_types, "every N-th layer global, the others local")
    return every


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``Gemma3TextConfig`` (config.json as a dict) -> ModelConfig."""
    heads, head_dim = hf["num_attention_heads"], hf.get("head_dim", 256)
    if hf.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh",
                                                                "gelu_new"):
        raise unsupported("hidden_activation", hf["hidden_activation"], "gelu_pytorch_tanh")
    for field in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(field) is not None:
            raise unsupported(field, hf[field], "no soft-capping (Gemma 2's)")
    if hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "no biases")
    if hf.get("use_bidirectional_attention"):
        raise unsupported("use_bidirectional_attention", True, "causal attention")
    n_layers = hf["num_hidden_layers"]
    window = int(hf.get("sliding_window") or 0)
    every = global_every(list(hf.get("layer_types") or
                              ["full_attention" if (i + 1) % hf.get("sliding_window_pattern", 6)
                               == 0 else "sliding_attention" for i in range(n_layers)]))
    rope_base, local_base = _rope_bases(hf)
    if every == 1:  # every layer global: no window acts
        window = 0
    return ModelConfig(
        arch="decoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
        d_ff=hf["intermediate_size"], n_layers=n_layers, dropout=0.0,
        max_len=hf["max_position_embeddings"],
        pad_id=(hf.get("pad_token_id") or 0) if pad_id is None else pad_id, norm_first=True,
        norm="rmsnorm", norm_eps=hf.get("rms_norm_eps", 1e-6), activation="geglu_tanh",
        bias=False, positional="rope", scale_embeddings=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), qk_norm=True,
        post_norms=True, rope={"base": rope_base, "local_base": local_base},
        window={"size": window, "global_every": every if window else 0})


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``Gemma3ForCausalLM`` weights -> DecoderLM state dict (the norms' weights with their 1
    added; q, k, v stacked into ``in_proj``, gate and up into ``linear1``), each tensor taken
    out of ``hf`` as it is converted.

    Gemma 3 scales its scores by 1 / sqrt(``query_pre_attn_scalar``), which is not always
    the head width (the 27B model: 168 against 128). The queries leave their norm times its
    weight, and the rotation is linear, so the norm's weight times sqrt(head_dim / scalar)
    gives the scores that scale while attention divides by sqrt(head_dim) as everywhere."""
    for name in [k for k in hf if k.startswith("language_model.")]:
        hf[name.removeprefix("language_model.")] = hf.pop(name)
    d, head = config.d_model, config.head_dim or config.d_model // config.n_heads
    scale = math.sqrt(head / settings.get("query_pre_attn_scalar", head))
    out = {"embed.token.weight": take(hf, "model.embed_tokens.weight", config.vocab_size, d),
           "decoder.norm.weight": take(hf, "model.norm.weight", d).float() + 1}
    if not config.tie_embeddings:
        out["output_proj.weight"] = take(hf, "lm_head.weight", config.vocab_size, d)
    for i in range(config.n_decoder_layers):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update(projections(hf, h, o, config))
        for theirs, ours in NORMS.items():
            size = head if theirs.endswith("_norm") else d  # q_norm, k_norm: one head's
            out[o + ours + ".weight"] = take(hf, h + theirs + ".weight", size).float() + 1
        out[o + "self_attn.q_norm.weight"] *= scale
    return as_float(out, config)


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    """DecoderLM -> ``Gemma3ForCausalLM``'s names (which scales its own embeddings and
    multiplies by 1 + each norm's weight): :func:`from_hf` the other way, written with
    ``query_pre_attn_scalar`` = head_dim (an imported scalar stays folded into q's norm:
    the same model)."""
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["embed.token.weight"],
           "model.norm.weight": sd["decoder.norm.weight"] - 1,
           "lm_head.weight": sd["output_proj.weight"]}
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out.update(projections_back(sd, o, h, c))
        for theirs, ours in NORMS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"] - 1
    return out


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    every = c.window.global_every if c.window.size else 1
    config = transformers.Gemma3TextConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_decoder_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        query_pre_attn_scalar=c.head_dim, max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps, sliding_window=c.window.size or c.max_len,
        layer_types=["full_attention" if every and (i + 1) % every == 0
                     else "sliding_attention" for i in range(c.n_decoder_layers)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": c.rope.base},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope.local_base}},
        tie_word_embeddings=c.tie_embeddings, architectures=["Gemma3ForCausalLM"],
        **specials(ids))
    return transformers.Gemma3ForCausalLM(config)


FIXES = {"arch": "decoder", "norm_first": True, "norm": "rmsnorm", "activation": "geglu_tanh",
         "bias": False, "qk_norm": True, "post_norms": True, "scale_embeddings": True,
         "rope.scaling": "none", "positional": "rope", "embed_norm": False,
         "type_vocab_size": 0, "rope.nope_every": 0, "experts.count": 0}


def refuse(c: ModelConfig) -> None:
    require(c, FIXES,
            "Gemma 3 (RMSNorm before and after each sublayer and on q and k, gated "
            "GELU-tanh, scaled embeddings, rotary positions)")
    if c.qkv_bias:
        raise Refused("qkv_bias", c.qkv_bias, "Gemma 3 has no biases on q, k and v")


GGUF_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
              "post_attention_norm": "post_attention_layernorm",
              "ffn_norm": "pre_feedforward_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"}


def gguf_settings(read) -> dict:
    """A Gemma 3 GGUF file's settings beyond its sizes; llama.cpp takes the local layers'
    base, their pattern and the scores' scale (1/sqrt(head_dim)) as fixed for every Gemma 3."""
    return {"model_type": "gemma3_text",
            "rope_theta": float(read("gemma3.rope.freq_base", 1_000_000.0)),
            "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 6,
            "sliding_window": int(read("gemma3.attention.sliding_window")),
            "vocab_size": len(read("tokenizer.ggml.tokens")),
            "pad_token_id": int(read("tokenizer.ggml.padding_token_id", 0))}


ARCHITECTURE = Architecture(
    name="gemma3", hf_types=("gemma3_text",), hf_class="Gemma3ForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXES, peft=True,
    gguf=GGUF({**GGUF_BLOCKS, **GGUF_NORMS}, gguf_settings, norms_plus_one=True))
