"""BERT checkpoints (Hugging Face layout) on vaswani's own modules.

A BERT encoder is a post-LN Transformer encoder with GELU, learned positions, token-type
embeddings and a LayerNorm after the embeddings: every piece is a ``ModelConfig`` option of
:class:`~vaswani.models.EncoderClassifier`. This module maps the config and the weights;
nothing here computes anything.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig
from .llama import sized


def config_from_hf(hf: dict, *, n_classes: int = 0) -> ModelConfig:
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


def convert_state_dict(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face ``BertModel`` weights -> EncoderClassifier state dict (no head).

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
