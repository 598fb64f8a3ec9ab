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
from pathlib import Path

import gguf
import numpy as np

from .atomic import atomic_output
from .errors import ConvertError
from .gguf_meta import GGUFKeyValue, GGUFMeta, read_gguf_meta
from .target_info import MASK_TOKEN_KEY

_SKIP = ("GGUF.", "general.architecture")


def _is_vocab(key: str) -> bool:
    return key.startswith("tokenizer.") and key != MASK_TOKEN_KEY


def strip_vocab(drafter: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Copy ``drafter`` to ``out`` without its tokenizer keys. Raises ConvertError on a bad GGUF."""
    meta = read_gguf_meta(drafter)
    return _rewrite(drafter, meta, [kv for kv in meta.kv.values() if not _is_vocab(kv.key)], out)


def attach_vocab(weights: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Copy a vocabulary-less drafter ``weights`` to ``out`` with the tokenizer of ``target``.

    Raises ConvertError when either file is not a readable GGUF, or the target has no tokenizer.
    """
    meta = read_gguf_meta(weights)
    vocab = [kv for kv in read_gguf_meta(target).kv.values() if _is_vocab(kv.key)]
    if not vocab:
        raise ConvertError(f"{target} has no tokenizer to attach")
    kvs = [kv for kv in meta.kv.values() if not _is_vocab(kv.key)] + vocab
    return _rewrite(weights, meta, kvs, out)


def _rewrite(src: str | os.PathLike, meta: GGUFMeta, kvs: list[GGUFKeyValue], out) -> Path:
    arch = meta.kv.get("general.architecture")
    if arch is None:
        raise ConvertError(f"{src} has no general.architecture")
    out = Path(out)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf, \
            atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), str(arch.value if isinstance(arch.value, str) else arch.value.decode()))
        try:
            for kv in kvs:
                if not kv.key.startswith(_SKIP):
                    w.add_key_value(kv.key, kv.value, kv.vtype, kv.sub_type)
            for t in meta.tensors:
                qt = gguf.GGMLQuantizationType(t.ggml_type)
                shape = tuple(reversed(t.ne))
                w.add_tensor_info(t.name, shape, np.dtype(np.float32), t.nbytes, raw_dtype=qt)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for t in meta.tensors:
                w.write_tensor_data(np.frombuffer(buf, dtype=np.uint8, count=t.nbytes, offset=t.begin))
        finally:
            w.close()
    return out
