"""Position-wise feed-forward block: Linear(D, d_ff) -> activation -> dropout -> Linear(d_ff, D).

Shape: (B, T, D) -> (B, T, D). The paper uses ReLU; BERT and GPT-2 use GELU.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .dropout import Dropout

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation ({activation!r}) must be one of {sorted(ACTIVATIONS)}")
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))
