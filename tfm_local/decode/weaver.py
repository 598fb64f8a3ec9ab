"""The Weaver at run time (Trees from Marginals, arXiv 2607.06763): a Weaver GGUF
(``tfm_convert.weaver_gguf``) computed on the ggml backend through our C API (``tfm_weaver_q``), and the
candidates' scores from its codes table on the host.

One call scores the candidates of the next depth for a batch of paths (a round of the w-wide heap):
the backend computes q ``[n_paths, rank]`` from the drafts' prefixes (the target's final hidden state,
the drafter's block states) and each path's steps (the target's embeddings of the root and the path's
tokens); the host adds ``codes[c] · q`` to the drafter's logit of each candidate c (K rows of the table).
The reference model, its training and the tree it drives: ``tfm_local/train/weaver.py``,
``weaver_fit.py``, ``weaver_eval.py``. Not yet wired into the engine (``tree="tfm"``).
"""
from __future__ import annotations

import os

import numpy as np

from ..llama import native


class Weaver:
    """A loaded Weaver.

    Args:
        path: Weaver GGUF. device: ``"cpu"`` or ``"gpu"`` (the first GPU). n_threads: CPU threads
            (default: all cores).
    Attributes:
        shape: its sizes (``WeaverConfig`` names). codes: float32 ``[n_vocab, rank]`` (host).
        identity: the pair it was trained for (``WeaverFile.identity``).
    Raises:
        tfm_convert.ConvertError: not a readable Weaver GGUF. NativeError: the backend cannot load it.
    """

    def __init__(self, path: str | os.PathLike, device: str = "cpu", n_threads: int | None = None):
        from tfm_convert.weaver_gguf import read_weaver_codes

        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        self.codes, self.identity = read_weaver_codes(path)
        self._w = native.weaver_load(str(path), 0 if device == "cpu" else 1, n_threads or os.cpu_count() or 1)
        self.shape = native.weaver_shape(self._w)

    def q(self, h_target: np.ndarray, h_drafter: np.ndarray, path_draft: np.ndarray, path_len: np.ndarray,
          step_emb: np.ndarray) -> np.ndarray:
        """q of each path's last step, float32 ``[n_paths, rank]``.

        Args:
            h_target: ``[n_drafts, target_hidden]``; h_drafter: ``[n_drafts, depth, drafter_hidden]``.
            path_draft / path_len: int ``[n_paths]`` (draft index; steps, 1..depth).
            step_emb: ``[sum(path_len), target_hidden]``, the paths' steps one path after another.
        Raises:
            ValueError: shapes that do not fit the Weaver or each other.
        """
        s = self.shape
        ht, hd, se = np.asarray(h_target), np.asarray(h_drafter), np.asarray(step_emb)
        n = ht.shape[0] if ht.ndim == 2 else -1
        if (ht.shape != (n, s["target_hidden"]) or hd.shape != (n, s["depth"], s["drafter_hidden"])
                or se.ndim != 2 or se.shape[1] != s["target_hidden"]):
            raise ValueError(f"Weaver inputs of shapes {ht.shape}, {hd.shape}, {se.shape} do not fit a Weaver of "
                             f"target_hidden {s['target_hidden']}, depth {s['depth']}, drafter_hidden {s['drafter_hidden']}")
        return native.weaver_q(self._w, s["rank"], ht, hd, path_draft, path_len, se)

    def scores(self, q: np.ndarray, cand: np.ndarray, cand_logit: np.ndarray) -> np.ndarray:
        """Corrected logits ``[n_paths, K]``: ``cand_logit + codes[cand] · q`` (cand int ``[n_paths, K]``)."""
        return np.asarray(cand_logit, np.float32) + np.einsum("pkr,pr->pk", self.codes[cand], q)

    def close(self) -> None:
        """Free the backend's copy (idempotent)."""
        self._w = None
