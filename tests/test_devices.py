"""Devices: resolving names to usable devices, and whether bf16 is native here."""

import pytest
import torch

from vaswani.devices import _measured_bf16_is_fast, bf16_is_fast, resolve_device


def test_resolve_device_names_and_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"device \('foo'\) must be"):
        resolve_device("foo")
    for other in ("meta", "xpu", "cpu:0:1", "cuda:-1"):  # torch devices vaswani does not run on
        with pytest.raises(ValueError, match=rf"device \('{other}'\) must be 'auto', 'cpu'"):
            resolve_device(other)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            resolve_device("cuda:0")


def test_the_cpu_flags_and_a_timing_agree_on_bf16():
    """On this machine the flag check (avx512_bf16 / amx_bf16) and the timing fallback must
    give the same answer: emulated bf16 is ~50x slower than float32, native bf16 is faster."""
    assert bf16_is_fast(torch.device("cpu")) == _measured_bf16_is_fast()
