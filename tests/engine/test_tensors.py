"""Tensors of Python lists (engine/tensors.py)."""

import pytest
import torch

from tests.conftest import DEVICE
from vaswani.engine.tensors import tensor_of


@pytest.mark.parametrize("values, dtype", [
    ([3, 0, 2**40, -1], torch.long), ([], torch.long), ([[1, 2], [3, 4]], torch.long),
    ([0.5, 1e-30, -2.25], torch.float32), ([0.1, -1e300], torch.float64)])
def test_a_list_becomes_the_tensor_torch_tensor_makes(values, dtype):
    want = torch.tensor(values, dtype=dtype, device=DEVICE)
    got = tensor_of(values, DEVICE, dtype)
    assert got.dtype == want.dtype and got.device == want.device and got.shape == want.shape
    assert torch.equal(got, want)
