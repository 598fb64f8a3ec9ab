"""A fast reader of a GGUF file's metadata and tensor table (not its tensor data), shared by the
runtime (``tfm_local.llama.model.gguf_kv``), the trainer and the converter.

``gguf.GGUFReader`` builds a numpy view per string, which takes ~20 s for
the 300k tokenizer strings of a Qwen2.5 vocabulary; this reader parses the
same header with ``struct`` in well under a second. Format: GGUF v2/v3
(ggml ``docs/gguf.md``): magic ``GGUF``, version u32, tensor count u64,
KV count u64, the KV pairs, the tensor infos, then the aligned data.

``read_gguf_meta(path)`` -> ``GGUFMeta``: ``kv`` (key -> ``GGUFKeyValue``, in file order) and
``tensors`` (``TensorEntry``: name, ``ne`` dims in GGUF order, i.e. numpy's reversed, GGML type,
absolute byte range). Array elements that are strings are kept as raw ``bytes`` (copied verbatim
into a rewritten GGUF); scalar strings are decoded to ``str``. ``dequantize_tensor(raw, entry)``
-> float32 array of shape ``reversed(entry.ne)``.

Errors: GGUFError (a ValueError; the message is meant for the user as is) for a missing,
truncated or corrupt file and for a tensor type the ``gguf`` package cannot dequantize. The
converter turns it into its ConvertError (``tfm_convert.errors.convert_errors``).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import gguf

VT = gguf.GGUFValueType
_SCALARS = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
            VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
            VT.FLOAT64: "<d"}


class GGUFError(ValueError):
    """A GGUF file that cannot be read: missing, not a GGUF, truncated or corrupt; or a tensor type the
    ``gguf`` package cannot dequantize."""


@dataclass(frozen=True)
class GGUFKeyValue:
    """One metadata entry, ready for ``GGUFWriter.add_key_value(key, value, vtype, sub_type)``.

    Attributes:
        key: metadata key, e.g. ``tokenizer.ggml.tokens``.
        value: int/float/bool/str scalar, or a list (strings as bytes).
        vtype: GGUF value type.
        sub_type: element type of an ARRAY, else None.
    """

    key: str
    value: Any
    vtype: VT
    sub_type: VT | None = None


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the table: name, ``ne`` dims (GGUF order), GGML type, absolute data range."""

    name: str
    ne: tuple[int, ...]
    ggml_type: int
    begin: int
    nbytes: int


@dataclass(frozen=True)
class GGUFMeta:
    """Metadata (key → GGUFKeyValue, in file order) and tensor table of a GGUF file."""

    kv: dict[str, GGUFKeyValue]
    tensors: list[TensorEntry]


class _Cursor:
    """Sequential little-endian reads over a buffer; EOFError past its end."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise EOFError("unexpected end of file")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def raw_string(self) -> bytes:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise EOFError("unexpected end of file in a string")
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def value(self, vt: VT) -> Any:
        if vt == VT.STRING:
            return self.raw_string().decode("utf-8", errors="replace")
        return self.take(_SCALARS[vt])

    def array(self, sub: VT, n: int) -> list:
        if sub == VT.STRING:
            return [self.raw_string() for _ in range(n)]
        if sub == VT.ARRAY:
            raise ValueError("nested arrays are not supported")
        dt = np.dtype(_SCALARS[sub])
        end = self.pos + n * dt.itemsize
        if end > len(self.buf):
            raise EOFError("unexpected end of file in an array")
        out = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos).tolist()
        self.pos = end
        return out


def read_gguf_meta(path: str | os.PathLike) -> GGUFMeta:
    """Parse a GGUF file's metadata and tensor table; check that every tensor lies inside the file.

    Raises:
        GGUFError: missing file, bad magic/version, truncation, or a
            malformed entry (unknown value or tensor type).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path)
    except FileNotFoundError:
        raise GGUFError(f"GGUF file not found: {path}") from None
    except (OSError, EOFError, ValueError, KeyError, struct.error, UnicodeDecodeError) as e:
        raise GGUFError(f"{path} is not a readable GGUF file, truncated or corrupt "
                           f"({type(e).__name__}: {e})") from None


