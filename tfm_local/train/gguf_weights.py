"""A target GGUF's hyper-parameters and its tensors, dequantized to float32 numpy arrays.

The metadata and tensor table come from ``tfm_local.files.gguf_meta`` (fast);
tensor data is read through a memory map and dequantized with the ``gguf``
package (``gguf.quants.dequantize``: F32, F16, BF16, Q4_K, Q6_K, Q8_0, ...).
Arrays are in numpy order, the reverse of GGUF's ``ne``: ``token_embd.weight``
is ``(n_vocab, n_embd)``, ``blk.N.attn_q.weight`` is ``(n_head·head_dim, n_embd)``.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files.gguf_meta import GGUFError, TensorEntry, dequantize_tensor, read_gguf_meta
from .errors import TrainError

#: Architectures whose forward ``target_torch`` implements, with their RoPE style
#: (llama.cpp ``llama_model_rope_type``: NeoX = rotate halves, norm = adjacent pairs).
ROPE_NEOX = {"qwen2": True, "qwen3": True, "llama": False}


@dataclass(frozen=True)
class TargetHParams:
    """Shape facts of a target GGUF needed to run it.

    Attributes:
        path: the GGUF file. arch: ``general.architecture``.
        n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab: sizes.
        rope_theta: RoPE base. rope_neox: rotate halves (True) or adjacent pairs.
        rms_eps: RMSNorm epsilon. tied: no ``output.weight`` (LM head = embedding).
    """

    path: Path
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rope_neox: bool
    rms_eps: float
    tied: bool


class GGUFTensors:
    """Memory-mapped tensors of a GGUF file, dequantized on request.

    Args:
        path: GGUF file.
    Raises:
        TrainError: missing, truncated or corrupt file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            meta = read_gguf_meta(self.path)
        except GGUFError as e:
            raise TrainError(str(e)) from None
        self.kv = {k: v.value for k, v in meta.kv.items()}
        self.entries: dict[str, TensorEntry] = {t.name: t for t in meta.tensors}
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def load(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32, numpy order (``ne`` reversed).

        Raises:
            TrainError: no such tensor, or a type the gguf package cannot dequantize.
        """
        e = self.entries.get(name)
        if e is None:
            raise TrainError(f"{self.path.name} has no tensor {name!r}")
        try:  # a copy, never a view of the map
            return dequantize_tensor(np.frombuffer(self._map, dtype=np.uint8, count=e.nbytes, offset=e.begin), e)
        except GGUFError as err:
            raise TrainError(f"{self.path.name}: {err}") from None

    def close(self) -> None:
        """Release the memory map (idempotent)."""
        if self._map is not None:
            self._map.close()
            self._file.close()
            self._map = None


def read_hparams(g: GGUFTensors) -> TargetHParams:
    """The TargetHParams of an opened GGUF.

    Raises:
        TrainError: an architecture ``target_torch`` does not implement, a
            missing key, or RoPE applied to part of the head only.
    """
    kv = g.kv
    arch = kv.get("general.architecture")
    if arch not in ROPE_NEOX:
        raise TrainError(f"{g.path.name}: architecture {arch!r} is not supported for training "
                         f"(supported: {sorted(ROPE_NEOX)})")

    def req(key: str):
        if f"{arch}.{key}" not in kv:
            raise TrainError(f"{g.path.name} lacks the metadata key {arch}.{key}")
        return kv[f"{arch}.{key}"]

    n_embd, n_head = int(req("embedding_length")), int(req("attention.head_count"))
    head_dim = int(kv.get(f"{arch}.attention.key_length", n_embd // n_head))
    n_rot = int(kv.get(f"{arch}.rope.dimension_count", head_dim))
    if n_rot != head_dim:
        raise TrainError(f"{g.path.name}: partial RoPE ({n_rot} of {head_dim} dims) is not supported")
    if "tokenizer.ggml.tokens" not in kv:
        raise TrainError(f"{g.path.name} has no vocabulary (tokenizer.ggml.tokens)")
    return TargetHParams(
        path=g.path, arch=arch, n_layer=int(req("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(kv.get(f"{arch}.attention.head_count_kv", n_head)), head_dim=head_dim,
        n_ff=int(req("feed_forward_length")), n_vocab=len(kv["tokenizer.ggml.tokens"]),
        rope_theta=float(kv.get(f"{arch}.rope.freq_base", 10000.0)), rope_neox=ROPE_NEOX[arch],
        rms_eps=float(req("attention.layer_norm_rms_epsilon")), tied="output.weight" not in g,
    )
