"""The DFlash drafter, run by llama.cpp's ``dflash`` architecture from GGUF.

Method: DFlash (block diffusion drafting; docs/design.md §2, §5). The
target's layer-input features of every committed token are projected by
``fc`` + RMSNorm and written straight into each drafter layer's K/V (an
embedding batch, KV injection). A draft is one non-causal pass over
``[last token, MASK × (B-1)]`` at positions ``P .. P+B-1``; the logits of
block position i (i ≥ 1) are the drafter's marginal for the token at P+i.
Token embedding and LM head are the target's, shared through ``ctx_other``.

KV bookkeeping: the drafter cache holds injected features at ``0 .. P-1``
plus, after a draft, the noise block at ``P ..``; ``inject`` (after the target's commit) drops the
noise block and writes the accepted tokens' features; ``defer`` queues a plain step's row for the next
draft's injection. Rows may skip committed tokens (the automatic budget's plain stretches capture no
features): llama.cpp needs consecutive positions in a sequence, so a skipped range is a *hole* that
the drafter's positions close up: every later row, and the block, sits that many positions lower in
the drafter's cache than in the target's (relative positions across the hole shrink, as if the
skipped text were cut out; ``n_injected`` and every ``pos`` argument stay the target's positions).

Top-K per block position (``top_k``, ``draft_chain``) is computed in the
drafter's ggml graph by a backend sampler of our patch API (full-vocabulary
log-softmax, then top-K on the logits' device): only K ids and K log-probs per
row reach the host. The sampler is attached by ``reset`` (the engine's start
of a generation: its scheduler reserve falls on the prefill) or the first
``top_k``, with at least TOP_K candidates; a larger k re-attaches.
``marginals`` copies the full logits instead: it detaches the sampler, and the
next ``top_k`` re-attaches it (a scheduler reserve each time). While attached,
a raw decode of a token block on ``ctx`` does not fill ``ctx.logits``.

A DFlash2 drafter (``selector_top_k`` > 0; z-lab DFlash2) runs the same passes; its graph also
writes the path selector's lattice (``lattice``: the top-K candidates of each block position and
their K × K predecessor → successor scores), which the step walks or builds trees over
(``decode.lattice``).

Graph reuse: each step decodes an injection batch (no outputs) and the block pass (all
outputs) on ``ctx``. llama.cpp reuses a kept graph only if it was the last one its scheduler
allocated, so with one scheduler neither graph is ever reused; the drafter therefore turns on
patch 0010's second scheduler for the graphs without outputs (``native.keep_graphs``): the
block pass's graph is then reused every step, the injection's whenever its row count repeats.
``DFlashDrafter(keep_graphs=False)`` leaves it off (tests compare the two).
"""
from __future__ import annotations

import os

import llama_cpp as lc
import numpy as np

from ..llama import native
from ..llama.model import Context, Model
from .lattice import Lattice
from .verify import Target


