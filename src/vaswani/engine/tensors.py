"""Tensors of Python lists, made as fast as the engine's steps need them.

A step turns lists of a few hundred or thousand numbers (each row's token, position, slot;
a beam search's scores) into tensors. ``torch.tensor`` looks at every element on its own,
several times slower than numpy, which converts the list in C, and ``torch.from_numpy``,
which shares the array's memory.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

NUMPY = {torch.long: np.int64, torch.float32: np.float32, torch.float64: np.float64}


def tensor_of(values: list, device: torch.device | str, dtype: torch.dtype = torch.long
              ) -> Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` for a list (or a list of equal
    lists) of Python numbers."""
    t = torch.from_numpy(np.array(values, dtype=NUMPY[dtype]))
    return t if torch.device(device).type == "cpu" else t.to(device)
