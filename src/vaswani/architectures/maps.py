"""Pieces of weight maps that several architectures share: taking a checkpoint's tensor
out by name and size, LLaMA's per-layer projection names (Qwen2, Mistral, Gemma 3 and their
successors name theirs alike) both ways, and a model's tables as a checkpoint holds them."""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig


def take(hf: dict[str, Tensor], name: str, *shape: int) -> Tensor:
    """The tensor ``name`` taken out of ``hf`` (:func:`sized`)."""
    return sized(hf.pop(name), name, *shape)


def sized(tensor: Tensor, name: str, *shape: int) -> Tensor:
    """``tensor`` (the checkpoint's ``name``), refused by name unless it has ``shape``: a
    transposed or reshaped tensor would otherwise fail in a concatenation, unnamed, or load
    as wrong weights."""
    if tuple(tensor.shape) != shape:
        raise ValueError(f"the checkpoint's {name} has shape {tuple(tensor.shape)}, but the "
                         f"config's sizes give {shape}")
    return tensor


def as_float(out: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Every tensor float32 and contiguous, replaced one at a time (a bfloat16 checkpoint is
    not held twice); a tied output projection is the embedding itself."""
    for name in out:
        out[name] = out[name].float().contiguous()
    if config.tie_embeddings:
        out["output_proj.weight"] = out["embed.token.weight"]
    return out


def widths(c: ModelConfig) -> dict[str, int]:
    """The rows of each attention projection: q's (heads x head width), k's and v's."""
    head = c.head_dim or c.d_model // c.n_heads
    kv = (c.n_kv_heads or c.n_heads) * head
    return {"q": c.n_heads * head, "k": kv, "v": kv}


def projections(hf: dict[str, Tensor], h: str, o: str, config: ModelConfig, *,
                bias: bool = False) -> dict[str, Tensor]:
    """One layer's linear weights, taken out of Hugging Face's LLaMA names (prefix ``h``)
    into vaswani's (prefix ``o``), each checked against ``config``'s sizes: q, k, v (and their
    biases) stacked into ``in_proj``, gate and up into the gated feed-forward's ``linear1``."""
    return {**attention_projections(hf, h, o, config, bias=bias),
            **gated_feed_forward(hf, h + "mlp.", o + "feed_forward.", config.d_model,
                                 config.d_ff)}


def attention_projections(hf: dict[str, Tensor], h: str, o: str, config: ModelConfig, *,
                          bias: bool = False) -> dict[str, Tensor]:
    """:func:`projections`' attention part: q, k, v into ``in_proj``, o into ``out_proj``."""
    d, rows = config.d_model, widths(config)
    out = {o + "self_attn.in_proj.weight": torch.cat(
        [take(hf, h + f"self_attn.{n}_proj.weight", rows[n], d) for n in ("q", "k", "v")])}
    if bias:
        out[o + "self_attn.in_proj.bias"] = torch.cat(
            [take(hf, h + f"self_attn.{n}_proj.bias", rows[n]) for n in ("q", "k", "v")])
    out[o + "self_attn.out_proj.weight"] = take(hf, h + "self_attn.o_proj.weight", d, rows["q"])
    return out


def gated_feed_forward(hf: dict[str, Tensor], h: str, o: str, d: int, ff: int
                       ) -> dict[str, Tensor]:
    """A gated feed-forward block's ``gate_proj``, ``up_proj`` and ``down_proj`` (prefix
    ``h``) -> vaswani's ``linear1`` (gate and up stacked) and ``linear2`` (prefix ``o``)."""
    return {o + "linear1.weight": torch.cat([take(hf, h + f"{n}_proj.weight", ff, d)
                                             for n in ("gate", "up")]),
            o + "linear2.weight": take(hf, h + "down_proj.weight", d, ff)}


def projections_back(sd: dict[str, Tensor], o: str, h: str, c: ModelConfig, *,
                     bias: bool = False) -> dict[str, Tensor]:
    """:func:`projections` the other way: vaswani's ``in_proj`` and ``linear1`` (prefix
    ``o``) split into LLaMA's q, k, v and gate, up (prefix ``h``)."""
    return {**attention_projections_back(sd, o, h, c, bias=bias),
            **gated_feed_forward_back(sd, o + "feed_forward.", h + "mlp.")}


def attention_projections_back(sd: dict[str, Tensor], o: str, h: str, c: ModelConfig, *,
                               bias: bool = False) -> dict[str, Tensor]:
    """:func:`attention_projections` the other way."""
    rows = widths(c)
    sizes = [rows["q"], rows["k"], rows["v"]]
    out = dict(zip((h + f"self_attn.{n}_proj.weight" for n in "qkv"),
                   sd[o + "self_attn.in_proj.weight"].split(sizes), strict=True))
    if bias:
        out.update(zip((h + f"self_attn.{n}_proj.bias" for n in "qkv"),
                       sd[o + "self_attn.in_proj.bias"].split(sizes), strict=True))
    out[h + "self_attn.o_proj.weight"] = sd[o + "self_attn.out_proj.weight"]
    return out


def gated_feed_forward_back(sd: dict[str, Tensor], o: str, h: str) -> dict[str, Tensor]:
    """:func:`gated_feed_forward` the other way."""
    gate, up = sd[o + "linear1.weight"].chunk(2)
    return {h + "gate_proj.weight": gate, h + "up_proj.weight": up,
            h + "down_proj.weight": sd[o + "linear2.weight"]}


def ends(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """The tensors outside the layers of a LLaMA-layout checkpoint, taken out of ``hf``: the
    token table, the final norm and, where untied, the head."""
    d = config.d_model
    out = {"embed.token.weight": take(hf, "model.embed_tokens.weight", config.vocab_size, d),
           "decoder.norm.weight": take(hf, "model.norm.weight", d)}
    if not config.tie_embeddings:
        out["output_proj.weight"] = take(hf, "lm_head.weight", config.vocab_size, d)
    return out


def ends_back(model, c: ModelConfig, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """:func:`ends` the other way (``sd``: the model's state dict)."""
    return {"model.embed_tokens.weight": input_embeddings(model, c),
            "model.norm.weight": sd["decoder.norm.weight"],
            "lm_head.weight": sd["output_proj.weight"]}


def input_embeddings(model, c: ModelConfig) -> Tensor:
    """The token table as a checkpoint that does not scale its embeddings adds it:
    vaswani's sqrt(d_model) folded in."""
    table = model.embed.token.weight.detach()
    return table * model.embed.scale if c.scale_embeddings else table


def positions(model, c: ModelConfig) -> Tensor:
    """The position table as a learned one (sinusoids written out)."""
    return model.embed.position.pe if c.positional == "sinusoidal" else model.embed.position.weight


def tied(c: ModelConfig) -> bool:
    """Input and output embeddings stay one matrix only when nothing scales the input."""
    return c.tie_embeddings and not c.scale_embeddings


def specials(ids: dict[str, int]) -> dict[str, int]:
    """A run's special tokens as transformers' config fields."""
    return {"pad_token_id": ids["pad"], "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"]}
