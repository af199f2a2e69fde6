"""Position-wise feed-forward block: Linear(D, d_ff) -> activation -> dropout -> Linear(d_ff, D).

Shape: (B, T, D) -> (B, T, D). The paper uses ReLU; BERT uses GELU, GPT-2 GELU's tanh
approximation ("gelu_tanh").

``"swiglu"`` (Shazeer 2020; LLaMA) is gated: ``linear2(silu(x W_gate) * (x W_up))``, and
``"geglu_tanh"`` (Gemma) the same with GELU's tanh approximation in place of silu. Its
``linear1`` holds [W_gate; W_up] stacked by rows, so both come from one matmul (2 * d_ff
outputs), the way ``in_proj`` holds q, k and v.
"""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import Tensor, nn

from .dropout import Dropout
from .linear import Linear

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu,
               "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}  # GPT-2's
GATED = {"swiglu": F.silu, "geglu_tanh": ACTIVATIONS["gelu_tanh"]}


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS and activation not in GATED:
            raise ValueError(f"activation ({activation!r}) must be one of "
                             f"{sorted(ACTIVATIONS) + sorted(GATED)}")
        self.gated = activation in GATED
        self.linear1 = Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.linear2 = Linear(d_ff, d_model, bias=bias)
        self.activation = GATED[activation] if self.gated else ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.activation(gate) * up
        else:
            h = self.activation(h)
        return self.linear2(self.dropout(h))
