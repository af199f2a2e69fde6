"""Token embeddings and positional encodings.

Shape legend: B batch, T sequence length, D d_model.

Positions are explicit: callers may pass ``positions`` (B, T) so that incremental decoding can
offset them by the number of cached tokens. By default positions are 0 .. T-1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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


class Positions(nn.Module):
    """What the embeddings add for each token's position, for positions ``0 .. max_len-1``.
    This one adds nothing: rotary positions act inside attention (rotary.py), and a model
    may have none at all. :class:`SinusoidalPositions` (the paper) and
    :class:`LearnedPositions` (GPT-2, BERT) add a vector."""

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}"


class SinusoidalPositions(Positions):
    """The paper's fixed encoding (:func:`sinusoidal_table`), a constant: not saved with the
    weights."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__(max_len)
        self.register_buffer("pe", torch.empty(max_len, d_model), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Fill the table; on the meta device (shapes only) there is nothing to fill until
        ``models.materialise`` has allocated it, and ``build_model`` calls this again
        (``models.common.fill_buffers``)."""
        if not self.pe.is_meta:
            self.pe.copy_(sinusoidal_table(self.max_len, self.pe.size(1)))

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.pe[positions].to(x.dtype)


class LearnedPositions(Positions):
    """A trained vector per position (GPT-2, BERT): a (max_len, D) table."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__(max_len)
        self.weight = embedding(max_len, d_model).weight  # nn.Embedding's N(0, 1) draw

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + F.embedding(positions, self.weight)


def positions(kind: str, max_len: int, d_model: int) -> Positions:
    """``"sinusoidal"``, ``"learned"``, or ``"rope"`` / ``"none"`` (nothing added here)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, d_model)
    if kind == "learned":
        return LearnedPositions(max_len, d_model)
    if kind in ("rope", "none"):
        return Positions(max_len)
    raise ValueError(f"positional ({kind!r}) must be 'sinusoidal', 'learned', 'rope' or "
                     "'none'")


class Embeddings(nn.Module):
    """Token embedding (scaled by sqrt(D) with ``scale``, as in the paper; GPT-2 does not
    scale) plus its position's encoding (:class:`Positions`), then dropout.

    BERT adds a token-type (segment) embedding and normalises the sum before dropout:
    ``token_type`` and ``norm``.
    """

    def __init__(self, token: nn.Embedding, position: Positions, *, scale: bool = True,
                 dropout: float = 0.0, token_type: nn.Embedding | None = None,
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.token = token
        self.scale = math.sqrt(token.embedding_dim) if scale else 1.0
        self.position = position
        self.token_type = token_type
        self.norm = norm
        self.dropout = Dropout(dropout)

    @property
    def max_len(self) -> int:
        return self.position.max_len

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
        x = self.position(self.token(ids) * self.scale, positions)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_types is None
                     else self.token_type(token_types))
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
