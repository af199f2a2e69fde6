"""One weights file: safetensors whose header carries the sha256 of its tensors (their
names, dtypes, shapes and bytes, in name order), written whole or not at all, and read one
tensor at a time (a large table in blocks of rows) with that checksum checked as it goes.

Both ways go through the ``safetensors`` library. It reads through a memory map, and a map
keeps every page it has touched resident until it closes: read through one map, the whole file
counted in the process's memory (SmolLM2: 538 MB) beside the model it filled. So each tensor,
and each block of a table, is read through a map of its own, closed once it is read: a
tensor's pages stay only while the tensor does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..atomic import atomic_write


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        _hash_tensor(h, name, tensors[name])
    return h.hexdigest()


def _hash_tensor(h, name: str, t: torch.Tensor) -> None:
    t = t.detach().contiguous().cpu()
    _hash_header(h, name, t.dtype, t.shape)
    _hash_bytes(h, t)


def _hash_header(h, name: str, dtype: torch.dtype, shape) -> None:
    h.update(f"{name}:{dtype}:{tuple(shape)};".encode())


def _hash_bytes(h, t: torch.Tensor) -> None:
    h.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes as they are: no copy


def write_tensors(path: Path, tensors: dict[str, torch.Tensor],
                  metadata: dict[str, str] | None = None) -> None:
    """Safetensors, with the sha256 of the tensors in the file's own metadata."""
    metadata = {**(metadata or {}), "sha256": tensors_sha256(tensors)}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, checked against the sha256 it was written with (files
    written before checksums existed are read unchecked)."""
    return dict(iter_weights(path))


class RowBlocks:
    """A tensor of a weights file read ``rows`` rows at a time as it is iterated (once, before
    the file's next tensor), for a table too large to hold whole beside what it becomes. Each
    block is read into the same memory: use it before taking the next."""

    def __init__(self, read: Callable[[int, int], torch.Tensor], shape: torch.Size,
                 dtype: torch.dtype, rows: int) -> None:
        self.read, self.shape, self.dtype, self.rows = read, shape, dtype, rows

    def __iter__(self) -> Iterator[torch.Tensor]:
        for a in range(0, self.shape[0], self.rows):
            yield self.read(a, min(a + self.rows, self.shape[0]))


@contextmanager
def _opened(path: Path) -> Iterator:
    """The file through a map of its own (see the module), its tensors made on the CPU
    whatever torch's default device (the library makes them with torch's defaults)."""
    with torch.device("cpu"), safe_open(str(path), framework="pt", device="cpu") as f:
        yield f


def _row_blocks(path: Path, name: str, h, rows: int, damaged) -> RowBlocks:
    """:class:`RowBlocks` of one (V, D) tensor: each block read through a map of its own into
    one buffer and hashed in order, which hashes what the whole tensor's bytes would."""
    with _opened(path) as f:
        table = f.get_slice(name)
        shape, dtype = torch.Size(table.get_shape()), table[:0].dtype
    _hash_header(h, name, dtype, shape)  # then each block's bytes: the whole tensor's hash
    buffer = torch.empty(min(rows, shape[0]), shape[1], dtype=dtype, device="cpu")  # one for
    # every block, not one per block left behind in malloc's heap

    def read(a: int, b: int) -> torch.Tensor:
        try:
            with _opened(path) as f:
                t = buffer[:b - a].copy_(f.get_slice(name)[a:b])
        except Exception as e:
            raise damaged(e) from None
        _hash_bytes(h, t)
        return t

    return RowBlocks(read, shape, dtype, rows)


def iter_weights(path: Path, in_blocks: Callable[[str], int] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor | RowBlocks]]:
    """The tensors of a weights file one at a time, in name order, so that a model is loaded
    without the whole file in memory at once (each through a map of its own: see the
    module). A tensor for which ``in_blocks(name)`` gives a number of rows comes as
    :class:`RowBlocks`, to be iterated before the next is read. The sha256 the file was
    written with is checked as they are read: a mismatch raises after the last tensor
    (whatever was loaded from them is then dropped with the error)."""
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")

    def damaged(e: Exception) -> ValueError:  # safetensors' own errors: truncated, garbled
        return ValueError(f"{path} is damaged or not a safetensors file ({str(e)[:120]}); "
                          "restore it, or load the other weights (best or last)")

    try:
        with _opened(path) as f:
            recorded = (f.metadata() or {}).get("sha256")
            names = sorted(f.keys())
            shapes = {name: f.get_slice(name).get_shape() for name in names}
    except Exception as e:
        raise damaged(e) from None
    h = hashlib.sha256()
    for name in names:
        rows = in_blocks(name) if in_blocks is not None else 0
        if rows and len(shapes[name]) == 2:
            yield name, _row_blocks(path, name, h, rows, damaged)
            continue
        try:
            with _opened(path) as f:
                t = f.get_tensor(name)
        except Exception as e:
            raise damaged(e) from None
        _hash_tensor(h, name, t)
        yield name, t
    if recorded is not None and h.hexdigest() != recorded:
        raise ValueError(f"{path} is damaged: its tensors do not match the checksum written "
                         "with them (a bit flip or a partial copy); restore it, or load the "
                         "other weights (best or last)")
