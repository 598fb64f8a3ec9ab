"""One full verify step of a Gated-DeltaNet hybrid target (qwen35), three ways (docs/gdn-tree.md).

After a prompt of P tokens, a DDTree-shaped draft tree of N nodes (``gdn_bench.ddtree``: root +
N − 1 drafts, depth <= ``MAX_DEPTH`` nodes) is verified:

- **tree** (``TreeMode``): ``Target.verify`` over the N nodes in one batch (patch 0006's tree
  mode), then ``Target.commit`` of the deepest path (timed apart);
- **per-branch** (``BranchMode``): every root-to-leaf path as its own sequence of one llama.cpp
  batch: a context with ``n_seq_max`` = leaves + 1 and a unified KV cache, the prompt in sequence
  0, ``llama_memory_seq_cp`` 0 → s (shares the prompt's KV cells, the recurrent cell is copied in
  the graph), path s tagged with id s. The recurrent memory splits the batch into equal-length
  ubatches of consecutive ids (``split_equal``); paths are given ids by decreasing length, so there
  is one ubatch per distinct path length;
- **chain** (``ChainMode``): upstream's snapshot rollback: a context with ``n_rs_seq`` =
  ``MAX_DEPTH`` decodes the deepest path as a chain (the DeltaNet op writes the last n_rs_seq + 1
  states), then ``llama_memory_seq_rm`` from the accepted prefix rolls the recurrent state back to
  a snapshot (timed apart: bookkeeping only, the snapshot is read by the next decode).

Every mode copies the logits of all its rows to the host (``llama_get_logits``, which also
synchronizes). Each timed iteration starts from the state right after the prompt: tree and chain
restore sequence 0 (``llama_state_seq_set_data`` of a copy taken after the prefill, untimed),
per-branch removes its branch sequences (untimed).
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, replace

import llama_cpp as lc
import numpy as np

from . import gdn as gdn_bench
from ..llama.model import Context, LlamaError
from ..decode.verify import Target
from ..decode.tree import Tree

MAX_DEPTH = gdn_bench.MAX_DEPTH
#: logits tolerance, relative to the reference row's largest |logit| (tests/test_tree_gdn_model.py)
REL_TOL = {"cpu": 5e-3, "gpu": 1.5e-2}
MAX_SEQ = 256  # LLAMA_MAX_SEQ (src/llama-cparams.h): sequences per context


def draft_tree(n_nodes: int, rng: np.random.Generator, n_vocab: int) -> Tree:
    """A DDTree of ``n_nodes`` nodes (``gdn_bench.ddtree``) whose candidate ranks are mapped to token
    ids: rank k at depth d → a fixed random id table[d, k] in 0..n_vocab-1 (the root: table[0, 0])."""
    tree = gdn_bench.ddtree(n_nodes, rng)
    table = rng.integers(0, n_vocab, (MAX_DEPTH + 1, int(tree.tokens.max()) + 1))
    return replace(tree, tokens=table[tree.depth, tree.tokens].astype(np.int32))


def leaf_paths(tree: Tree) -> list[list[int]]:
    """Root-to-leaf paths (node indices, root first), longest first (ties in node order)."""
    return sorted(gdn_bench.leaf_paths(tree), key=len, reverse=True)


def row_error(a: np.ndarray, b: np.ndarray, rel: float) -> tuple[float, bool]:
    """Compare logit rows ``a`` against reference ``b`` (both ``[n, n_vocab]``): returns (largest
    max|a − b| / max|b| over rows, ok); ok when every row is within ``rel`` and keeps its argmax unless
    ``b``'s top two are within 2·rel·max|b| (a near-tie). Non-finite values are never ok."""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf"), False
    scale = np.abs(b).max(axis=1)
    err = np.abs(a - b).max(axis=1) / scale
    top2 = np.sort(b, axis=1)[:, -2:]
    tie = top2[:, 1] - top2[:, 0] < 2 * rel * scale
    ok = (err <= rel) & ((a.argmax(1) == b.argmax(1)) | tie)
    return float(err.max()), bool(ok.all())


class SeqSnapshot:
    """A host copy of one sequence's memory (KV cells and recurrent state) of a context.

    Raises LlamaError when llama.cpp cannot save or restore it."""

    def __init__(self, ctx_ptr, seq: int = 0):
        self.ctx, self.seq = ctx_ptr, seq
        self.n = lc.llama_state_seq_get_size(ctx_ptr, seq)
        self.buf = (ctypes.c_uint8 * self.n)()
        if lc.llama_state_seq_get_data(ctx_ptr, self.buf, self.n, seq) != self.n:
            raise LlamaError(f"llama_state_seq_get_data of sequence {seq} failed")

    def restore(self) -> None:
        if lc.llama_state_seq_set_data(self.ctx, self.buf, self.n, self.seq) == 0:
            raise LlamaError(f"llama_state_seq_set_data of sequence {self.seq} failed")


def _prefill(ctx: Context, prompt: list[int], chunk: int) -> None:
    lc.llama_memory_clear(ctx.mem, True)
    for s in range(0, len(prompt), chunk):
        ctx.decode_tokens(prompt[s:s + chunk], s, "last")


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1e3


