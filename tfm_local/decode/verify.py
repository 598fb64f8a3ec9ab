"""The verify stage: the target's prefill, one-pass verification of a draft tree, commit, features.

The target's KV cache always holds the committed tokens at positions ``0 .. n_past-1``; the last
emitted token is not yet in it (it is the root of the next verification). ``Target.verify`` decodes a
tree of N nodes (node 0 the root, a chain is the chain-shaped tree) in one pass, node i at position
``n_past + depth[i]`` attending to the committed cache and its own ancestors, and returns the target's
output per node (a ``Verdict``: logits rows on the host, or each node's token chosen in the graph:
the argmax, or a draw of the processed distribution keyed by the position it is drawn for).
``Target.commit`` keeps the accepted root-to-node path and frees the other nodes' cells. A chain on a
target whose cache can be cut back by position is decoded as a plain causal batch and committed with
``seq_rm``; any other tree in our tree mode (patches: tree mask in the KV cache; Gated-DeltaNet tree ops
with a deferred state commit for hybrids). Facts and sources: docs/design.md §1 and §3.
"""
from __future__ import annotations

import os
from typing import Callable

import llama_cpp as lc
import numpy as np

from ..files.dflash import FEATURE_ARCHS
from ..llama import native
from ..llama.model import Context, LlamaError, Model, gguf_architecture
from ..llama.tokenizer import Tokenizer
from ..lossless import SMALL_BATCH_ROWS, small_batch_exact
from .verdict import NodeRows, Verdict, check_tree


# Gated-DeltaNet hybrids: their recurrent state cannot be cut back to a position, so a draft is
# verified in tree mode (patch 0006, a chain is a chain-shaped tree) and committed by tree_commit.
RECURRENT_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})


MIN_CTX = 32


def _nothing() -> None:
    """The default ``on_submit`` hook of ``Target.verify``."""


class ContextOverflowError(ValueError):
    """The prompt (plus at least one new token) does not fit in the context."""


def _drafter_as_target(path) -> LlamaError:
    return LlamaError(f"{path} is a DFlash drafter, not a target: give it as the drafter, next to its target")


