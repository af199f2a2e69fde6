"""Token embeddings and positional encodings.

Shape legend: B batch, T sequence length, D d_model.

Positions are explicit: callers may pass ``positions`` (B, T) so that incremental decoding can
offset them by the number of cached tokens. By default positions are 0 .. T-1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .dropout import Dropout


def sinusoidal_table(max_len: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The paper's section 3.5, interleaved: PE[pos, 2i] = sin(pos / base^(2i/D)),
    PE[pos, 2i+1] = cos(pos / base^(2i/D)). Returns (max_len, D).

    (Some implementations concatenate [sin | cos] instead of interleaving; that is a different
    encoding, and one widely copied notebook uses base 1000. Both are tested against here.)
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = position * inv_freq  # (max_len, D/2)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()


def embedding(num: int, dim: int, *, padding_idx: int | None = None) -> nn.Embedding:
    """``nn.Embedding(num, dim, padding_idx=padding_idx)``, with its N(0, 1) draw skipped on the
    meta device. Models are built there first (``build_model``) and initialised afterwards;
    a draw on a meta tensor goes through ``torch._refs``, whose first call imports
    ``torch._dynamo``: a second added to the start of every command that loads a model."""
    layer = nn.Embedding(num, dim, padding_idx=padding_idx, _weight=torch.empty(num, dim))
    if not layer.weight.is_meta:
        layer.reset_parameters()  # nn.Embedding's own: N(0, 1), the padding row zero
    return layer


class Embeddings(nn.Module):
    """Token embedding (optionally scaled by sqrt(D), as in the paper; GPT-2 does not scale)
    plus a sinusoidal or learned positional encoding, then dropout.

    ``"rope"`` and ``"none"`` add no position vector here (rotary positions act inside
    attention). BERT adds a token-type (segment) embedding and normalises the sum before
    dropout: ``type_vocab_size`` and ``norm``.
    """

    def __init__(self, vocab_size: int, d_model: int, *, max_len: int, pad_id: int | None = None,
                 positional: str = "sinusoidal", scale: bool = True, dropout: float = 0.0,
                 type_vocab_size: int = 0, norm: nn.Module | None = None) -> None:
        super().__init__()
        if positional not in ("sinusoidal", "learned", "rope", "none"):
            raise ValueError(f"positional ({positional!r}) must be 'sinusoidal', 'learned', "
                             "'rope' or 'none'")
        self.token = embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.max_len = max_len
        self.positional = positional
        if positional == "sinusoidal":  # a constant, so not saved with the weights
            self.register_buffer("pe", torch.empty(max_len, d_model), persistent=False)
            self.reset_buffers()
        elif positional == "learned":
            self.position = embedding(max_len, d_model)
        self.token_type = embedding(type_vocab_size, d_model) if type_vocab_size else None
        self.norm = norm
        self.dropout = Dropout(dropout)

    def reset_buffers(self) -> None:
        """Fill the sinusoidal table; on the meta device (shapes only) there is nothing to
        fill until ``models.materialise`` has allocated it, and ``build_model`` calls this
        again (``models.common.fill_buffers``)."""
        if self.positional == "sinusoidal" and not self.pe.is_meta:
            self.pe.copy_(sinusoidal_table(self.max_len, self.pe.size(1)))

    def forward(self, ids: Tensor, *, positions: Tensor | None = None,
                token_types: Tensor | None = None) -> Tensor:
        """ids: (B, T) -> (B, T, D). ``positions``: (B, T) or (T,) absolute positions, by
        default ``0 .. T-1`` (checked against max_len on the host; explicit positions are
        read back from their device to be checked, except inside a CUDA graph capture);
        ``token_types`` (B, T) segment ids (default 0) when there are token-type
        embeddings."""
        T = ids.size(1)
        if positions is None:
            last = T - 1
            positions = torch.arange(T, device=ids.device)
        elif torch.compiler.is_compiling() or (
                positions.is_cuda and torch.cuda.is_current_stream_capturing()):
            last = -1  # a graph being captured or compiled reads nothing back; its caller checks
        else:
            last = int(positions.max()) if positions.numel() else -1
        if last >= self.max_len:
            raise ValueError(
                f"position {last} is past max_len ({self.max_len}); "
                "shorten the input or build the model with a larger max_len")
        x = self.token(ids) * self.scale
        if self.positional == "sinusoidal":
            x = x + self.pe[positions].to(x.dtype)
        elif self.positional == "learned":
            x = x + self.position(positions)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_types is None
                     else self.token_type(token_types))
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
