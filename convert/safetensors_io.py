"""Minimal safetensors reader and writer in numpy (no torch).

Format (huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``
(offsets relative to the end of the header; optional ``__metadata__``), then
the raw little-endian tensor bytes. Supported dtypes: F32, F16, BF16.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class LazyTensor:
    """A tensor of a safetensors file, loaded on demand.

    Attributes:
        file: the safetensors file.
        name: tensor name as stored.
        dtype: "F32", "F16" or "BF16".
        shape: tuple of ints (numpy order).
        offset: absolute byte offset of the data in ``file``.
    """

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of its data in ``file``."""
        return _ITEMSIZE[self.dtype] * math.prod(self.shape)

    def load(self) -> np.ndarray:
        """The tensor as a float32 array of ``shape`` (BF16/F16 widened exactly)."""
        count = int(np.prod(self.shape, dtype=np.int64))
        raw = np.fromfile(self.file, dtype="<u2" if self.dtype != "F32" else "<f4",
                          count=count, offset=self.offset)
        if self.dtype == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        elif self.dtype == "F16":
            out = raw.view("<f2").astype(np.float32)
        else:
            out = raw.astype(np.float32, copy=False)
        return out.reshape(self.shape)


def read_safetensors(path: str | os.PathLike) -> dict[str, LazyTensor]:
    """Index the tensors of one safetensors file without loading them.

    Returns:
        dict name → LazyTensor.

    Raises:
        ConvertError: unreadable, truncated or malformed file, a tensor's data outside the data
            section or overlapping another's, or a dtype other than F32/F16/BF16.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO or a device would block the read for ever
        raise ConvertError(f"{path} is not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds the file size {size}")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError, RecursionError) as e:
        raise ConvertError(f"cannot read safetensors file {path}: {e}") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        out[name] = _lazy(path, name, meta, base, size)
    _refuse_overlaps(path, out, base)
    return out


def _refuse_overlaps(path: Path, tensors: dict[str, LazyTensor], base: int) -> None:
    """ConvertError when two tensors' data ranges share a byte (a damaged or forged header: each tensor
    owns its bytes; ``_lazy`` keeps every range inside the data section)."""
    spans = sorted((t.offset - base, t.offset - base + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ConvertError(f"{path}: the data of tensors {n0!r} and {n1!r} overlap (data_offsets "
                               f"[{b0}, {e0}] and [{b1}, {e1}]): a damaged header")


def _lazy(path: Path, name: str, meta: dict, base: int, size: int) -> LazyTensor:
    """Validate one header entry and build its LazyTensor."""
    try:
        dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise ConvertError(f"{path}: malformed header entry for tensor {name!r}") from None
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not isinstance(shape, list) or not all(whole(d) and 0 <= d < 1 << 40 for d in shape) or \
            not whole(begin) or not whole(end):
        raise ConvertError(f"{path}: malformed header entry for tensor {name!r} (shape {str(shape)[:40]}, "
                           f"data_offsets {str(meta['data_offsets'])[:40]})")
    shape = tuple(shape)
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        raise ConvertError(f"{path}: tensor {name!r} has dtype {str(dtype)[:20]}; supported: F32, F16, BF16")
    if not 0 <= begin <= end or end - begin != _ITEMSIZE[dtype] * math.prod(shape) or base + end > size:
        raise ConvertError(f"{path}: tensor {name!r} data is truncated or inconsistent with its shape")
    return LazyTensor(path, name, dtype, shape, base + begin)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even); returns the uint16 bit patterns."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))
    return (rounded >> 16).astype(np.uint16)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Write float tensors to a safetensors file (names sorted, header padded to 8 bytes).

    Args:
        path: destination (overwritten; not atomic by itself).
        tensors: name → array (any float dtype, converted).
        dtype: stored dtype, "F32", "F16" or "BF16".

    Raises:
        ValueError: unsupported dtype.
    """
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(_ITEMSIZE)}, got {dtype!r}")
    blobs, header, offset = [], {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name], dtype=np.float32)
        blob = (to_bf16_bits(a) if dtype == "BF16" else a.astype("<f2" if dtype == "F16" else "<f4")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