def _parse(buf, path: Path) -> GGUFMeta:
    """Parse the header of a mapped GGUF file (see read_gguf_meta)."""
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("bad magic (not a GGUF file)")
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    kv: dict[str, GGUFKeyValue] = {}
    for _ in range(n_kv):
        key = c.raw_string().decode("utf-8", errors="replace")  # llama.cpp does not check keys' UTF-8
        vt = VT(c.take("<I"))
        if vt == VT.ARRAY:
            sub = VT(c.take("<I"))
            kv[key] = GGUFKeyValue(key, c.array(sub, c.take("<Q")), vt, sub)
        else:
            kv[key] = GGUFKeyValue(key, c.value(vt), vt)
    infos = []
    for _ in range(n_tensors):
        name = c.raw_string().decode("utf-8")
        ne = tuple(c.take("<Q") for _ in range(c.take("<I")))
        infos.append((name, ne, c.take("<I"), c.take("<Q")))
    align = kv["general.alignment"].value if "general.alignment" in kv else gguf.GGUF_DEFAULT_ALIGNMENT
    if isinstance(align, (list, tuple, str, bytes, float)) or not 1 <= int(align) <= 1 << 20:
        raise ValueError(f"general.alignment is {str(align)[:40]}, not a whole number of bytes in 1..2**20")
    align = int(align)
    data_start = -(-c.pos // align) * align
    return GGUFMeta(kv, [_tensor_entry(i, data_start, len(buf)) for i in infos])


def _tensor_entry(info: tuple, data_start: int, size: int) -> TensorEntry:
    """Build a TensorEntry and check that its data fits in the file."""
    name, ne, type_id, offset = info
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    n = math.prod(ne)  # Python's int: an int64 product would wrap
    if any(d >= 1 << 40 for d in ne) or n >= 1 << 50:
        raise ValueError(f"tensor {name!r} has dimensions {ne}, larger than any file")
    nbytes = n // block * type_size
    begin = data_start + offset
    if begin + nbytes > size:
        raise EOFError(f"tensor {name!r} needs bytes up to {begin + nbytes}, the file has {size}")
    return TensorEntry(name, ne, type_id, begin, nbytes)


def dequantize_tensor(raw: np.ndarray, e: TensorEntry) -> np.ndarray:
    """Tensor ``e`` from its ``e.nbytes`` raw bytes (uint8 array) as a new float32 array in numpy
    order (``ne`` reversed), never a view of ``raw``; types as ``gguf.quants.dequantize``.

    Raises:
        GGUFError: a type the gguf package cannot dequantize.
    """
    qt = gguf.GGMLQuantizationType(e.ggml_type)
    rows = int(np.prod(e.ne[1:], dtype=np.int64)) if len(e.ne) > 1 else 1
    try:
        out = gguf.quants.dequantize(raw.reshape(rows, -1), qt)
    except NotImplementedError:
        raise GGUFError(f"tensor {e.name} has type {qt.name}, which gguf cannot dequantize") from None
    return np.array(out, dtype=np.float32).reshape(tuple(reversed(e.ne)))


#: llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (src/llama-hparams.h)
MAX_LAYERS, MAX_EXPERTS = 512, 1024


def check_hparams(meta: GGUFMeta, path: str | os.PathLike) -> None:
    """Refuse hyperparameters and vocabularies on which llama.cpp's loader or graph would abort the
    process (a GGML_ASSERT, a division by zero) instead of returning an error: a token string twice in
    the vocabulary, a layer count outside
    1..512, a zero width, head count, head dimension or context, a KV head count that does not divide
    the head count, more experts than 1,024 or more used than exist, a non-finite or negative norm
    epsilon, a non-finite or non-positive RoPE base (damaged files, found by fuzzing; the checks run
    before llama.cpp sees the file).

    Raises:
        GGUFError: naming the file and the key.
    """
    kv = meta.kv
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is not None and isinstance(tokens.value, list):
        seen = set()
        for t in tokens.value:
            if t in seen:
                raise GGUFError(f"{path}: tokenizer.ggml.tokens holds {t!r} twice (a damaged vocabulary)")
            seen.add(t)
    arch = kv.get("general.architecture")
    if arch is None or not isinstance(arch.value, str):
        return  # llama.cpp refuses a file without an architecture on its own
    a = arch.value

    def bad(key: str, why: str):
        raise GGUFError(f"{path}: {key} {why} (a damaged or unsupported GGUF)")

    def ints(key: str) -> list[int] | None:
        e = kv.get(f"{a}.{key}")
        if e is None:
            return None
        vals = e.value if isinstance(e.value, list) else [e.value]
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
            bad(f"{a}.{key}", f"is not an integer ({e.vtype.name})")
        return [int(v) for v in vals]

    heads, kv_heads, width = ints("attention.head_count"), ints("attention.head_count_kv"), ints("embedding_length")
    layers = ints("block_count")
    if layers is not None and not (len(layers) == 1 and 1 <= layers[0] <= MAX_LAYERS):
        bad(f"{a}.block_count", f"= {layers[:4]}, not 1..{MAX_LAYERS}")
    for key in ("embedding_length", "context_length", "attention.head_count", "feed_forward_length"):
        vals = ints(key)
        if vals is not None and (not vals or (key != "feed_forward_length" and min(vals) < 1) or min(vals) < 0
                                 or max(vals) >= 1 << 31):
            bad(f"{a}.{key}", f"= {vals[:4]}{'...' if len(vals) > 4 else ''}, out of range")
    if kv_heads is not None:
        if not kv_heads or max(kv_heads) >= 1 << 31 or min(kv_heads) < 0:
            bad(f"{a}.attention.head_count_kv", f"= {kv_heads[:4]}, out of range")
        if heads and len(heads) == 1 and any(h > 0 and heads[0] % h for h in kv_heads):
            bad(f"{a}.attention.head_count_kv", f"= {kv_heads[:4]} does not divide the head count {heads[0]}")
    if heads and width and len(heads) == 1 and "attention.key_length" not in kv and f"{a}.attention.key_length" not in kv \
            and width[0] % heads[0]:
        bad(f"{a}.attention.head_count", f"= {heads[0]} does not divide the width {width[0]}")
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
        vals = ints(key)
        if vals is not None and (not vals or min(vals) < 1 or max(vals) >= 1 << 20):
            bad(f"{a}.{key}", f"= {vals[:4]}, out of range")
    experts, used = ints("expert_count"), ints("expert_used_count")
    if experts is not None and not (len(experts) == 1 and 0 <= experts[0] <= MAX_EXPERTS):
        bad(f"{a}.expert_count", f"= {experts[:4]}, not 0..{MAX_EXPERTS}")
    if used is not None and (len(used) != 1 or used[0] < 0 or used[0] > (experts[0] if experts else 0)):
        bad(f"{a}.expert_used_count", f"= {used[:4]}, more than the {experts[0] if experts else 0} experts")
    for key, e in kv.items():
        if not key.startswith(a + ".") or e.vtype not in (VT.FLOAT32, VT.FLOAT64) or isinstance(e.value, list):
            continue
        v = float(e.value)
        if not np.isfinite(v):
            bad(key, f"= {v}, not a finite number")
        if key.endswith("epsilon") and v < 0:
            bad(key, f"= {v}, negative")
        if key.endswith("rope.freq_base") and v <= 0:
            bad(key, f"= {v}, not positive")
