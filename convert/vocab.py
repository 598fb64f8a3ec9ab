"""Ship a drafter without its vocabulary; give it back the target's at install time.

A DFlash drafter GGUF carries a copy of the target's tokenizer (llama.cpp
loads a vocabulary with every model): ~6 MB for a Qwen2.5 vocabulary, dead
weight in a repository. ``strip_vocab`` writes the same file without the
``tokenizer.*`` keys (the mask token id is kept); ``attach_vocab`` copies the
tokenizer of a target GGUF back in. Tensors are copied byte for byte
(quantized data unchanged); outputs appear only when complete.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tfm_local.files.atomic import atomic_output
from tfm_local.files.gguf_meta import GGUFKeyValue, GGUFMeta, read_gguf_meta

from .errors import ConvertError, convert_errors
from .target_info import MASK_TOKEN_KEY

_SKIP = ("GGUF.", "general.architecture")


@dataclass(frozen=True)
class NewTensor:
    """A tensor to add to a rewritten GGUF: name, ``ne`` dims (GGUF order), GGML type, its raw data."""

    name: str
    ne: tuple[int, ...]
    ggml_type: int
    data: np.ndarray


def _is_vocab(key: str) -> bool:
    return key.startswith("tokenizer.") and key != MASK_TOKEN_KEY


@convert_errors()
def strip_vocab(drafter: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Copy ``drafter`` to ``out`` without its tokenizer keys. Raises ConvertError on a bad GGUF."""
    meta = read_gguf_meta(drafter)
    return rewrite_gguf(drafter, meta, [kv for kv in meta.kv.values() if not _is_vocab(kv.key)], out)


@convert_errors()
def attach_vocab(weights: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Copy a vocabulary-less drafter ``weights`` to ``out`` with the tokenizer of ``target``.

    Raises ConvertError when either file is not a readable GGUF, or the target has no tokenizer.
    """
    meta = read_gguf_meta(weights)
    vocab = [kv for kv in read_gguf_meta(target).kv.values() if _is_vocab(kv.key)]
    if not vocab:
        raise ConvertError(f"{target} has no tokenizer to attach")
    kvs = [kv for kv in meta.kv.values() if not _is_vocab(kv.key)] + vocab
    return rewrite_gguf(weights, meta, kvs, out)


@convert_errors()
def rewrite_gguf(src: str | os.PathLike, meta: GGUFMeta, kvs: list[GGUFKeyValue], out,
                 drop: frozenset[str] = frozenset(), extra: tuple[NewTensor, ...] = ()) -> Path:
    """Write ``out`` (atomically): the keys ``kvs``, the tensors of ``src`` (``meta``'s table) byte for
    byte except those named in ``drop``, then the tensors ``extra``."""
    arch = meta.kv.get("general.architecture")
    if arch is None:
        raise ConvertError(f"{src} has no general.architecture")
    out = Path(out)
    kept = [t for t in meta.tensors if t.name not in drop]
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf, \
            atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), str(arch.value if isinstance(arch.value, str) else arch.value.decode()))
        try:
            for kv in kvs:
                if not kv.key.startswith(_SKIP):
                    w.add_key_value(kv.key, kv.value, kv.vtype, kv.sub_type)
            infos = [(t.name, t.ne, t.ggml_type, t.nbytes) for t in kept]
            infos += [(t.name, t.ne, t.ggml_type, t.data.nbytes) for t in extra]
            for name, ne, ggml_type, nbytes in infos:
                w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes,
                                  raw_dtype=gguf.GGMLQuantizationType(ggml_type))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for t in kept:
                w.write_tensor_data(np.frombuffer(buf, dtype=np.uint8, count=t.nbytes, offset=t.begin))
            for t in extra:
                w.write_tensor_data(t.data)
        finally:
            w.close()
    return out
