"""Pieces shared by the three model families: the layers built from a config, embeddings,
the final norm, the output projection, the decoder's positions and masks, and the one
weight-initialisation function."""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from ..architectures.gemma3 import SandwichResidual
from ..config import ModelConfig
from ..nn import masks
from ..nn.attention import Attention, Heads, MultiHeadAttention
from ..nn.feedforward import FeedForward
from ..nn.layers import DecoderLayer, EncoderLayer, LayerWeights, Residual
from ..nn.linear import Linear
from ..nn.lora import LoRA
from ..nn.moe import MixtureOfExperts, Router
from ..nn.norm import make_norm
from ..nn.positional import Embeddings, embedding, positions
from ..nn.rotary import RopeScaling, Rotary


def heads(c: ModelConfig) -> Heads:
    return Heads(c.d_model, c.n_heads, c.n_kv_heads, c.head_dim)


def self_attention(c: ModelConfig, layer: int = 0) -> MultiHeadAttention:
    """Layer ``layer``'s self-attention: the same for every layer, but for Gemma 3's local
    layers (a window and their own rotary base) and SmolLM3's layers without positions."""
    nope, window = c.rope.nope_every, c.window
    rope = c.positional == "rope" and not (nope and (layer + 1) % nope == 0)
    local = window.size > 0 and (window.global_every == 0 or (layer + 1) % window.global_every)
    rotary = Rotary(heads(c).head_dim, c.rope.local_base if local else c.rope.base,
                    rope_scaling(c)) if rope else None
    return MultiHeadAttention(heads(c), attention(c), bias=biases(c), rotary=rotary,
                              qk_norms=qk_norms(c), window=window.size if local else 0)


def cross_attention(c: ModelConfig) -> MultiHeadAttention:
    """A translator's decoder layers' attention over the source (no positions of its own;
    ``qk_norm``'s norms are made, as they always were, and not applied)."""
    return MultiHeadAttention(heads(c), attention(c), bias=biases(c), qk_norms=qk_norms(c))


def attention(c: ModelConfig) -> Attention:
    return Attention(c.dropout if c.attn_dropout is None else c.attn_dropout, c.attention)


def biases(c: ModelConfig) -> tuple[bool, bool]:
    """(on q, k and v; on the output projection): Qwen2's ``qkv_bias`` is the first alone."""
    return (c.bias if c.qkv_bias is None else c.qkv_bias), c.bias


def rope_scaling(c: ModelConfig) -> RopeScaling | None:
    r = c.rope
    return None if r.scaling == "none" else RopeScaling(
        r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_len)


def qk_norms(c: ModelConfig) -> tuple[nn.Module, nn.Module] | None:
    """Gemma 3's (and Qwen3's) norms over each head's queries and keys, where asked for."""
    width = heads(c).head_dim
    return (norm(c, width), norm(c, width)) if c.qk_norm else None


def norm(c: ModelConfig, width: int | None = None) -> nn.Module:
    return make_norm(c.norm, c.d_model if width is None else width, c.norm_eps, c.bias)


def feed_forward(c: ModelConfig) -> FeedForward | MixtureOfExperts:
    """Each layer's feed-forward block, or with [model.experts] a mixture of them."""
    e = c.experts
    if not e.count:
        return FeedForward(c.d_model, c.d_ff, activation=c.activation, dropout=c.dropout,
                           bias=c.bias)
    experts = [FeedForward(c.d_model, e.d_ff, activation=c.activation, dropout=c.dropout,
                           bias=c.bias) for _ in range(e.count)]
    return MixtureOfExperts(Router(c.d_model, e.count), experts, top_k=e.per_token,
                            renormalize=e.renormalize)


def residual(c: ModelConfig) -> Residual:
    """One sublayer's residual block; Gemma's has a second norm on the sublayer's output."""
    if c.post_norms:
        return SandwichResidual(norm(c), norm(c), c.dropout)
    return Residual(norm(c), c.dropout, c.norm_first)


def encoder_layer(c: ModelConfig) -> EncoderLayer:
    return EncoderLayer(self_attention(c), feed_forward(c), lambda: residual(c))


def decoder_layer(c: ModelConfig, layer: int = 0, *, cross: bool = False) -> DecoderLayer:
    """Layer ``layer`` of a decoder: a translator's (``cross``) attends to the source too."""
    return DecoderLayer(self_attention(c, layer), feed_forward(c), lambda: residual(c),
                        cross_attention(c) if cross else None)


def final_norm(c: ModelConfig) -> nn.Module | None:
    """Pre-LN stacks end with a norm; post-LN stacks already end normalised."""
    return norm(c) if c.norm_first else None


