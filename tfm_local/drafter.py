"""The DFlash drafter, run by llama.cpp's ``dflash`` architecture from GGUF.

Method: DFlash (block diffusion drafting; shared/DESIGN.md §2, §5). The
target's layer-input features of every committed token are projected by
``fc`` + RMSNorm and written straight into each drafter layer's K/V (an
embedding batch, KV injection). A draft is one non-causal pass over
``[last token, MASK × (B-1)]`` at positions ``P .. P+B-1``; the logits of
block position i (i ≥ 1) are the drafter's marginal for the token at P+i.
Token embedding and LM head are the target's, shared through ``ctx_other``.

KV bookkeeping: the drafter cache holds injected features at ``0 .. P-1``
plus, after a draft, the noise block at ``P ..``; ``commit`` drops the noise
block and injects the accepted tokens' features.
"""
from __future__ import annotations

import os

import llama_cpp as lc
import numpy as np

from . import native
from .llm import Context, Model
from .target import Target


class DrafterMismatchError(ValueError):
    """The drafter does not fit the target (architecture, width, vocabulary, layers)."""


class DFlashDrafter:
    """A DFlash drafter bound to one target.

    Args:
        path: drafter GGUF (arch ``dflash``).
        target: the Target whose features it reads and whose embeddings/LM head it shares.
        kv_type: drafter KV cache type ("f16", "q8_0").
    Raises:
        DrafterMismatchError: wrong architecture, hidden size, vocabulary or target layers.
    """

    def __init__(self, path: str | os.PathLike, target: Target, kv_type: str = "f16",
                 n_threads: int | None = None, n_gpu_layers: int = -1):
        self.model = Model(path, n_gpu_layers=n_gpu_layers)
        self.target = target
        self._check_compat()
        self.layers = native.model_target_layers(self.model.ptr)
        bad = [il for il in self.layers if not 0 <= il < target.model.n_layer]
        if not self.layers or bad:
            raise DrafterMismatchError(f"drafter target layers {self.layers} do not fit a "
                                       f"{target.model.n_layer}-layer target")
        self.block_size = int(self.model.meta("dflash.block_size") or 16)
        self.mask_token = lc.llama_vocab_mask(self.model.vocab)
        if not 0 <= self.mask_token < target.model.n_vocab:
            raise DrafterMismatchError(f"drafter mask token {self.mask_token} is outside the vocabulary")
        n_ub = max(self.block_size, min(target.n_batch, 512))
        self.ctx = Context(self.model, n_ctx=target.n_ctx, n_batch=n_ub, n_ubatch=n_ub, kv_type=kv_type,
                           n_threads=n_threads, ctx_other=target.ctx)
        lc.llama_set_causal_attn(self.ctx.ptr, False)
        target.set_features(self.layers)
        self.n_injected = 0

    def _check_compat(self) -> None:
        m, t = self.model, self.target.model
        problems = []
        if m.arch != "dflash":
            problems.append(f"architecture is {m.arch!r}, not 'dflash'")
        if m.n_embd != t.n_embd:
            problems.append(f"hidden size {m.n_embd} != target's {t.n_embd}")
        if m.n_vocab != t.n_vocab:
            problems.append(f"vocabulary size {m.n_vocab} != target's {t.n_vocab}")
        else:
            ids = np.linspace(0, t.n_vocab - 1, num=min(257, t.n_vocab), dtype=int)
            diff = [int(i) for i in ids if lc.llama_vocab_get_text(m.vocab, int(i)) !=
                    lc.llama_vocab_get_text(t.vocab, int(i))]
            if diff:
                problems.append(f"vocabulary differs from the target's (e.g. token {diff[0]})")
        if problems:
            raise DrafterMismatchError(f"drafter {m.path.name} does not match target {t.path.name}: "
                                       + "; ".join(problems))

    # -- KV injection --------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the drafter's KV cache."""
        self.ctx.clear()
        self.n_injected = 0

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Write features ``[n, n_layers * n_embd]`` of committed tokens at ``pos0 ..`` into the KV cache."""
        self.ctx.truncate(pos0)  # drop the noise block (and anything stale) first
        for s in range(0, features.shape[0], self.ctx.n_ubatch):
            self.ctx.decode_embd(features[s:s + self.ctx.n_ubatch], pos0 + s)
        self.n_injected = pos0 + features.shape[0]

    # -- drafting ------------------------------------------------------------------------
    def marginals(self, last_token: int, pos: int, n_draft: int) -> np.ndarray:
        """One pass over ``[last_token, MASK × n_draft]`` at ``pos ..``; logits ``[n_draft, n_vocab]``.

        Row i is the drafter's marginal for the token at ``pos + 1 + i``.
        Raises ValueError when ``n_draft`` exceeds block_size - 1.
        """
        if not 0 < n_draft < self.block_size:
            raise ValueError(f"n_draft must be in 1..{self.block_size - 1}, got {n_draft}")
        self.ctx.truncate(pos)
        # llama.cpp's dflash graph emits logits for every block row whatever the output
        # flags (as upstream's common/speculative.cpp reads them): take all, drop row 0.
        self.ctx.decode_tokens([last_token] + [self.mask_token] * n_draft, pos, "all")
        return self.ctx.logits(n_draft + 1)[1:]

    def draft_chain(self, last_token: int, pos: int, n_draft: int) -> list[int]:
        """Greedy chain of ``n_draft`` tokens: the argmax of each block position's marginal."""
        return [int(i) for i in np.argmax(self.marginals(last_token, pos, n_draft), axis=1)]

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
