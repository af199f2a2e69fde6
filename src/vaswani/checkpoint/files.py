"""One weights file: safetensors whose header carries the sha256 of its tensors (their
names, dtypes, shapes and bytes, in name order), written whole or not at all, and read one
tensor at a time (a large table in blocks of rows) with that checksum checked as it goes.

The file is written by the ``safetensors`` library and read here with plain ``readinto``:
the library reads through a memory map, and a map keeps every page it has touched resident
until it closes, which counted the whole file in the process's memory (SmolLM2: 538 MB)
beside the model it filled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
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


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def _read_tensor(f, base: int, info: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """One tensor of a safetensors file (``info``: its header entry), read with ``readinto``
    into memory of its own, or into ``out`` (contiguous, of its shape and dtype)."""
    start, end = info["data_offsets"]
    t = torch.empty(info["shape"], dtype=SAFETENSORS_DTYPES[info["dtype"]], device="cpu") \
        if out is None else out
    raw = t.reshape(-1).view(torch.uint8)
    if raw.numel() != end - start:
        raise ValueError(f"a tensor's {end - start} bytes do not hold its shape "
                         f"{info['shape']}")
    f.seek(base + start)
    if raw.numel() and f.readinto(raw.numpy()) != raw.numel():
        raise ValueError("the file ends inside a tensor")
    return t


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


def _row_blocks(f, base: int, info: dict, name: str, h, rows: int, damaged) -> RowBlocks:
    """:class:`RowBlocks` of one (V, D) tensor: each block read with ``_read_tensor`` and
    hashed in order, which hashes what the whole tensor's bytes would."""
    shape, dtype = torch.Size(info["shape"]), SAFETENSORS_DTYPES[info["dtype"]]
    row_bytes = shape[1] * dtype.itemsize
    _hash_header(h, name, dtype, shape)  # then each block's bytes: the whole tensor's hash
    buffer = torch.empty(min(rows, shape[0]), shape[1], dtype=dtype, device="cpu")  # one for
    # every block, not one per block left behind in malloc's heap

    def read(a: int, b: int) -> torch.Tensor:
        start = info["data_offsets"][0] + a * row_bytes
        try:
            t = _read_tensor(f, base, {"shape": [b - a, shape[1]], "dtype": info["dtype"],
                                       "data_offsets": [start, start + (b - a) * row_bytes]},
                             buffer[:b - a])
        except Exception as e:
            raise damaged(e) from None
        _hash_bytes(h, t)
        return t

    return RowBlocks(read, shape, dtype, rows)


def iter_weights(path: Path, in_blocks: Callable[[str], int] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor | RowBlocks]]:
    """The tensors of a weights file one at a time, in name order, so that a model is loaded
    without the whole file in memory at once. They are read, not memory-mapped: a mapping
    keeps every page it has touched resident until it closes, which counted the whole file
    in the process's memory (SmolLM2: 538 MB) beside the model it filled. A tensor for which
    ``in_blocks(name)`` gives a number of rows comes as :class:`RowBlocks`, to be iterated
    before the next is read. The sha256 the file was written with is checked as they are
    read: a mismatch raises after the last tensor (whatever was loaded from them is then
    dropped with the error)."""
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")

    def damaged(e: Exception) -> ValueError:  # safetensors' own errors: truncated, garbled
        return ValueError(f"{path} is damaged or not a safetensors file ({str(e)[:120]}); "
                          "restore it, or load the other weights (best or last)")

    try:
        f = path.open("rb")
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        recorded = (header.pop("__metadata__", None) or {}).get("sha256")
        names = sorted(header)
    except Exception as e:
        raise damaged(e) from None
    h = hashlib.sha256()
    with f:
        for name in names:
            rows = in_blocks(name) if in_blocks is not None else 0
            if rows and len(header[name]["shape"]) == 2:
                yield name, _row_blocks(f, 8 + size, header[name], name, h, rows, damaged)
                continue
            try:
                t = _read_tensor(f, 8 + size, header[name])
            except Exception as e:
                raise damaged(e) from None
            _hash_tensor(h, name, t)
            yield name, t
    if recorded is not None and h.hexdigest() != recorded:
        raise ValueError(f"{path} is damaged: its tensors do not match the checksum written "
                         "with them (a bit flip or a partial copy); restore it, or load the "
                         "other weights (best or last)")