def embeddings(c: ModelConfig, vocab_size: int) -> Embeddings:
    return Embeddings(embedding(vocab_size, c.d_model, padding_idx=c.pad_id),
                      positions(c.positional, c.max_len, c.d_model),
                      scale=c.scale_embeddings, dropout=c.dropout,
                      token_type=embedding(c.type_vocab_size, c.d_model)
                      if c.type_vocab_size else None,
                      norm=norm(c) if c.embed_norm else None)


class OutputProjection(Linear):
    """Linear(D, V) without bias: hidden states -> vocabulary scores. It is the largest matrix
    of a small model; on a CPU, inference multiplies through cpu/linear.py's reordered copy
    of the weight, one row included."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__(d_model, vocab_size, bias=False)


def output_projection(c: ModelConfig, embed: Embeddings, vocab_size: int) -> nn.Linear:
    """:class:`OutputProjection`; shares the embedding matrix when ``tie_embeddings``."""
    proj = OutputProjection(c.d_model, vocab_size)
    if c.tie_embeddings:
        proj.weight = embed.token.weight
    return proj


def decoder_inputs(ids: Tensor, keep: Tensor | bool | None, pad_id: int
                   ) -> tuple[Tensor, masks.Mask]:
    """(positions (T,), self-attention mask) of a decoder's whole sequence ``ids`` (B, T),
    read at once from position 0: causal, and with key padding from ``keep`` (B, T), True =
    real token; None: the padding is ``ids != pad_id``; ``True``: no key padding (no token
    is padding, or it all comes after the real tokens, which causal attention never shows a
    real token), so the mask is :func:`~vaswani.nn.masks.causal` alone."""
    T = ids.size(1)
    if keep is True:
        return torch.arange(T, device=ids.device), masks.causal(T)
    keep = masks.padding_mask(ids, pad_id) if keep is None else keep
    return (torch.arange(T, device=ids.device),
            masks.decoder_self_mask(keep, T, device=ids.device))


def at_last(h: Tensor, last: Tensor) -> Tensor:
    """Each row's hidden state at its position ``last`` (B,): (B, T, D) -> (B, D). A decoding
    step (T = 1) takes the one position as it is, no gather."""
    if h.size(1) == 1:
        return h[:, 0]
    return h[torch.arange(h.size(0), device=h.device), last]


def stack_weights(layers: list[LayerWeights], which: str) -> Tensor:
    """Per-layer (B, H, Tq, Tk) weights of one kind ("self_attn" or "cross_attn") ->
    (L, B, H, Tq, Tk)."""
    return torch.stack([getattr(w, which) for w in layers])


def fill_buffers(model: nn.Module) -> None:
    """Compute the buffers that are not saved with the weights (the sinusoidal table), once
    the model's memory is allocated: each module's ``reset_buffers``."""
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()


def init_weights(model: nn.Module, pad_id: int | None = None) -> None:
    """Xavier/Glorot-uniform for every matrix (embeddings and projections), zeros for biases,
    ones for norm weights, as in the Annotated Transformer; and the constant tables
    (:func:`fill_buffers`). Every value is set, so it also initialises a model whose memory was
    just allocated (:func:`vaswani.models.build_model`, built on the meta device).

    A tied matrix is initialised once. The padding token's embedding row is zero
    (``padding_idx`` keeps it there during training). The random draws are the same, in the
    same order, whether the parameters are whole or sharded (FSDP's DTensors: each rank draws
    the whole matrix, one at a time, and keeps its slice), so a sharded run starts from the
    weights a single process starts from. LoRA adapters are left to their own layer's
    draws (nn/lora.py; models/finetune.py ``draw_adapters``).
    """
    fill_buffers(model)
    seen = {id(p) for m in model.modules() if isinstance(m, LoRA)  # drawn apart
            for p in (*m.lora_A.values(), *m.lora_B.values())}
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen:  # tied
                    continue
                seen.add(id(p))
                value = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                if p.dim() > 1:
                    nn.init.xavier_uniform_(value)
                    if isinstance(module, nn.Embedding) and module.padding_idx is not None \
                            and pad_id is not None:
                        value[module.padding_idx] = 0
                else:  # a norm's gain is 1; biases and a norm's shift are 0
                    value.fill_(1.0 if name == "weight" else 0.0)
                assign(p, value)


def is_sharded(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (FSDP's sharded parameters). Asked without importing
    ``torch.distributed.tensor``, which takes half a second: until something has imported
    it (sharding does), no tensor can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def assign(target: Tensor, value: Tensor) -> None:
    """Copy the whole tensor ``value`` into a parameter: all of it, or this rank's slice of
    a sharded (DTensor) parameter, cut locally (no communication)."""
    if is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(target.device), target.device_mesh,
                                  target.placements, src_data_rank=None)
    target.copy_(value)
