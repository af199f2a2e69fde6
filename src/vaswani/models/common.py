"""Pieces shared by the three model families: the layers' options from a config, embeddings,
the final norm, the output projection, the decoder's positions and masks, and the one
weight-initialisation function."""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import masks
from ..nn.layers import LayerOptions, LayerWeights
from ..nn.linear import Linear
from ..nn.norm import make_norm
from ..nn.positional import Embeddings
from ..nn.rotary import RopeScaling


def layer_options(c: ModelConfig, layer: int = 0) -> LayerOptions:
    """The options of layer ``layer`` (layers take plain values, never a config). They are
    the same for every layer, but for Gemma 3's local layers (a window and their own rotary
    base) and SmolLM3's layers without positions."""
    rope = c.positional == "rope" and not (c.nope_every and (layer + 1) % c.nope_every == 0)
    scaling = None if c.rope_scaling == "none" else RopeScaling(
        c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_len)
    local = c.sliding_window > 0 and (c.global_every == 0 or (layer + 1) % c.global_every)
    base = c.local_rope_base if local else c.rope_base
    return LayerOptions(d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff,
                        n_kv_heads=c.n_kv_heads, dropout=c.dropout, attn_dropout=c.attn_dropout,
                        norm_first=c.norm_first, norm=c.norm, norm_eps=c.norm_eps,
                        activation=c.activation, bias=c.bias, qkv_bias=c.qkv_bias,
                        attention=c.attention, rope_base=base if rope else None,
                        rope_scaling=scaling if rope else None, head_dim=c.head_dim,
                        qk_norm=c.qk_norm, post_norms=c.post_norms,
                        window=c.sliding_window if local else 0)


def final_norm(c: ModelConfig) -> nn.Module | None:
    """Pre-LN stacks end with a norm; post-LN stacks already end normalised."""
    return make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_first else None


def embeddings(c: ModelConfig, vocab_size: int) -> Embeddings:
    norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.embed_norm else None
    return Embeddings(vocab_size, c.d_model, max_len=c.max_len, pad_id=c.pad_id,
                      positional=c.positional, scale=c.scale_embeddings, dropout=c.dropout,
                      type_vocab_size=c.type_vocab_size, norm=norm)


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
    weights a single process starts from.
    """
    fill_buffers(model)
    seen: set[int] = set()
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
