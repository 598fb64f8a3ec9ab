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

from tfm_local.files.dflash import FEATURE_ARCHS
from tfm_local.files.gguf_meta import GGUFError, GGUFKeyValue, read_gguf_meta

from .errors import ConvertError

#: Key set by the drafter itself, never copied from the target.
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"

#: Tokenizer keys naming special ids; those ids are never picked as a mask token.
_SPECIAL_ID_KEYS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask")


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
    """Read a target GGUF's shape facts and tokenizer (metadata only, fast).

    Args:
        path: target GGUF file.

    Returns:
        TargetInfo.

    Raises:
        ConvertError: the file is missing, not a GGUF, truncated or corrupt, of an architecture
            outside ``FEATURE_ARCHS``, or lacks the width, depth or vocabulary keys.
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"target GGUF not found: {path}")
    try:
        kv = read_gguf_meta(path).kv
    except GGUFError as e:
        raise ConvertError(f"target {e}") from None
    arch = _required(kv, "general.architecture", path)
    if not isinstance(arch, str) or arch not in FEATURE_ARCHS:
        raise ConvertError(f"target {path.name}: architecture {arch!r} is not one a DFlash drafter can run "
                           "against (its layer inputs cannot be read); supported: "
                           + ", ".join(sorted(FEATURE_ARCHS)))
    if "tokenizer.ggml.tokens" not in kv:
        raise ConvertError(f"target {path.name} has no vocabulary (tokenizer.ggml.tokens)")
    n_vocab = len(kv["tokenizer.ggml.tokens"].value)
    types = kv.get("tokenizer.ggml.token_type")
    token_types = (np.asarray(types.value, dtype=np.int32) if types is not None
                   else np.full(n_vocab, int(gguf.TokenType.NORMAL), dtype=np.int32))
    if token_types.shape != (n_vocab,):
        raise ConvertError(f"target {path.name}: token_type has {token_types.size} entries for {n_vocab} tokens")
    rope = kv.get(f"{arch}.rope.freq_base")
    ctx = kv.get(f"{arch}.context_length")
    return TargetInfo(
        path=path, arch=arch,
        n_embd=int(_required(kv, f"{arch}.embedding_length", path)),
        n_layer=int(_required(kv, f"{arch}.block_count", path)),
        n_vocab=n_vocab,
        n_ctx_train=int(ctx.value) if ctx is not None else 0,
        rope_freq_base=float(rope.value) if rope is not None else None,
        tokenizer=tuple(v for k, v in kv.items() if k.startswith("tokenizer.") and k != MASK_TOKEN_KEY),
        token_types=token_types,
        special_ids=frozenset(int(kv[f"tokenizer.ggml.{n}_token_id"].value) for n in _SPECIAL_ID_KEYS
                              if f"tokenizer.ggml.{n}_token_id" in kv),
    )


def _required(kv: dict[str, GGUFKeyValue], key: str, path: Path) -> Any:
    """The value of a required scalar key; ConvertError when absent."""
    if key not in kv:
        raise ConvertError(f"target {path.name} lacks the metadata key {key!r}")
    return kv[key].value