class Target:
    """A target model and its context.

    Args:
        path: GGUF file of the target.
        n_ctx: context length (tokens). n_batch: prefill chunk (tokens).
        kv_type: KV cache type ("f16", "q8_0").
        n_gpu_layers: layers offloaded when a GPU backend exists (-1 = all).
        exact_prefill: prefill in passes of at most ``lossless.SMALL_BATCH_ROWS`` rows where those are
            exact (``prefill_rows``); False = in chunks of n_batch.
    """

    def __init__(self, path: str | os.PathLike, n_ctx: int = 4096, n_batch: int = 512,
                 kv_type: str = "f16", n_threads: int | None = None, n_gpu_layers: int = -1,
                 exact_prefill: bool = True):
        if not isinstance(n_ctx, int) or n_ctx < MIN_CTX:
            raise ValueError(f"n_ctx must be an integer >= {MIN_CTX}, got {n_ctx!r}")
        n_batch = min(n_batch, n_ctx)
        try:
            self.model = Model(path, n_gpu_layers=n_gpu_layers)
        except LlamaError:
            if gguf_architecture(path) == "dflash":  # a drafter without vocabulary does not load at all
                raise _drafter_as_target(path) from None
            raise
        if self.model.arch == "dflash":
            self.model.close()
            raise _drafter_as_target(path)
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           kv_type=kv_type, n_threads=n_threads)
        self.tok = Tokenizer(self.model)
        self.n_ctx = min(n_ctx, self.ctx.n_ctx)  # llama.cpp may round up; the batch limit follows the request
        self.n_batch = n_batch
        #: rows per prefill pass: ``lossless.SMALL_BATCH_ROWS`` where such passes give every row a 1-token
        #: pass's bits (``lossless.small_batch_exact``; ``exact_prefill``), so that the cache is the same
        #: however a conversation was split into prompts, prefills and verifications (the prompt cache
        #: then equals a cold prefill bit for bit); else n_batch. Set it to n_batch for the fastest
        #: prefill of long prompts (about 18% faster at 1,700 tokens on a 2-core CPU, docs/prompt-cache.md).
        self.prefill_rows = min(n_batch, SMALL_BATCH_ROWS) if exact_prefill and small_batch_exact(self.model) \
            else n_batch
        self.feature_layers: list[int] = []
        self.n_past = 0
        #: False for a recurrent (hybrid) target: a plainly decoded batch can then only be committed whole,
        #: and its chains are verified in tree mode so that a prefix of them can be committed.
        self.can_truncate = self.model.arch not in RECURRENT_ARCHS
        #: True for a target with a recurrent state (a recurrent or hybrid model: Mamba, Gated DeltaNet,
        #: LFM2's convolutions): its cache cannot be cut back to an earlier position (``prefill``'s ``keep``)
        self.recurrent = bool(lc.llama_model_is_recurrent(self.model.ptr) or lc.llama_model_is_hybrid(self.model.ptr))
        # the backend's choice per output row: the top-1 sampler (``attach_argmax``) or the token sampler
        # (``attach_sampler``); at most one is attached (they share sequence 0)
        self._argmax = native.TopKAttachment(self.ctx)
        self._draw = native.SampleAttachment(self.ctx)
        self._rows_high = 1  # the most rows a backend chooser was attached with (``_choice_rows``)
        # the last verified tree, until committed: node -> batch row, parents, decoded in tree mode
        self._row: np.ndarray = np.zeros(0, np.int64)
        self._parents: np.ndarray | None = None
        self._tree_mode = False
        self._hidden = False  # final hidden states kept (set_final_hidden)

    # -- features ------------------------------------------------------------------------
    def set_features(self, layers: list[int]) -> None:
        """Extract the inputs of exactly ``layers`` (0..n_layer-1) on every following decode ([] = none).

        Raises ValueError for a layer index outside the target, or a target
        architecture whose graph does not expose layer inputs (FEATURE_ARCHS).
        """
        if layers and self.model.arch not in FEATURE_ARCHS:
            raise ValueError(f"target architecture {self.model.arch!r} does not expose layer features "
                             f"in this build; DFlash drafting supports {sorted(FEATURE_ARCHS)}")
        bad = [il for il in layers if not 0 <= il < self.model.n_layer]
        if bad:
            raise ValueError(f"target layers {bad} out of range for a {self.model.n_layer}-layer target")
        for il in set(self.feature_layers) - set(layers):
            native.set_layer_inp(self.ctx.ptr, il, False)
        for il in layers:
            native.set_layer_inp(self.ctx.ptr, il, True)
        self.feature_layers = list(layers)

    def features(self, rows: np.ndarray | slice, n_tokens: int) -> np.ndarray:
        """Concatenated layer inputs ``[len(rows), n_layers * n_embd]`` float32 of the last batch."""
        parts = [native.get_layer_inp(self.ctx.ptr, il, n_tokens, self.model.n_embd)[rows]
                 for il in self.feature_layers]
        return np.concatenate(parts, axis=1)

    # -- decoding ------------------------------------------------------------------------
    def check_fits(self, n_prompt: int) -> None:
        """Raise ContextOverflowError unless a prompt of ``n_prompt`` tokens leaves room to generate."""
        if n_prompt + 1 > self.n_ctx:
            raise ContextOverflowError(
                f"prompt is {n_prompt} tokens; the context holds {self.n_ctx} (prompt + at least 1 new token). "
                "Shorten the prompt or raise n_ctx.")

    def reset(self) -> None:
        """Empty the KV cache (and forget an uncommitted verification)."""
        self.ctx.clear()
        self.n_past = 0
        self._parents = None

    def rewind(self, n: int) -> None:
        """Keep only the first ``n`` committed tokens: the KV cache is cut back to positions ``0 .. n-1``
        and ``n_past`` becomes ``n`` (no change when ``n >= n_past``). Raises ValueError for a negative
        ``n``, an uncommitted verification (``commit`` first), or a target that cannot cut its cache
        back by position (``can_truncate`` False: a recurrent hybrid) when ``n < n_past``."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"rewind takes a token count >= 0, got {n!r}")
        if self._parents is not None:
            raise ValueError("the last verification is not committed: call commit(path) before rewind")
        if n < self.n_past:
            if not self.can_truncate:
                raise ValueError(f"a {self.model.arch} target cannot cut its cache back by position")
            self.ctx.truncate(int(n))
            self.n_past = int(n)

    def prefill(self, tokens: list[int], on_chunk=None, keep: int = 0) -> np.ndarray:
        """Decode ``tokens`` from position ``keep`` in chunks of n_batch; returns the last row's logits
        ``[n_vocab]`` float32 (a view). Detaches the backend's chooser first (``detach_choice``).

        ``keep``: how many leading tokens the cache already holds (the prompt cache: they must be
        ``tokens[:keep]``, which the caller knows; the cache is cut back to them first). 0 = from an empty
        cache. ``on_chunk(pos0, n)`` is called after each chunk, while its features are readable.
        Raises ValueError for a ``keep`` outside ``0 .. min(n_past, len(tokens) - 1)``, or below
        ``n_past`` on a target whose cache cannot be cut back (``recurrent``).
        """
        self.detach_choice()
        self._prefill(tokens, on_chunk, keep)
        return self.ctx.logits(1)[0]

    def prefill_choice(self, tokens: list[int], on_chunk=None, keep: int = 0) -> int:
        """``prefill`` with the backend's chooser (``attach_argmax`` or ``attach_sampler``): returns the
        token chosen after the last prompt token (its argmax, or the draw for position ``len(tokens)``).
        Raises RuntimeError when no backend chooser is attached."""
        self._check_choice(1)
        if self._draw.params is not None:
            native.sample_set_positions(self.ctx.ptr, np.array([len(tokens)]))
        n = self._prefill(tokens, on_chunk, keep)
        if self._draw.params is not None:
            return int(native.sample_get(self.ctx.ptr, 0, 1)[0][0])  # the chunk's one output row
        return int(self._read_choice(n - 1, 1)[0])

    def _keep(self, keep: int, n_tokens: int) -> None:
        """Cut the cache back to its first ``keep`` tokens (empty it for 0); see ``prefill``."""
        if keep == 0:
            self.reset()
            return
        if not 0 < keep < n_tokens or keep > self.n_past:
            raise ValueError(f"keep must be in 0..{min(self.n_past, n_tokens - 1)} (the cache holds {self.n_past} "
                             f"tokens, the prompt {n_tokens}), got {keep}")
        if keep < self.n_past:
            if self.recurrent:
                raise ValueError(f"a {self.model.arch} target cannot cut its cache back from {self.n_past} "
                                 f"to {keep} tokens (a recurrent state)")
            self.ctx.truncate(keep)
        self.n_past = keep
        self._parents = None

    def _prefill(self, tokens: list[int], on_chunk, keep: int = 0) -> int:
        """Decode the chunks from ``keep`` on (last row of each an output); returns the last chunk's length."""
        if len(tokens) == 0:
            raise ValueError("nothing to prefill (no tokens)")
        self.check_fits(len(tokens))
        self._keep(int(keep), len(tokens))
        if self._hidden:  # while kept, every token of a batch is an output: not for the prompt
            self.ctx.set_embeddings(False)
        try:
            step = self.prefill_rows
            for s in range(keep, len(tokens), step):
                chunk = tokens[s:s + step]
                self.ctx.decode_tokens(chunk, s, "last")
                if on_chunk is not None:
                    on_chunk(s, len(chunk))
        finally:
            if self._hidden:
                self.ctx.set_embeddings(True)
        self.n_past = len(tokens)
        return len(chunk)

    def set_final_hidden(self, on: bool) -> None:
        """Keep the final hidden state (after the output norm) of every verified node from now on, for
        ``final_hidden`` (the Weaver's prefix, TfM); the prompt's are never kept."""
        self._hidden = bool(on)
        self.ctx.set_embeddings(self._hidden)

    def final_hidden(self, node: int) -> np.ndarray:
        """float32 ``[n_embd]`` copy of node ``node``'s final hidden state in the last verification.
        Raises RuntimeError when ``set_final_hidden`` is off."""
        if not self._hidden:
            raise RuntimeError("final hidden states are not kept: set_final_hidden(True) first")
        row = int(self.rows([node])[0])
        return self.ctx.embeddings(row + 1)[row].copy()

    def verify(self, tokens, parents=None, depth=None, *, backend_choice: bool = False,
               on_submit: Callable[[], None] = _nothing) -> "Verdict":
        """Verify a draft tree of N nodes in one target pass; the target's output per node.

        Args:
            tokens: int ``[N]``; ``tokens[0]`` is the root (the last emitted token, not yet in the cache).
            parents: int ``[N]`` in topological order (``-1 <= parents[i] < i``, ``parents[0] = -1``);
                None = the chain ``[-1, 0, 1, ...]`` as a plain causal batch (see below).
            depth: int ``[N]``, each node's parent's + 1 (root 0); None = computed from ``parents``.
            backend_choice: read each node's token chosen in the target's graph by the attached chooser
                (``attach_argmax``: its argmax; ``attach_sampler``: its draw for position
                ``n_past + depth + 1``) instead of its logits; otherwise the chooser is detached.
            on_submit: called once the decode call has returned, before the results are read (on a GPU
                the pass may still be running then: the submit / verify time split).
        Returns:
            a ``Verdict`` in node order: ``logits`` ``[N, n_vocab]`` float32 rows (views valid until the
            next decode) or ``ids`` int32 ``[N]``, and ``draw_pos``.
        Raises:
            ValueError: a malformed tree, more nodes than one batch (or than the chooser's rows);
            ContextOverflowError: the tree runs past the context; RuntimeError: ``backend_choice``
            without an attached chooser.

        Node i is decoded at ``n_past + depth[i]``. The nodes go to llama.cpp as a plain causal batch when
        ``parents`` is None, or when the tree is a chain and the target can cut its cache back by position
        (``can_truncate``) or it is the root alone; otherwise in tree mode (a recurrent hybrid's chain too,
        so that a prefix of it can be committed). llama.cpp needs non-decreasing positions in a batch, so
        a tree's nodes are submitted sorted by depth (stable: parents stay before children) and the rows
        mapped back.
        """
        if self._parents is not None:
            raise ValueError("the last verification is not committed: call commit(path) first "
                             "(commit([]) keeps none of it)")
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"verify needs a non-empty 1-d array of integer token ids, got {tokens.dtype} "
                             f"of shape {tokens.shape}")
        n = len(tokens)
        plain = parents is None
        chain_parents = np.arange(-1, n - 1)
        par = chain_parents if plain else np.asarray(parents)
        chain = plain or (np.issubdtype(par.dtype, np.integer) and np.array_equal(par, chain_parents))
        if chain and (depth is None or np.array_equal(depth, chain_parents + 1)):
            parents, depth = chain_parents, chain_parents + 1  # a chain is a well-formed tree: nothing to check
        else:
            parents, depth = check_tree(par, depth, n)
        if backend_choice:
            self._check_choice(n)
        else:
            self.detach_choice()
        draw_pos = self.n_past + depth + 1
        if plain or chain and (self.can_truncate or n == 1):
            if self.n_past + n > self.n_ctx:
                raise ContextOverflowError(f"context full ({self.n_ctx} tokens)")
            if backend_choice and self._draw.params is not None:
                native.sample_set_positions(self.ctx.ptr, draw_pos)
            self.ctx.decode_tokens(tokens.tolist(), self.n_past, "all")
            self._row, self._parents, self._tree_mode = np.arange(n), parents, False
        else:
            self._decode_tree(tokens, depth, parents, backend_choice and self._draw.params is not None)
        on_submit()
        if backend_choice:
            return Verdict(ids=self._read_choice(0, n)[self._row], draw_pos=draw_pos)
        logits = self.ctx.logits(n)
        return Verdict(logits=logits if not self._tree_mode else NodeRows(logits, self._row), draw_pos=draw_pos)

    def _decode_tree(self, tokens, depth, parents, draws: bool = False) -> None:
        """The tree-mode batch of ``verify`` (sets ``_row``: node -> batch row); ``draws``: give the
        attached token sampler each row's draw position."""
        n = len(tokens)
        if self.n_past + int(depth.max()) + 1 > self.n_ctx:
            raise ContextOverflowError(f"context full ({self.n_ctx} tokens)")
        if n > self.n_batch:
            raise ValueError(f"a tree of {n} nodes exceeds the batch size {self.n_batch}")
        order = np.argsort(depth, kind="stable")      # batch row -> node
        row = np.empty(n, np.int64)
        row[order] = np.arange(n)                      # node -> batch row
        par = np.where(parents[order] < 0, -1, row[np.maximum(parents[order], 0)])
        if draws:
            native.sample_set_positions(self.ctx.ptr, self.n_past + np.asarray(depth)[order] + 1)
        native.tree_set(self.ctx.ptr, par)
        try:
            self.ctx.decode_tokens(np.asarray(tokens)[order], self.n_past, "all",
                                   positions=self.n_past + np.asarray(depth)[order])
        except Exception:
            native.tree_set(self.ctx.ptr, None)
            raise
        self._row, self._parents, self._tree_mode = row, parents, True

    # -- the backend's choice (verification without logits on the host) ---------------------
    @property
    def choice_rows(self) -> int | None:
        """Output rows per batch of the attached backend chooser (``attach_argmax`` / ``attach_sampler``);
        0 = none attached (raw logits are copied to the host)."""
        return self._argmax.n_rows or self._draw.n_rows

    @property
    def argmax_rows(self) -> int | None:
        """Output rows per batch of the attached backend top-1 sampler (``attach_argmax``); 0 = none
        attached, None = the backend cannot run it."""
        return None if self._argmax.unsupported else self._argmax.n_rows

    def attach_argmax(self, n_rows: int) -> bool:
        """Compute each output row's argmax in the ggml graph (``native.topk_attach`` with k = 1)
        for batches of up to ``n_rows`` output rows, so that ``prefill_choice`` and
        ``verify(backend_choice=True)`` copy one int per row instead of ``n_vocab`` floats.

        Attaches for the most rows any chooser of this target was attached with (``_choice_rows``) and
        re-attaches (a scheduler reserve at the next decode) only when ``n_rows`` exceeds that limit; a
        smaller request keeps it. Replaces an attached token sampler. Returns False
        when the backend cannot run the sampler (remembered; read logits instead). Raises ValueError for
        ``n_rows`` outside 1..n_batch.

        The graph takes an argmax (``ggml_argmax``) per row and nothing over the full row besides.
        Exactly tied logits: the CPU backend's argmax returns the highest id (ggml_vec_argmax_f32),
        np.argmax and CUDA's (patch 0007, vocabulary-long rows) the lowest. The engine uses one rule for plain and
        speculative decoding in a generation, and a near-tie is checked as such (tfm_local.lossless).
        """
        self._check_rows(n_rows)
        self._draw.forget()  # the top-k attach below replaces an attached token sampler
        return self._argmax.ensure(1, self._choice_rows(n_rows))

    def attach_sampler(self, sp, seed: int, n_rows: int) -> bool:
        """Draw each output row's token in the ggml graph (patch 0011's ggml_sample_tokens through
        ``native.sample_attach``) from the processed distribution of ``sp`` (a sampling.SamplingParams
        with temperature > 0) with the keys ``sampling.draw_key(seed, position)``, for batches of up to
        ``n_rows`` output rows: ``prefill_choice`` and ``verify(backend_choice=True)`` then copy one int
        per row. The draw is ``sampling.sample_row`` computed in the graph. Replaces an attached argmax;
        re-attaches only when the settings change or more rows are needed (``_choice_rows``); a new seed
        alone is set in place (``native.sample_set_seed``, no scheduler reserve). Returns False when the
        backend cannot run the op (remembered; sample on the host instead). Raises ValueError for
        ``n_rows`` outside 1..n_batch or a greedy ``sp``.
        """
        if sp.greedy:
            raise ValueError("attach_sampler needs a temperature > 0 (greedy decoding: attach_argmax)")
        self._check_rows(n_rows)
        if self._draw.unsupported:  # refused before: raw logits (an attached argmax would keep them from
            self._argmax.detach()   # being copied: the host would read stale ones)
            return False
        self._argmax.forget()  # the sample attach below replaces an attached argmax
        top_k = min(int(sp.top_k), self.model.n_vocab)  # at least the vocabulary: off (and an int32)
        return self._draw.ensure((float(sp.temperature), top_k, float(sp.top_p), float(sp.min_p),
                                  int(seed) % 2 ** 64), self._choice_rows(n_rows))

    def _choice_rows(self, n_rows: int) -> int:
        """The rows to attach a backend chooser with for ``n_rows``: the most any chooser of this target
        was attached with so far. Each re-attach costs llama.cpp a scheduler reserve at the next decode
        (~8 ms on the H200), and the argmax and the token sampler replace each other: with the limit
        each asked for, a greedy request after a sampled one (or a plain one after a tree) attached with
        fewer rows than the next tree needed, and that tree's prefill paid a second reserve."""
        self._rows_high = max(self._rows_high, int(n_rows))
        return self._rows_high

    def _check_rows(self, n_rows: int) -> None:
        if not 1 <= n_rows <= self.n_batch:
            raise ValueError(f"backend choice rows must be in 1..{self.n_batch} (the batch size), got {n_rows}")

    def detach_choice(self) -> None:
        """Detach the backend's chooser (a no-op when none is attached): raw logits are copied again."""
        self._argmax.detach()
        self._draw.detach()

    def _check_choice(self, n_rows: int) -> None:
        if not self.choice_rows:
            raise RuntimeError("no backend chooser is attached: call attach_argmax or attach_sampler first "
                               "(or verify without backend_choice)")
        if n_rows > self.choice_rows:
            raise ValueError(f"a batch of {n_rows} output rows exceeds the backend chooser's limit of "
                             f"{self.choice_rows}: attach it with {n_rows} rows first")

    def _read_choice(self, i0: int, n: int) -> np.ndarray:
        """The backend's choices for batch rows ``i0 .. i0+n-1`` of a batch whose rows are all outputs."""
        if self._draw.params is not None:
            return native.sample_get(self.ctx.ptr, i0, n)[0]
        return native.topk_get(self.ctx.ptr, i0, n, 1)[0][:, 0]

    def rows(self, nodes) -> np.ndarray:
        """Batch rows of the last verified tree's ``nodes`` (for ``features``), int64 ``[len(nodes)]``."""
        return self._row[np.asarray(nodes, dtype=np.int64)]

    def commit(self, path) -> None:
        """Keep the root-to-node ``path`` (node indices, root first; empty = nothing accepted) of the last
        ``verify`` in the KV cache and free the other nodes' cells; ``n_past`` grows by ``len(path)``.

        Raises ValueError, before anything is committed, when nothing was verified since the last commit,
        when ``path`` is not a root-to-node path of the last tree (the native tree commit would drop the
        tree on such a path and leave a hybrid's context unusable), or when a target that cannot cut its
        cache back (``can_truncate`` False: a recurrent hybrid) would drop tokens of a plainly decoded chain.
        """
        par = self._parents
        if par is None:
            raise ValueError("nothing to commit: call verify first")
        arr = np.asarray(list(path))
        if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"a commit path is a list of node indices (integers), got {arr.dtype} {arr.shape}")
        nodes = [int(x) for x in arr]
        for m, a in enumerate(nodes):
            if not 0 <= a < len(par) or par[a] != (nodes[m - 1] if m else -1):
                raise ValueError(f"commit path {nodes} is not a root-to-node path of the last tree "
                                 f"(node {a} at position {m})")
        if self._tree_mode:
            native.tree_commit(self.ctx.ptr, self.rows(nodes))
            self.n_past += len(nodes)
        else:
            if not self.can_truncate and len(nodes) < len(par):
                raise ValueError(f"a {self.model.arch} target cannot drop verified tokens of a plain batch")
            self.n_past += len(nodes)
            self.ctx.truncate(self.n_past)
        self._parents = None

    def close(self) -> None:
        """Free the context and model (the backend chooser is detached first)."""
        if self.ctx.ptr:
            self.detach_choice()  # llama.cpp keeps a pointer to the sampler
        self.ctx.close()
        self.model.close()
