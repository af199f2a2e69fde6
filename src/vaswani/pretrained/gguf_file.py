"""The GGUF container (llama.cpp's file format, versions 2 and 3): its header read at once,
each tensor read from disk only when asked for, so that importing holds one tensor at a time
beside what has been converted.

The layout (little-endian): ``GGUF``, version (u32), tensor count and metadata count (u64);
the metadata as key (a string: u64 length, UTF-8 bytes), value type (u32), value; a table of
tensors as name, dimension count (u32), dimensions (u64 each, fastest first), ggml type (u32),
offset (u64) into the data, which starts at the header's end rounded up to
``general.alignment`` bytes. PyPI ``gguf`` dequantizes the blocks; its own reader builds
every metadata item as a numpy view up front, which for a vocabulary of 262,144 tokens
(Gemma's) takes most of an import.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# metadata value types -> (struct format, numpy type) of a scalar
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32),
            7: ("<?", np.bool_), 10: ("<Q", np.uint64), 11: ("<q", np.int64),
            12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
# ggml types stored as plain numbers; every other type is blocks for gguf.quants
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32,
          27: np.int64, 28: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # as the file lists them: fastest-varying first
    offset: int  # from the start of the file
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in numpy's (row-major) order."""
        return tuple(reversed(self.dims))


class GGUFFile:
    """``fields`` (key -> int, float, bool, str or a list of them) and ``tensors`` (a list of
    :class:`TensorInfo`) of a GGUF file; :meth:`read` gives one tensor as float32."""

    def __init__(self, path: Path):
        import gguf  # the block sizes of the quantized types

        self.path = Path(path)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            self._buf, self._at = m, 4
            try:
                magic, version = m[:4], self._scalar("<I")
                if magic != b"GGUF" or version not in (2, 3):
                    raise ValueError(f"{self.path} is not a GGUF file of version 2 or 3 "
                                     f"(it starts {bytes(magic)!r}, version {version})")
                n_tensors, n_fields = self._scalar("<Q"), self._scalar("<Q")
                self.fields = {}
                for _ in range(n_fields):
                    key = self._string()
                    self.fields[key] = self._value(self._scalar("<I"))
                table = [(self._string(), [self._scalar("<Q") for _ in range(self._scalar("<I"))],
                          self._scalar("<I"), self._scalar("<Q")) for _ in range(n_tensors)]
            finally:
                self._buf = None
            size = len(m)
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-self._at // alignment) * alignment
        self.tensors: list[TensorInfo] = []
        for name, dims, kind, offset in table:
            elements = int(np.prod(dims, dtype=np.int64))
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            info = TensorInfo(name, kind, tuple(dims), start + offset,
                              elements // block * block_bytes)
            if info.offset + info.n_bytes > size:
                raise ValueError(f"{self.path}: tensor {name!r} ends at byte "
                                 f"{info.offset + info.n_bytes:,}, past the file's end "
                                 f"({size:,} bytes): the file is truncated")
            self.tensors.append(info)

    def read(self, info: TensorInfo) -> np.ndarray:
        """One tensor read from disk and dequantized to a fresh float32 array."""
        import gguf

        plain = _PLAIN.get(info.ggml_type)
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            raw = np.fromfile(f, dtype=plain or np.uint8,
                              count=info.n_bytes // np.dtype(plain or np.uint8).itemsize)
        if plain is not None:
            return raw.reshape(info.shape).astype(np.float32, copy=False)
        rows = raw.reshape(*info.shape[:-1], -1)
        return np.asarray(gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(info.ggml_type)),
                          dtype=np.float32).reshape(info.shape)

    # the header's parts, each read at self._at
    def _scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self._buf, self._at)[0]
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        text = self._buf[self._at:self._at + n]
        if len(text) != n:
            raise ValueError(f"{self.path}: the header ends inside a string")
        self._at += n
        return text.decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._scalar("<I"), self._scalar("<Q")
            if item == _STRING:
                return [self._string() for _ in range(count)]
            if item in _SCALARS:  # numbers in one read
                dtype = np.dtype(_SCALARS[item][1]).newbyteorder("<")
                values = np.frombuffer(self._buf, dtype, count, self._at)
                self._at += values.nbytes
                return values.tolist()
            return [self._value(item) for _ in range(count)]  # arrays of arrays
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: unknown metadata type {kind} at byte {self._at}")
        return self._scalar(_SCALARS[kind][0])
