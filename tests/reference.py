"""Copy weights from torch.nn's Transformer modules into vaswani's, for equivalence tests.

torch.nn.MultiheadAttention keeps [W_q; W_k; W_v] stacked in ``in_proj_weight`` exactly as our
``in_proj`` does, so weights copy over one to one.
"""

import torch
from torch import nn


@torch.no_grad()
def copy_mha(ours, theirs: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(theirs.in_proj_weight)
    ours.in_proj.bias.copy_(theirs.in_proj_bias)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def copy_norm(ours, theirs: nn.LayerNorm) -> None:
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


@torch.no_grad()
def copy_ff(ours, theirs) -> None:
    for name in ("linear1", "linear2"):
        getattr(ours.feed_forward, name).weight.copy_(getattr(theirs, name).weight)
        getattr(ours.feed_forward, name).bias.copy_(getattr(theirs, name).bias)


def copy_encoder_layer(ours, theirs: nn.TransformerEncoderLayer) -> None:
    copy_mha(ours.self_attn, theirs.self_attn)
    copy_ff(ours, theirs)
    copy_norm(ours.attn_block.norm, theirs.norm1)
    copy_norm(ours.ff_block.norm, theirs.norm2)


def copy_decoder_layer(ours, theirs: nn.TransformerDecoderLayer) -> None:
    copy_mha(ours.self_attn, theirs.self_attn)
    copy_mha(ours.cross_attn, theirs.multihead_attn)
    copy_ff(ours, theirs)
    copy_norm(ours.self_block.norm, theirs.norm1)
    copy_norm(ours.cross_block.norm, theirs.norm2)
    copy_norm(ours.ff_block.norm, theirs.norm3)


@torch.no_grad()
def randomize(module: nn.Module) -> None:
    """Give every parameter (norm weights and biases included) random values, so a test
    cannot pass because some weight is the identity."""
    for p in module.parameters():
        p.copy_(torch.randn_like(p) * 0.3)
