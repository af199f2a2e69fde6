"""Pieces shared by the three model families: layer options from a config, the final norm,
the output projection and the one weight-initialisation function."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..nn.norm import make_norm
from ..nn.positional import Embeddings


def layer_options(c: ModelConfig) -> dict:
    """Keyword arguments shared by EncoderLayer and DecoderLayer (they take plain arguments,
    never a whole config)."""
    return dict(dropout=c.dropout, attn_dropout=c.attn_dropout_p, n_kv_heads=c.n_kv_heads,
                norm_first=c.norm_first, norm=c.norm, norm_eps=c.norm_eps,
                activation=c.activation, bias=c.bias, backend=c.attention,
                rope_base=c.rope_base if c.positional == "rope" else None)


def final_norm(c: ModelConfig) -> nn.Module | None:
    """Pre-LN stacks end with a norm; post-LN stacks already end normalised."""
    return make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_first else None


def embeddings(c: ModelConfig, vocab_size: int) -> Embeddings:
    norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.embed_norm else None
    return Embeddings(vocab_size, c.d_model, max_len=c.max_len, pad_id=c.pad_id,
                      positional=c.positional, scale=c.scale_embeddings, dropout=c.dropout,
                      type_vocab_size=c.type_vocab_size, norm=norm)


def output_projection(c: ModelConfig, embed: Embeddings, vocab_size: int) -> nn.Linear:
    """Linear(D, V) without bias; shares the embedding matrix when ``tie_embeddings``."""
    proj = nn.Linear(c.d_model, vocab_size, bias=False)
    if c.tie_embeddings:
        proj.weight = embed.token.weight
    return proj


def init_weights(model: nn.Module, pad_id: int | None = None) -> None:
    """Xavier/Glorot-uniform for every matrix (embeddings and projections), zeros for biases,
    ones/zeros for norms (their constructors' values), as in the Annotated Transformer.

    Runs after weights are tied, so a tied matrix is initialised once. The padding token's
    embedding row is set back to zero (``padding_idx`` keeps it there during training).
    """
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    if pad_id is not None:
        for module in model.modules():
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
