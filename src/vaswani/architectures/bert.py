"""BERT (Hugging Face ``BertModel``) on vaswani's own modules.

A BERT encoder is a post-LN Transformer encoder with GELU, learned positions, token-type
embeddings and a LayerNorm after the embeddings: every piece is a ``ModelConfig`` option of
:class:`~vaswani.models.EncoderClassifier`. A run trained here with sinusoidal positions,
scaled embeddings or no token types is written as BERT exactly (the sinusoids as the learned
table, the scale folded in, one token-type row of zeros).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig
from . import Architecture, Refused, require
from .maps import input_embeddings, positions, sized, specials

DESCRIBED = "BERT (post-LN, LayerNorm with biases, a norm after the embeddings)"


def config_from_hf(hf: dict, pad_id: int | None = None, *, n_classes: int = 0) -> ModelConfig:
    """A Hugging Face ``BertConfig`` (config.json as a dict) -> ModelConfig."""
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"config.json describes a {hf.get('model_type')!r} model, not BERT")
    activation = {"gelu": "gelu", "relu": "relu"}.get(hf.get("hidden_act", "gelu"))
    if activation is None:
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (gelu, relu)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only absolute position embeddings are supported")
    return ModelConfig(
        arch="encoder", vocab_size=hf["vocab_size"], n_classes=n_classes,
        d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"],
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attn_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        max_len=hf["max_position_embeddings"], pad_id=hf.get("pad_token_id", 0) or 0,
        norm_first=False, norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12),
        activation=activation, bias=True, positional="learned", scale_embeddings=False,
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, tie_embeddings=False,
        pooling="mean")


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``BertModel`` weights -> EncoderClassifier state dict (no head).

    Accepts keys with or without the ``bert.`` prefix; the pooler is not used (vaswani pools
    by mean or first token) and is dropped. q, k and v are stacked into ``in_proj``.
    """
    sd = {k.removeprefix("bert."): v for k, v in hf.items()}
    out = {
        "embed.token.weight": sd["embeddings.word_embeddings.weight"],
        "embed.position.weight": sd["embeddings.position_embeddings.weight"],
        "embed.token_type.weight": sd["embeddings.token_type_embeddings.weight"],
        "embed.norm.weight": sd["embeddings.LayerNorm.weight"],
        "embed.norm.bias": sd["embeddings.LayerNorm.bias"],
    }
    d = config.d_model
    for i in range(config.n_encoder_layers):
        hf_l, ours = f"encoder.layer.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            shape = (d, d) if kind == "weight" else (d,)
            out[ours + f"self_attn.in_proj.{kind}"] = torch.cat(
                [sized(sd[name], name, *shape) for name in
                 (hf_l + f"attention.self.{n}.{kind}" for n in ("query", "key", "value"))])
            out[ours + f"self_attn.out_proj.{kind}"] = sd[hf_l + f"attention.output.dense.{kind}"]
            out[ours + f"attn_block.norm.{kind}"] = sd[hf_l + f"attention.output.LayerNorm.{kind}"]
            out[ours + f"feed_forward.linear1.{kind}"] = sd[hf_l + f"intermediate.dense.{kind}"]
            out[ours + f"feed_forward.linear2.{kind}"] = sd[hf_l + f"output.dense.{kind}"]
            out[ours + f"ff_block.norm.{kind}"] = sd[hf_l + f"output.LayerNorm.{kind}"]
    return {k: v.float().contiguous() for k, v in out.items()}


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    """EncoderClassifier -> ``BertModel``'s names (no pooler)."""
    sd = model.state_dict()
    d = c.d_model
    token_type = model.embed.token_type.weight if c.type_vocab_size else torch.zeros(1, d)
    out = {"embeddings.word_embeddings.weight": input_embeddings(model, c),
           "embeddings.position_embeddings.weight": positions(model, c),
           "embeddings.token_type_embeddings.weight": token_type,
           "embeddings.LayerNorm.weight": sd["embed.norm.weight"],
           "embeddings.LayerNorm.bias": sd["embed.norm.bias"]}
    for i in range(c.n_encoder_layers):
        ours, hf = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            q, k, v = sd[ours + f"self_attn.in_proj.{kind}"].split(d)
            for name, t in zip(("query", "key", "value"), (q, k, v), strict=True):
                out[hf + f"attention.self.{name}.{kind}"] = t
            out[hf + f"attention.output.dense.{kind}"] = sd[ours + f"self_attn.out_proj.{kind}"]
            out[hf + f"attention.output.LayerNorm.{kind}"] = sd[ours + f"attn_block.norm.{kind}"]
            out[hf + f"intermediate.dense.{kind}"] = sd[ours + f"feed_forward.linear1.{kind}"]
            out[hf + f"output.dense.{kind}"] = sd[ours + f"feed_forward.linear2.{kind}"]
            out[hf + f"output.LayerNorm.{kind}"] = sd[ours + f"ff_block.norm.{kind}"]
    return out


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_encoder_layers,
        num_attention_heads=c.n_heads, intermediate_size=c.d_ff, hidden_act=c.activation,
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attn_dropout,
        max_position_embeddings=c.max_len, type_vocab_size=max(c.type_vocab_size, 1),
        layer_norm_eps=c.norm_eps, architectures=["BertModel"], **specials(ids))
    return transformers.BertModel(config, add_pooling_layer=False)


FIXES = {"arch": "encoder", "norm_first": False, "norm": "layernorm", "bias": True,
         "embed_norm": True, "qk_norm": False, "post_norms": False,
         "experts.count": 0}  # what every run exported as BERT has


def refuse(c: ModelConfig) -> None:
    if c.positional not in ("learned", "sinusoidal"):
        raise Refused("positional", c.positional, "BERT takes learned or sinusoidal")
    if c.activation not in ("gelu", "relu"):
        raise Refused("activation", c.activation, "BERT takes gelu or relu")
    require(c, {**FIXES, "head_dim": c.d_model // c.n_heads, "n_kv_heads": c.n_heads},
            DESCRIBED)
    if c.qkv_bias is not None and c.qkv_bias != c.bias:
        raise Refused("qkv_bias", c.qkv_bias, "BERT has biases on every projection or none")


ARCHITECTURE = Architecture(
    name="bert", hf_types=("bert",), hf_class="BertModel",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXES)