def top_k_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` tokens of each row and their log-probabilities, sorted descending: ``[D, k]`` each."""
    x = logits.astype(np.float64)
    lse = x.max(1, keepdims=True)
    lse = lse + np.log(np.exp(x - lse).sum(1, keepdims=True))
    idx = np.argpartition(-x, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(x, idx, 1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(idx, order, 1), np.take_along_axis(vals, order, 1) - lse


#: Fewest candidates per block position the backend top-k sampler is attached with (the
#: engine's default tree_top_k); a larger k re-attaches, a smaller one takes the first columns.
TOP_K = 8


#: the largest block a drafter may declare (published DFlash drafters use 16)
MAX_BLOCK = 256


class DrafterMismatchError(ValueError):
    """The drafter does not fit the target (architecture, width, vocabulary, layers)."""


class DFlashDrafter:
    """A DFlash drafter bound to one target.

    Args:
        path: drafter GGUF (arch ``dflash``).
        target: the Target whose features it reads and whose embeddings/LM head it shares.
        kv_type: drafter KV cache type ("f16", "q8_0").
        keep_graphs: reuse the block pass's graph across steps (a second scheduler for the graphs
            without outputs, see the module doc); False only to compare against.
    Raises:
        DrafterMismatchError: wrong architecture, hidden size, vocabulary or target layers.
    """

    def __init__(self, path: str | os.PathLike, target: Target, kv_type: str = "f16",
                 n_threads: int | None = None, n_gpu_layers: int = -1, keep_graphs: bool = True):
        self.model = Model(path, n_gpu_layers=n_gpu_layers)
        self.target = target
        try:
            self._check_compat()
            name = self.model.path.name
            self.layers = native.model_target_layers(self.model.ptr)
            bad = [il for il in self.layers if not 0 <= il < target.model.n_layer]
            if not self.layers or bad:
                raise DrafterMismatchError(f"drafter {name}: target layers {self.layers} do not fit a "
                                           f"{target.model.n_layer}-layer target")
            self.block_size = int(self.model.meta("dflash.block_size") or 16)
            if not 2 <= self.block_size <= MAX_BLOCK:
                raise DrafterMismatchError(f"drafter {name}: block size {self.block_size} is outside 2..{MAX_BLOCK}")
            self.mask_token = lc.llama_vocab_mask(self.model.vocab)
            if not 0 <= self.mask_token < target.model.n_vocab:
                raise DrafterMismatchError(f"drafter {name}: mask token {self.mask_token} is outside the "
                                           f"target's vocabulary of {target.model.n_vocab}")
            #: DFlash2: candidates per block position of the path selector's lattice (0: a DFlash drafter)
            self.selector_top_k = native.model_selector_top_k(self.model.ptr)
        except Exception:
            self.model.close()
            raise
        n_ub = max(self.block_size, min(target.n_batch, 512))
        self.ctx = Context(self.model, n_ctx=target.n_ctx, n_batch=n_ub, n_ubatch=n_ub, kv_type=kv_type,
                           n_threads=n_threads, ctx_other=target.ctx)
        lc.llama_set_causal_attn(self.ctx.ptr, False)
        if self.selector_top_k:  # every block pass's lattice to the host (K + K² floats a position)
            native.lattice_enable(self.ctx.ptr, True)
        self.keep_graphs = keep_graphs and native.keep_graphs(self.ctx.ptr, True)
        target.set_features(self.layers)
        self._n_injected = 0  # target position after the last injected row
        self._d_end = 0       # drafter position after the last injected row (= n_injected - holes)
        self._holes: list[tuple[int, int]] = []  # (target pos, shift): rows from pos on sit at pos - shift
        self._pending: list[np.ndarray] = []  # deferred feature rows, from position _pending_pos on
        self._pending_pos = 0
        self._sampler = native.TopKAttachment(self.ctx)  # backend top-k over the block rows

    @property
    def _topk(self) -> int | None:
        """k of the attached backend top-k sampler (0: none; None: the backend cannot run it)."""
        return None if self._sampler.unsupported else self._sampler.k

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
    @property
    def n_injected(self) -> int:
        """Target position after the last injected row (deferred rows not counted)."""
        return self._n_injected

    @n_injected.setter
    def n_injected(self, pos: int) -> None:
        """Forget the rows at target positions >= ``pos`` (bookkeeping only: the caller cuts the cache,
        e.g. ``ctx.truncate``; bench/drafts.py rewinds so after its timed passes)."""
        self._rewind(int(pos))

    @property
    def shift(self) -> int:
        """Target position minus drafter position of the next row (the holes' total length so far)."""
        return self._holes[-1][1] if self._holes else 0

    def state_problems(self, n_committed: int) -> list[str]:
        """What is inconsistent in the drafter's cache against a target holding ``n_committed`` tokens
        ([] when nothing): injected or queued rows past the committed ones, cache rows past the injected
        rows and one noise block or short of the injected rows, a position missing below the last (the
        holes of skipped rows are closed up, see the module doc: the drafter's positions are consecutive)."""
        out = []
        if self._n_injected + self.pending > n_committed + 1:
            out.append(f"drafter: {self._n_injected} injected + {self.pending} queued rows, the target "
                       f"holds {n_committed} tokens")
        if self.ctx.pos_max() >= self._d_end + self.block_size:
            out.append(f"drafter: cache holds positions up to {self.ctx.pos_max()}, injected rows end "
                       f"at {self._d_end} (block {self.block_size})")
        elif self.ctx.pos_max() < self._d_end - 1:
            out.append(f"drafter: cache holds positions up to {self.ctx.pos_max()}, short of its "
                       f"{self._d_end} injected rows")
        return out + self.ctx.hole_problems("drafter")

    def _rewind(self, pos: int) -> None:
        if pos < self._n_injected:
            self._holes = [(t, s) for t, s in self._holes if t < pos]
            self._d_end = min(self._d_end, max(pos - self.shift, 0))
            self._n_injected = pos

    def _cut(self, pos: int) -> None:
        """Drop the rows at target positions >= ``pos`` and the noise block from the cache."""
        self._rewind(pos)
        self.ctx.truncate(self._d_end)

    def reset(self) -> None:
        """Empty the drafter's KV cache, and attach the backend top-k sampler (TOP_K) if it is not:
        its scheduler reserve then falls on the coming prefill instead of a (timed) draft."""
        self.ctx.clear()
        self._n_injected = self._d_end = self._pending_pos = 0
        self._holes = []
        self._pending = []
        self._ensure_topk(TOP_K)

    @property
    def rows_in_place(self) -> int:
        """How many leading target positions ``0 .. n - 1`` the drafter holds the features of at their own
        positions: up to its first hole (module doc), else every injected row and the queued rows that
        continue them (``defer``). What a prompt cache can keep of the drafter (``keep``)."""
        if self._holes:
            pos, shift = self._holes[0]
            return pos - shift
        if self._pending and self._pending_pos == self._n_injected:
            return self._n_injected + self.pending
        return self._n_injected

    def can_keep(self, pos: int) -> bool:
        """Whether ``keep(pos)`` leaves a cache that continues at ``pos`` as one injected from position 0
        does: ``pos <= rows_in_place``, and the cells a row at ``pos`` attends to still held (a sliding
        window: ``Context.resumable_at``; queued rows, which ``keep`` injects first, judged where they start)."""
        return 0 <= pos <= self.rows_in_place and self.ctx.resumable_at(min(int(pos), self._n_injected))

    def keep(self, pos: int) -> None:
        """Keep the rows of target positions ``0 .. pos - 1`` and drop the rest: later rows, the noise block
        and the queued rows (the queue is injected first when it starts below ``pos``, so that its rows
        count); ``pos`` 0 empties the cache as ``reset`` does. Attaches the backend top-k sampler as
        ``reset`` does. For the prompt cache: the rows kept are the features of the target's tokens at
        those positions. Raises ValueError when ``pos`` exceeds ``rows_in_place`` (after that injection)."""
        pos = int(pos)
        if self._pending and self._pending_pos < pos:
            self.flush()
        if not 0 <= pos <= self.rows_in_place:
            raise ValueError(f"the drafter holds {self.rows_in_place} rows in place, cannot keep {pos}")
        if pos == 0:
            self.reset()
            return
        self._pending = []
        self._cut(pos)
        self._ensure_topk(TOP_K)

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Write features ``[n, n_layers * n_embd]`` of committed tokens at ``pos0 ..`` into the KV cache
        (after any deferred rows, see :meth:`defer`). ``pos0`` past ``n_injected`` leaves a hole (see the
        module doc); before it, the rows from ``pos0`` on are replaced."""
        self.flush()
        self._write(features, pos0)

    def defer(self, features: np.ndarray, pos0: int) -> None:
        """Queue features ``[n, n_layers * n_embd]`` of committed tokens at ``pos0 ..`` for the next draft.

        For the plain steps of the automatic budget: one token each, whose injection would cost a
        drafter pass per token (1.3 ms on the 2-core CPU; on the H200 it made the auto mode 16%
        slower than plain decoding). Queued rows go in with one batched pass when drafting
        resumes (:meth:`flush`, called by every draft), or never when generation ends first.
        Rows that do not continue the queue, or more than 512 of them, flush it first; rows before
        ``n_injected`` cut the cache back to ``pos0`` (a rewind), rows after it leave a hole.
        """
        end = self._pending_pos + sum(len(f) for f in self._pending)
        if self._pending and (pos0 != end or end - self._pending_pos >= 512):
            self.flush()
        if pos0 < self._n_injected:
            self._cut(pos0)
        if not self._pending:
            self._pending_pos = pos0
        self._pending.append(np.asarray(features, dtype=np.float32))

    @property
    def pending(self) -> int:
        """Rows queued by :meth:`defer`, not injected yet."""
        return sum(len(f) for f in self._pending)

    def flush(self) -> None:
        """Inject the rows queued by :meth:`defer` (a no-op when none are)."""
        if self._pending:
            rows, self._pending = np.concatenate(self._pending), []
            self._write(rows, self._pending_pos)

    def _write(self, features: np.ndarray, pos0: int) -> None:
        self._cut(pos0)  # drop the noise block (and anything stale) first
        shift = pos0 - self._d_end  # > self.shift: rows were skipped since the last one (a hole)
        if shift != self.shift:
            self._holes.append((pos0, shift))
        for s in range(0, features.shape[0], self.ctx.n_ubatch):
            self.ctx.decode_embd(features[s:s + self.ctx.n_ubatch], self._d_end + s)
        self._d_end += features.shape[0]
        self._n_injected = pos0 + features.shape[0]

    # -- drafting ------------------------------------------------------------------------
    def _check_n_draft(self, n_draft: int) -> None:
        if not 0 < n_draft < self.block_size:
            raise ValueError(f"n_draft must be in 1..{self.block_size - 1}, got {n_draft}")

    def _decode_block(self, last_token: int, pos: int, n_draft: int) -> None:
        """One pass over ``[last_token, MASK × n_draft]`` at ``pos ..``, every row an output."""
        self.flush()
        self._cut(pos)  # the block right after the injected rows: a hole before it closes up
        # llama.cpp's dflash graph emits logits for every block row whatever the output flags
        # (as upstream's common/speculative.cpp reads them), and backend samplers take output
        # row i from logits row i: mark all rows, read rows 1.. .
        self.ctx.decode_tokens([last_token] + [self.mask_token] * n_draft, self._d_end, "all")

    def _ensure_topk(self, k: int) -> bool:
        """Attach the backend top-k sampler with at least ``k`` (and TOP_K) candidates per row.

        Returns False when the backend cannot run it (remembered: the host path from then on).
        """
        if not self._sampler.unsupported and self._sampler.k < k:
            k = min(max(k, TOP_K), self.model.n_vocab)
        return self._sampler.ensure(k, self.block_size)

    def _detach_topk(self) -> None:
        """Detach the backend top-k sampler: the next block's full logits are copied to the host."""
        self._sampler.detach()

    def marginals(self, last_token: int, pos: int, n_draft: int) -> np.ndarray:
        """One pass over ``[last_token, MASK × n_draft]`` at ``pos ..``; logits ``[n_draft, n_vocab]``.

        Row i is the drafter's marginal for the token at ``pos + 1 + i``. The full logits
        are copied to the host (the backend top-k sampler is detached first).
        Raises ValueError when ``n_draft`` exceeds block_size - 1.
        """
        self._check_n_draft(n_draft)
        self._detach_topk()
        self._decode_block(last_token, pos, n_draft)
        return self.ctx.logits(n_draft + 1)[1:]

    def top_k(self, last_token: int, pos: int, n_draft: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """One pass as ``marginals``; the ``k`` most likely tokens of each block position.

        Returns ``cand`` int64 ``[n_draft, k]`` and ``logp`` float64 ``[n_draft, k]`` (log-softmax
        over the full vocabulary), rows = block positions 1..n_draft, each sorted by descending
        log-prob. Computed on the drafter's backend (only k ids + k log-probs per row reach the
        host); on a backend that cannot run the ops, from ``marginals`` on the host.
        Raises ValueError for ``k`` outside 1..n_vocab or ``n_draft`` outside 1..block_size-1.
        """
        if not 1 <= k <= self.model.n_vocab:
            raise ValueError(f"k must be in 1..{self.model.n_vocab}, got {k}")
        self._check_n_draft(n_draft)
        if not self._ensure_topk(k):
            return top_k_logprobs(self.marginals(last_token, pos, n_draft), k)
        self._decode_block(last_token, pos, n_draft)
        ids, logp = native.topk_get(self.ctx.ptr, 1, n_draft, self._topk)
        return ids[:, :k].astype(np.int64), logp[:, :k].astype(np.float64)

    def top_k_hidden(self, last_token: int, pos: int, n_draft: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``top_k`` and the drafter's hidden states of block positions 1..n_draft after its final norm,
        float32 ``[n_draft, n_embd]`` (the Weaver's prefix, TfM)."""
        self.flush()  # deferred rows first, without hidden states kept
        self.ctx.set_embeddings(True)
        try:
            cand, logp = self.top_k(last_token, pos, n_draft, k)
            hidden = self.ctx.embeddings(n_draft + 1)[1:].copy()
        finally:
            self.ctx.set_embeddings(False)
        return cand, logp, hidden

    def lattice(self, last_token: int, pos: int, n_draft: int) -> Lattice:
        """A DFlash2 drafter's pass as ``marginals``; its path selector's lattice over block positions
        1..n_draft (``decode.lattice``): the top-K candidates of each position and their K × K scores.
        Raises ValueError for a DFlash drafter or ``n_draft`` outside 1..block_size-1."""
        if not self.selector_top_k:
            raise ValueError(f"drafter {self.model.path.name} is not a DFlash2 drafter (no path selector)")
        self._check_n_draft(n_draft)
        self._decode_block(last_token, pos, n_draft)
        cand, scores = native.lattice_rows(self.ctx.ptr, 1, n_draft, self.model.n_embd, self.selector_top_k)
        return Lattice(cand, scores)

    def draft_chain(self, last_token: int, pos: int, n_draft: int) -> list[int]:
        """Greedy chain of ``n_draft`` tokens: the most likely token of each block position (``top_k``, k = 1)."""
        return [int(i) for i in self.top_k(last_token, pos, n_draft, 1)[0][:, 0]]

    def close(self) -> None:
        """Free the context and model (idempotent)."""
        if self.ctx.ptr:
            self._detach_topk()  # llama.cpp keeps a pointer to the sampler
        self.ctx.close()
        self.model.close()
