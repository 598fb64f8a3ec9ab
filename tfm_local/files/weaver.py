"""The Weaver's GGUF format (architecture ``tfm-weaver``), shared by the runtime (``decode.weaver`` reads
its codes table and identity), the converter (``tfm_convert.weaver_gguf`` writes it) and the trainer (the
model: ``tfm_local/train/weaver.py``).

Metadata: every ``WeaverConfig`` field as ``tfm-weaver.<field>`` (u32 or f32), and what ties the file
to its pair: ``tfm-weaver.target.sha256`` / ``.target.name`` (the target GGUF it was trained for) and
``tfm-weaver.drafter.sha256`` (the drafter's weights, as ``tfm-train`` records them), plus
``tfm-weaver.target.n_vocab`` and ``tfm-weaver.target.key`` (the target's cheap file key,
``tfm_local.files.drafters.file_key``, checked when an engine loads the Weaver). Tensors: the PyTorch
state under GGUF-style names (``blocks.N.`` → ``blk.N.``), and ``codes`` ``[n_vocab, rank]``, the
candidates' codes ``P · W_lm[c]`` of every token computed at export from the target's LM head, so that
scoring K candidates reads K rows of it.
Norm weights stay F32; matrices take the output type (F16 where a row is not a multiple of its block).

Plain reading, no checks of the pair: a file that cannot be read as a Weaver raises ``GGUFError``
(the converter turns it into its ConvertError, ``tfm_convert.errors.convert_errors``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gguf_meta import GGUFError, dequantize_tensor, read_gguf_meta

#: the architecture, and the prefix of its metadata keys
ARCH = "tfm-weaver"
#: the ``WeaverConfig`` fields kept as u32 and as f32
INT_FIELDS = ("target_hidden", "drafter_hidden", "depth", "top_k", "width", "layers", "heads", "ffn", "rank")
FLOAT_FIELDS = ("rope_theta", "eps")


@dataclass
class WeaverFile:
    """A Weaver GGUF read back.

    Attributes:
        config: the ``WeaverConfig`` fields (dict). tensors: GGUF name → float32 array (numpy order).
        identity: ``{"target_sha256", "target_name", "drafter_sha256", "n_vocab"}``.
        path: the file.
    """

    config: dict
    tensors: dict[str, np.ndarray]
    identity: dict
    path: Path

    def state_dict(self) -> dict:
        """The PyTorch state (``Weaver.load_state_dict``) as float32 arrays, ``codes`` left out."""
        return {_torch_name(n): a for n, a in self.tensors.items() if n != "codes"}


def gguf_name(torch_name: str) -> str:
    """``blocks.N.x`` → ``blk.N.x``; other names as they are."""
    return "blk." + torch_name[len("blocks."):] if torch_name.startswith("blocks.") else torch_name


def _torch_name(name: str) -> str:
    return "blocks." + name[len("blk."):] if name.startswith("blk.") else name


def read_weaver_gguf(path: str | os.PathLike) -> WeaverFile:
    """Read a Weaver GGUF (tensors dequantized to float32).

    Raises:
        GGUFError: missing, truncated or corrupt file; not a ``tfm-weaver`` GGUF; missing keys.
    """
    path = Path(path)
    meta = read_gguf_meta(path)
    arch = meta.kv.get("general.architecture")
    if arch is None or arch.value != ARCH:
        raise GGUFError(f"{path} is not a Weaver GGUF (architecture "
                        f"{arch.value if arch else None!r}, expected {ARCH!r})")
    kv = {k: v.value for k, v in meta.kv.items()}
    missing = [f for f in INT_FIELDS + FLOAT_FIELDS if f"{ARCH}.{f}" not in kv]
    if missing or f"{ARCH}.target.sha256" not in kv or f"{ARCH}.drafter.sha256" not in kv:
        raise GGUFError(f"{path}: Weaver GGUF without {missing or 'its pair identity'}")
    config = {f: int(kv[f"{ARCH}.{f}"]) for f in INT_FIELDS} | {f: float(kv[f"{ARCH}.{f}"]) for f in FLOAT_FIELDS}
    identity = {"target_sha256": kv[f"{ARCH}.target.sha256"], "target_name": kv.get(f"{ARCH}.target.name", ""),
                "drafter_sha256": kv[f"{ARCH}.drafter.sha256"], "n_vocab": int(kv.get(f"{ARCH}.target.n_vocab", 0)),
                "target_key": kv.get(f"{ARCH}.target.key", "")}
    with open(path, "rb") as f:
        raw = np.fromfile(f, dtype=np.uint8)
    tensors = {e.name: dequantize_tensor(raw[e.begin:e.begin + e.nbytes], e) for e in meta.tensors}
    if "codes" not in tensors:
        raise GGUFError(f"{path}: Weaver GGUF without its codes table")
    return WeaverFile(config, tensors, identity, path)


def read_weaver_codes(path: str | os.PathLike) -> tuple[np.ndarray, dict]:
    """The codes table (float32 ``[n_vocab, rank]``) and the identity of a Weaver GGUF, the other tensors
    left unread (the runtime's backend loads them).

    Raises:
        GGUFError: as ``read_weaver_gguf``.
    """
    path = Path(path)
    meta = read_gguf_meta(path)
    kv = {k: v.value for k, v in meta.kv.items()}
    if kv.get("general.architecture") != ARCH:
        raise GGUFError(f"{path} is not a Weaver GGUF (architecture {kv.get('general.architecture')!r}, "
                        f"expected {ARCH!r})")
    entry = next((e for e in meta.tensors if e.name == "codes"), None)
    if entry is None:
        raise GGUFError(f"{path}: Weaver GGUF without its codes table")
    with open(path, "rb") as f:
        f.seek(entry.begin)
        raw = np.frombuffer(f.read(entry.nbytes), dtype=np.uint8)
    if raw.size != entry.nbytes:
        raise GGUFError(f"{path} is truncated (its codes table ends past the end of the file)")
    codes = dequantize_tensor(raw, entry)
    identity = {"target_sha256": kv.get(f"{ARCH}.target.sha256", ""), "target_name": kv.get(f"{ARCH}.target.name", ""),
                "drafter_sha256": kv.get(f"{ARCH}.drafter.sha256", ""), "n_vocab": int(kv.get(f"{ARCH}.target.n_vocab", 0)),
                "target_key": kv.get(f"{ARCH}.target.key", "")}
    return np.ascontiguousarray(codes, dtype=np.float32), identity