class TreeMode:
    """Tree verification on a ``Target`` (owns the model the other modes share)."""

    def __init__(self, path, n_prompt: int, n_nodes_max: int, n_threads: int | None):
        """Load ``path`` (a qwen35 GGUF, else ValueError) with room for ``n_prompt`` tokens and a tree of
        up to ``n_nodes_max`` nodes; ``prefill`` next."""
        n_batch = max(n_nodes_max, min(n_prompt, 512))
        self.target = Target(path, n_ctx=n_prompt + MAX_DEPTH + 64, n_batch=n_batch, n_threads=n_threads)
        if self.target.model.arch != "qwen35":
            self.target.close()
            raise ValueError(f"expected a qwen35 model, got {self.target.model.arch!r}")
        self.n_prompt = n_prompt

    def prefill(self, prompt: list[int]) -> None:
        """Decode the ``n_prompt`` prompt tokens and keep a copy of the state."""
        assert len(prompt) == self.n_prompt
        self.target.prefill(prompt)
        self.snap = SeqSnapshot(self.target.ctx.ptr)

    def restore(self) -> None:
        self.snap.restore()
        self.target.n_past = self.n_prompt

    def step(self, tree: Tree, path: list[int]) -> tuple[np.ndarray, float, float]:
        """Restore, verify ``tree``, commit ``path``: (logits ``[N, n_vocab]`` float32 in node order (a
        copy), verify ms, commit ms)."""
        self.restore()
        t0 = time.perf_counter()
        rows = self.target.verify(tree.tokens, tree.parents, tree.depth).logits
        t1 = time.perf_counter()
        logits = np.asarray(rows).copy()
        t2 = time.perf_counter()
        self.target.commit(path)
        lc.llama_synchronize(self.target.ctx.ptr)
        t3 = time.perf_counter()
        return logits, _ms(t0, t1), _ms(t2, t3)

    def close(self) -> None:
        self.target.close()


