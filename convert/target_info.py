"""Facts about a target model, read from its GGUF file.

A drafter GGUF must match its target: same hidden size (the target's
features and the shared embedding/LM head have that width), same vocabulary
(copied from the target, never from a Hugging Face tokenizer), and target
layer ids inside the target's depth.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gguf

from .errors import ConvertError

#: Key set by the drafter itself, never copied from the target.
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"

#: Tokenizer keys naming special ids; those ids are never picked as a mask token.
_SPECIAL_ID_KEYS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask")


@dataclass(frozen=True)
class GGUFKeyValue:
    """One GGUF metadata entry, ready to be re-written with ``GGUFWriter.add_key_value``.

    Attributes:
        key: metadata key, e.g. ``tokenizer.ggml.tokens``.
        value: Python value (int, float, bool, str, or list of those).
        vtype: GGUF value type.
        sub_type: element type of an ARRAY, else None.
    """

    key: str
    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


@dataclass(frozen=True)
class TargetInfo:
    """What tfm-convert needs to know about a target GGUF.

    Attributes:
        path: the GGUF file.
        arch: ``general.architecture`` (e.g. "qwen2").
        n_embd: hidden size (``{arch}.embedding_length``).
        n_layer: number of blocks (``{arch}.block_count``).
        n_vocab: vocabulary size (length of ``tokenizer.ggml.tokens``).
        n_ctx_train: training context length (0 when absent).
        rope_freq_base: ``{arch}.rope.freq_base`` or None.
        tokenizer: every ``tokenizer.*`` entry except the mask token id.
        token_types: int32 array [n_vocab] of gguf.TokenType values (NORMAL when absent).
        special_ids: ids named by the tokenizer's special-token keys.
    """

    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float | None
    tokenizer: tuple[GGUFKeyValue, ...] = field(repr=False)
    token_types: np.ndarray = field(repr=False)
    special_ids: frozenset[int] = frozenset()

    def unused_token_ids(self) -> list[int]:
        """Ids of tokens typed UNUSED (vocabulary padding), ascending; may be empty."""
        unused = np.flatnonzero(self.token_types == int(gguf.TokenType.UNUSED))
        return [int(i) for i in unused if int(i) not in self.special_ids]

    def pick_mask_token(self) -> int:
        """A token id a drafter may use as its MASK: the first UNUSED id of the vocabulary.

        Raises:
            ConvertError: the vocabulary has no UNUSED token.
        """
        unused = self.unused_token_ids()
        if not unused:
            raise ConvertError(f"target {self.path.name} has no unused token to serve as the mask token; "
                               "pass one explicitly (--mask-token ID)")
        return unused[0]


def read_target_info(path: str | os.PathLike) -> TargetInfo:
    """Read a target GGUF's shape facts and tokenizer.

    Args:
        path: target GGUF file.

    Returns:
        TargetInfo.

    Raises:
        ConvertError: the file is missing, not a GGUF, truncated or corrupt,
            or lacks the architecture, width, depth or vocabulary keys.
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"target GGUF not found: {path}")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises many types on malformed input
        raise ConvertError(f"target {path} is not a readable GGUF file, truncated or corrupt "
                           f"({type(e).__name__}: {e})") from None
    _check_tensor_extents(reader, path)
    fields = {name: f for name, f in reader.fields.items()}
    arch = _scalar(fields, "general.architecture", path)
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ConvertError(f"target {path.name} has no vocabulary (tokenizer.ggml.tokens)")
    n_vocab = len(tokens.data)
    types_field = fields.get("tokenizer.ggml.token_type")
    token_types = (np.asarray(types_field.contents(), dtype=np.int32) if types_field is not None
                   else np.full(n_vocab, int(gguf.TokenType.NORMAL), dtype=np.int32))
    if token_types.shape != (n_vocab,):
        raise ConvertError(f"target {path.name}: token_type has {token_types.size} entries for {n_vocab} tokens")
    rope = fields.get(f"{arch}.rope.freq_base")
    return TargetInfo(
        path=path, arch=arch,
        n_embd=int(_scalar(fields, f"{arch}.embedding_length", path)),
        n_layer=int(_scalar(fields, f"{arch}.block_count", path)),
        n_vocab=n_vocab,
        n_ctx_train=int(fields[f"{arch}.context_length"].contents()) if f"{arch}.context_length" in fields else 0,
        rope_freq_base=float(rope.contents()) if rope is not None else None,
        tokenizer=tuple(_key_value(f) for name, f in fields.items()
                        if name.startswith("tokenizer.") and name != MASK_TOKEN_KEY),
        token_types=token_types,
        special_ids=frozenset(_special_ids(fields)),
    )


def _check_tensor_extents(reader: gguf.GGUFReader, path: Path) -> None:
    """Raise ConvertError when a tensor's data runs past the end of the file (truncation)."""
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ConvertError(f"target {path} is truncated or corrupt: tensor {t.name!r} "
                               f"needs bytes up to {t.data_offset + t.n_bytes}, the file has {size}")


def _scalar(fields: dict, key: str, path: Path) -> Any:
    """The value of a required scalar key; ConvertError when absent."""
    f = fields.get(key)
    if f is None:
        raise ConvertError(f"target {path.name} lacks the metadata key {key!r}")
    return f.contents()


def _key_value(f: gguf.ReaderField) -> GGUFKeyValue:
    """Convert a reader field into a re-writable GGUFKeyValue."""
    vtype = f.types[0]
    sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    return GGUFKeyValue(f.name, f.contents(), vtype, sub)


def _special_ids(fields: dict) -> list[int]:
    """Ids named by ``tokenizer.ggml.<name>_token_id`` keys."""
    ids = []
    for name in _SPECIAL_ID_KEYS:
        f = fields.get(f"tokenizer.ggml.{name}_token_id")
        if f is not None:
            ids.append(int(f.contents()))
    return ids
