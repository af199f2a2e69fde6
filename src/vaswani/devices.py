"""Which device to run on: ``"auto"`` picks CUDA when PyTorch sees a GPU, else the CPU, and a
device that is not there is a clear error (not PyTorch's assertion)."""

from __future__ import annotations

import torch


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` -> a usable torch.device."""
    if name == "auto":
        name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device ({name!r}) must be 'auto', 'cpu', 'cuda', 'cuda:N' or "
                         "'mps'") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device ({name!r}) asked for CUDA, but this PyTorch sees no CUDA "
                             "device (a CPU-only build, or no GPU); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device ({name!r}): there are only {torch.cuda.device_count()} "
                             "CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device ({name!r}): MPS is not available on this machine")
    return device