class BranchMode:
    """Per-branch verification: every root-to-leaf path its own sequence, one batch."""

    def __init__(self, target: Target, prompt: list[int], n_leaves_max: int, n_tokens_max: int,
                 n_threads: int | None):
        if n_leaves_max + 1 > MAX_SEQ:
            raise ValueError(f"{n_leaves_max} leaves + the prompt's sequence exceed llama.cpp's {MAX_SEQ}")
        n_batch = max(n_tokens_max, min(len(prompt), 512))
        n_ctx = -(-(len(prompt) + n_tokens_max + 64) // 256) * 256
        self.ctx = Context(target.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=n_threads,
                           n_seq_max=n_leaves_max + 1, kv_unified=True)
        self.n_prompt, self.chunk = len(prompt), min(len(prompt), 512)
        _prefill(self.ctx, prompt, self.chunk)
        self.n_seqs = 0

    def clear_branches(self) -> None:
        for s in range(1, self.n_seqs + 1):
            lc.llama_memory_seq_rm(self.ctx.mem, s, -1, -1)
        self.n_seqs = 0

    def step(self, tree: Tree, paths: list[list[int]]) -> tuple[list[np.ndarray], float]:
        """Drop the previous branches, then fork sequence 0 into sequences 1..len(paths) and decode path
        j (node indices) as sequence j + 1 at positions P.. in one batch: (per path its logits
        ``[len(path), n_vocab]`` float32 (copies), ms of the forks + decode + logits copy)."""
        self.clear_branches()
        tokens = np.concatenate([tree.tokens[p] for p in paths])
        seq_ids = np.concatenate([np.full(len(p), j + 1) for j, p in enumerate(paths)])
        pos = np.concatenate([self.n_prompt + np.arange(len(p)) for p in paths])
        t0 = time.perf_counter()
        for j in range(len(paths)):
            lc.llama_memory_seq_cp(self.ctx.mem, 0, j + 1, -1, -1)
        self.n_seqs = len(paths)
        n = self.ctx.decode_tokens(tokens, 0, "all", positions=pos, seq_ids=seq_ids)
        logits = self.ctx.logits(n)
        t1 = time.perf_counter()
        bounds = np.cumsum([0] + [len(p) for p in paths])
        return [logits[bounds[j]:bounds[j + 1]].copy() for j in range(len(paths))], _ms(t0, t1)

    def close(self) -> None:
        self.ctx.close()


class ChainMode:
    """A chain verified with upstream's recurrent snapshot rollback (``n_rs_seq``)."""

    def __init__(self, target: Target, prompt: list[int], n_threads: int | None):
        n_batch = max(2 * (MAX_DEPTH + 1), min(len(prompt), 512))
        self.ctx = Context(target.model, n_ctx=len(prompt) + MAX_DEPTH + 64, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=n_threads, n_rs_seq=MAX_DEPTH)
        self.n_rs_seq = lc.llama_n_rs_seq(self.ctx.ptr)
        if self.n_rs_seq < MAX_DEPTH:
            raise ValueError(f"llama.cpp set n_rs_seq = {self.n_rs_seq} (< {MAX_DEPTH}) for this model")
        self.n_prompt = len(prompt)
        _prefill(self.ctx, prompt, min(len(prompt), 512))
        self.snap = SeqSnapshot(self.ctx.ptr)

    def step(self, tokens: np.ndarray, n_keep: int) -> tuple[np.ndarray, float, float]:
        """Restore, decode the chain ``tokens`` (root first) at P.., roll back to its first ``n_keep``
        (1 <= n_keep < len(tokens)): (logits ``[len(tokens), n_vocab]`` float32 (a copy), verify ms,
        rollback ms). Raises LlamaError when llama.cpp refuses the rollback."""
        if not 1 <= n_keep < len(tokens):
            raise ValueError(f"n_keep must be in 1..{len(tokens) - 1}, got {n_keep}")
        self.snap.restore()
        t0 = time.perf_counter()
        n = self.ctx.decode_tokens(tokens, self.n_prompt, "all")
        logits = self.ctx.logits(n)
        t1 = time.perf_counter()
        out = logits.copy()
        t2 = time.perf_counter()
        ok = lc.llama_memory_seq_rm(self.ctx.mem, 0, self.n_prompt + n_keep, -1)
        t3 = time.perf_counter()
        if not ok:
            raise LlamaError(f"n_rs_seq rollback of {len(tokens) - n_keep} tokens refused")
        return out, _ms(t0, t1), _ms(t2, t3)

    def probe(self, token: int, n_keep: int) -> np.ndarray:
        """After ``step(..., n_keep)``: decode ``token`` at P + n_keep; its logits ``[n_vocab]`` (a copy)."""
        self.ctx.decode_tokens([int(token)], self.n_prompt + n_keep, "all")
        return self.ctx.logits(1)[0].copy()

    def close(self) -> None:
        self.ctx.close()


@dataclass
class Case:
    """One tree size: the tree, its leaf paths (longest first) and the chain's accepted prefix."""

    tree: Tree
    paths: list[list[int]]
    n_keep: int

    @property
    def deepest(self) -> list[int]:
        return self.paths[0]


def make_case(n_nodes: int, rng: np.random.Generator, n_vocab: int, accept: float) -> Case:
    """A ``draft_tree`` and the chain's kept prefix: round(accept · depth) clipped to 1..depth − 1."""
    tree = draft_tree(n_nodes, rng, n_vocab)
    paths = leaf_paths(tree)
    L = len(paths[0])
    return Case(tree, paths, int(min(max(round(accept * L), 1), max(L - 1, 1))))


def check_case(case: Case, modes: dict, rel: float) -> dict:
    """Run each mode once and compare with the tree's node logits (``row_error`` within ``rel``, e.g.
    ``REL_TOL[device]``):
    per-branch: every path's rows; chain: the deepest path's rows, and after the rollback a decode of the
    deepest path's node n_keep against that node's tree row. Returns ``{"errors", "ok", "correct"}``."""
    tree_logits, _, _ = modes["tree"].step(case.tree, case.deepest)
    err, ok = {}, {}
    err["tree_finite"], ok["tree_finite"] = 0.0, bool(np.isfinite(tree_logits).all())
    if "branch" in modes:
        rows, _ = modes["branch"].step(case.tree, case.paths)
        res = [row_error(r, tree_logits[p], rel) for r, p in zip(rows, case.paths)]
        err["branch"], ok["branch"] = max(e for e, _ in res), all(o for _, o in res)
        modes["branch"].clear_branches()
    if "chain" in modes and len(case.deepest) > 1:
        d = case.deepest
        chain, _, _ = modes["chain"].step(case.tree.tokens[d], case.n_keep)
        err["chain"], ok["chain"] = row_error(chain, tree_logits[d], rel)
        probe = modes["chain"].probe(case.tree.tokens[d[case.n_keep]], case.n_keep)
        err["rollback"], ok["rollback"] = row_error(probe, tree_logits[d[case.n_keep]], rel)
    return {"errors": err, "ok": ok, "correct": all(ok.values())}


def time_case(case: Case, modes: dict, n_warmup: int, n_iter: int) -> dict:
    """Median and min ms over ``n_iter`` (after ``n_warmup``) of: tree verify, tree commit, per-branch
    (forks + decode), chain verify, chain rollback (modes present only)."""
    t: dict[str, list[float]] = {k: [] for k in ("tree", "tree_commit", "branch", "chain", "chain_rollback")}
    for i in range(n_warmup + n_iter):
        keep = i >= n_warmup
        _, v, c = modes["tree"].step(case.tree, case.deepest)
        if keep:
            t["tree"].append(v)
            t["tree_commit"].append(c)
        if "branch" in modes:
            _, b = modes["branch"].step(case.tree, case.paths)
            if keep:
                t["branch"].append(b)
        if "chain" in modes and len(case.deepest) > 1:
            _, v, r = modes["chain"].step(case.tree.tokens[case.deepest], case.n_keep)
            if keep:
                t["chain"].append(v)
                t["chain_rollback"].append(r)
    if "branch" in modes:
        modes["branch"].clear_branches()
    return {k: gdn_bench.time_stats(v) for k, v in t.items() if v}
