"""Benchmark of the Gated DeltaNet tree ops (patch 0005) against per-branch recurrent verification.

One case = one DDTree-shaped draft tree of N nodes (node 0 the root, best-first by path
log-probability from synthetic peaked marginals, depth <= 16 nodes) at given dimensions:

- tree: ``ggml_gated_delta_net_tree`` / ``ggml_ssm_conv_tree`` over the N nodes, one call;
- per-branch: every root-to-leaf path verified as its own sequence with upstream
  ``ggml_gated_delta_net`` / ``ggml_ssm_conv``. Upstream needs one token count for all sequences of a
  call, so the leaves are grouped by path length, one call per group (n_seqs = leaves in it,
  n_tokens = the length, the state replicated per sequence) and the group times summed;
- padded: all leaves in one upstream call, each path padded to the deepest (zero inputs);
- commit: ``ggml_gated_delta_net_tree_commit`` / ``ggml_ssm_conv_tree_commit`` of the deepest path.

Every case is checked once before timing: each leaf's per-branch outputs (grouped and padded) equal
the tree op's outputs at its path's nodes, and the commits equal the per-branch final states, within
``tree_ops.ERR_F32_BY_DEVICE``. Times are per layer, in ms (``op_harness.bench_op``: compute +
synchronize of a one-op graph, inputs already on the device).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass

import numpy as np

from ..testing import op_harness
from ..testing import gdn_ops as tree_ops
from ..decode.tree import Tree, build_ddtree


@dataclass(frozen=True)
class Dims:
    """Gated DeltaNet layer dimensions; the defaults are Qwen3.6-27B's (docs/gdn-tree.md)."""

    heads_v: int = 48        # H_v value heads
    heads_k: int = 16        # H_k q/k heads (v head h reads q/k head h % H_k)
    head_dim: int = 128      # S_k = S_v
    conv_channels: int = 10240
    d_conv: int = 4
    layers: int = 48         # DeltaNet layers (times are per layer)


MAX_DEPTH = 16  # nodes on the longest root-to-leaf path, root included (a DFlash block of 16)


def marginals(rng: np.random.Generator, top_k: int = 8, top1: tuple[float, float] = (0.9, 0.5),
              concentration: float = 8.0, tail: int = 64) -> np.ndarray:
    """Synthetic drafter marginals of the MAX_DEPTH - 1 block positions: the top-``top_k`` probabilities of
    each, float64 ``[MAX_DEPTH - 1, top_k]``, descending. Position d's top-1 probability is
    Beta-distributed (``concentration``) around a mean falling linearly from ``top1[0]`` to ``top1[1]``
    (a drafter surer of near tokens); the rest is split over ``tail`` tokens by a flat Dirichlet."""
    D = MAX_DEPTH - 1
    mean = np.linspace(top1[0], top1[1], D)
    p1 = rng.beta(mean * concentration, (1 - mean) * concentration)
    rest = -np.sort(-rng.dirichlet(np.ones(tail), size=D), axis=1)[:, :top_k - 1] * (1 - p1)[:, None]
    return np.maximum(np.concatenate([p1[:, None], rest], axis=1), 1e-30)


def ddtree(n_nodes: int, rng: np.random.Generator, top_k: int = 8) -> Tree:
    """A DDTree of ``n_nodes`` nodes (root + n_nodes - 1 drafts, best-first by path log-probability, depth
    <= MAX_DEPTH nodes) over ``marginals(rng, top_k)`` (the candidates' order is what DDTree needs; token
    ids are the ranks). Raises ValueError for n_nodes < 1."""
    if n_nodes < 1:
        raise ValueError(f"a tree needs at least 1 node, got {n_nodes}")
    p = marginals(rng, top_k)
    order = np.argsort(-p, axis=1, kind="stable")
    return build_ddtree(0, order, np.log(np.take_along_axis(p, order, 1)), n_nodes - 1)


def tree_from_parents(parents: np.ndarray) -> Tree:
    """A Tree of the given shape (tokens = node indices, log-probs 0): parents int ``[N]``, ``parents[0] = -1``,
    ``0 <= parents[i] < i``. Raises ValueError otherwise (also for a non-integer array)."""
    raw = np.asarray(parents)
    if raw.size and not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"not a tree in topological order: parents must be integers, got {raw.dtype}")
    par = raw.astype(np.int64)
    idx = np.arange(len(par)) if par.ndim == 1 else np.zeros(0, np.int64)
    if par.ndim != 1 or len(par) == 0 or par[0] != -1 or np.any(par[1:] < 0) or np.any(par[1:] >= idx[1:]):
        raise ValueError("not a tree in topological order (need parents[0] = -1 and 0 <= parents[i] < i)")
    return Tree.from_lists(0, [(int(p), i, 0.0) for i, p in enumerate(par[1:], 1)])


def load_trees(path: str, count: int) -> list[tuple[int, str | None, Tree]]:
    """``count`` trees of a tree file (lab/capture_trees.py: ``parents`` int ``[n_trees, N]``, one row per
    real draft tree, and optionally ``set``, the prompt set of each), spread over its range of per-branch
    cost: sorted by the tokens per-branch verification processes (the sum of root-to-leaf path lengths),
    the trees at ``count`` evenly spaced ranks, lowest and highest included (the median one for
    ``count`` = 1; all of them when the file has fewer). Returns ``(row index, set or None, tree)`` per
    pick, cheapest first. Raises OSError for an unreadable file, ValueError for one that is not an .npz
    archive, has no 2-D ``parents`` array or has a row that is not a tree."""
    try:
        f = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an .npz archive ({e})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not an .npz archive (a single array)")
    with f:
        if "parents" not in f.files:
            raise ValueError(f"{path}: no 'parents' array (expected lab/capture_trees.py's output)")
        try:
            rows = np.asarray(f["parents"])
            sets = [str(x) for x in f["set"]] if "set" in f.files else None
        except (ValueError, zipfile.BadZipFile) as e:
            raise ValueError(f"{path}: unreadable array ({e})") from None
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"{path}: 'parents' must be [n_trees, N], got shape {rows.shape}")
    trees = []
    for i, r in enumerate(rows):
        try:
            trees.append((i, sets[i] if sets and i < len(sets) else None, tree_from_parents(r)))
        except ValueError as e:
            raise ValueError(f"{path}: tree {i}: {e}") from None
    trees.sort(key=lambda it: sum(map(len, leaf_paths(it[2]))))
    if count == 1:
        return [trees[(len(trees) - 1) // 2]]
    pick = np.unique(np.round(np.linspace(0, len(trees) - 1, min(count, len(trees)))).astype(int))
    return [trees[i] for i in pick]


def leaf_paths(tree: Tree) -> list[list[int]]:
    """Root-to-leaf paths (node indices, root first), leaves in node order."""
    has_child = np.zeros(len(tree), bool)
    has_child[tree.parents[tree.parents >= 0]] = True
    return [tree.path(i) for i in np.flatnonzero(~has_child)]


def make_inputs(dims: Dims, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 inputs of one layer for n tree nodes (numpy order, see tree_ops): q, k
    ``(1, n, H_k, S)`` L2-normalised, v ``(1, n, H_v, S)``, g ``(1, n, H_v, 1)`` < 0, beta
    ``(1, n, H_v)``, state ``(1, H_v, S, S)``, conv sx ``(1, C, d_conv - 1 + n)``, conv c ``(C, d_conv)``."""
    S, H, Hk, C, d = dims.head_dim, dims.heads_v, dims.heads_k, dims.conv_channels, dims.d_conv

    def unit(shape):
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    return {
        "q": unit((1, n, Hk, S)), "k": unit((1, n, Hk, S)),
        "v": rng.standard_normal((1, n, H, S)).astype(np.float32),
        "g": -rng.uniform(0.005, 0.7, (1, n, H, 1)).astype(np.float32),
        "beta": (1 / (1 + np.exp(-rng.standard_normal((1, n, H))))).astype(np.float32),
        "state": (0.5 * rng.standard_normal((1, H, S, S))).astype(np.float32),
        "sx": rng.standard_normal((1, C, d - 1 + n)).astype(np.float32),
        "c": rng.standard_normal((C, d)).astype(np.float32),
    }


def branch_inputs(x: dict, paths: list[list[int]], length: int, d_conv: int) -> dict[str, np.ndarray]:
    """Per-branch inputs: sequence b = paths[b] (padded with zero inputs to ``length`` tokens), the
    state and conv state replicated per sequence. Shapes as ``make_inputs`` with B = len(paths)."""
    B = len(paths)
    out = {"state": np.ascontiguousarray(np.repeat(x["state"], B, axis=0))}
    for name in ("q", "k", "v", "g", "beta"):
        a = np.zeros((B, length) + x[name].shape[2:], np.float32)
        for b, p in enumerate(paths):
            a[b, :len(p)] = x[name][0, p]
        out[name] = a
    sx = np.zeros((B, x["sx"].shape[1], d_conv - 1 + length), np.float32)
    for b, p in enumerate(paths):
        sx[b, :, :d_conv - 1] = x["sx"][0, :, :d_conv - 1]
        sx[b, :, d_conv - 1:d_conv - 1 + len(p)] = x["sx"][0][:, [d_conv - 1 + i for i in p]]
    out["sx"], out["c"] = sx, x["c"]
    return out


def gdn_srcs(x: dict, parent: np.ndarray | None = None) -> list[np.ndarray]:
    """Sources of ``gdn`` (parent None) or ``gdn_tree`` for op_harness.run_op / bench_op."""
    srcs = [x["q"], x["k"], x["v"], x["g"], x["beta"][..., None], x["state"]]
    return srcs if parent is None else srcs + [parent.reshape(1, -1).astype(np.int32)]


def groups_by_length(paths: list[list[int]]) -> dict[int, list[list[int]]]:
    """The paths grouped by length (ascending lengths)."""
    out: dict[int, list[list[int]]] = {}
    for p in sorted(paths, key=len):
        out.setdefault(len(p), []).append(p)
    return out


def _gdn_tree(x: dict, parent: np.ndarray, **kw):
    return tree_ops.gated_delta_net_tree(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], parent, **kw)


def _gdn(x: dict, **kw):
    return tree_ops.gated_delta_net(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], **kw)


def _branch_errors(x: dict, tree_o, tree_conv, paths, length: int, d_conv: int, kw) -> tuple[float, float]:
    """Largest rel_err over ``paths`` of upstream gdn / ssm_conv outputs (padded to ``length``) against the
    tree ops' outputs at the path nodes."""
    bi = branch_inputs(x, paths, length, d_conv)
    o, _ = _gdn(bi, **kw)
    conv = tree_ops.ssm_conv(bi["sx"], bi["c"], **kw)
    e_o = max(tree_ops.rel_err(o[b, :len(p)], tree_o[0, p]) for b, p in enumerate(paths))
    e_c = max(tree_ops.rel_err(conv[b, :len(p)], tree_conv[0, p]) for b, p in enumerate(paths))
    return e_o, e_c


def check_case(x: dict, tree: Tree, dims: Dims, device: str, n_threads: int) -> dict:
    """Run every op of a case once and compare tree vs per-branch. Returns ``{"errors": {name: rel_err},
    "bounds": {name: bound}, "correct": bool}``; names: gdn_o_grouped, gdn_o_padded, conv_grouped,
    conv_padded, gdn_commit (vs the per-branch final state of the deepest path), conv_commit (exact)."""
    kw = {"device": device, "n_threads": n_threads}
    paths, d = leaf_paths(tree), dims.d_conv
    o, u, gamma, kc = _gdn_tree(x, tree.parents, **kw)
    conv = tree_ops.ssm_conv_tree(x["sx"], x["c"], tree.parents, **kw)
    err: dict[str, float] = {"gdn_o_grouped": 0.0, "conv_grouped": 0.0}
    for length, ps in groups_by_length(paths).items():
        e_o, e_c = _branch_errors(x, o, conv, ps, length, d, kw)
        err["gdn_o_grouped"], err["conv_grouped"] = max(err["gdn_o_grouped"], e_o), max(err["conv_grouped"], e_c)
    err["gdn_o_padded"], err["conv_padded"] = _branch_errors(x, o, conv, paths, max(map(len, paths)), d, kw)
    deepest = max(paths, key=len)
    path = np.array([deepest], np.int32)
    committed = tree_ops.gated_delta_net_tree_commit(x["state"], kc, u, gamma, path, **kw)
    err["gdn_commit"] = tree_ops.rel_err(committed, _gdn(branch_inputs(x, [deepest], len(deepest), d), **kw)[1])
    conv_state = tree_ops.ssm_conv_tree_commit(x["sx"], path, d, **kw)
    window = np.concatenate([x["sx"][0, :, :d - 1], x["sx"][0][:, [d - 1 + i for i in deepest]]], axis=1)
    err["conv_commit"] = float(np.max(np.abs(conv_state[0] - window[:, -(d - 1):]))) if d > 1 else 0.0
    tol = tree_ops.ERR_F32_BY_DEVICE[device]
    bounds = {"gdn_o_grouped": tol["chain_vs_gdn"], "gdn_o_padded": tol["chain_vs_gdn"],
              "conv_grouped": tol["conv"], "conv_padded": tol["conv"], "gdn_commit": tol["chain_vs_gdn"],
              "conv_commit": 0.0}
    correct = all(np.isfinite(v) and v <= bounds[k] for k, v in err.items())
    return {"errors": err, "bounds": bounds, "correct": bool(correct)}


def time_stats(ms, ms_repeat=None, n_repeat: int = 1) -> dict[str, float]:
    """``median_ms`` and ``min_ms`` of per-iteration times in ms (a sequence or array, non-empty); with
    the times of a graph of ``n_repeat`` >= 2 copies (``ms_repeat``) also ``op_ms``, the op's own time
    (``op_harness.op_time``: no launch or synchronize)."""
    out = {"median_ms": float(np.median(ms)), "min_ms": float(np.min(ms))}
    if ms_repeat is not None:
        out["op_ms"] = op_harness.op_time(ms, ms_repeat, n_repeat)
    return out


def _summed(per_group: list[dict]) -> dict[str, float]:
    """Grouped per-branch time: the sum over groups of each group's statistics (``time_stats``)."""
    return {key: float(sum(g[key] for g in per_group)) for key in per_group[0]}


def time_case(x: dict, tree: Tree, dims: Dims, device: str, n_threads: int, n_warmup: int,
              n_iter: int, n_repeat: int = 1) -> dict:
    """Per-layer times (ms, median and min over ``n_iter``) of a case: ``{"gdn": {tree, branch, padded},
    "conv": {tree, branch, padded}, "commit": {gdn, conv}}``, each ``time_stats`` (with ``op_ms`` when
    ``n_repeat`` >= 2: each op also timed as a graph of ``n_repeat`` copies)."""
    def bench(op, srcs, iparam=0):
        def run(r):
            return op_harness.bench_op(op, srcs, iparam=iparam, device=device, n_threads=n_threads,
                                   n_warmup=n_warmup, n_iter=n_iter, n_repeat=r)
        return time_stats(run(1), run(n_repeat) if n_repeat > 1 else None, n_repeat)

    paths, d = leaf_paths(tree), dims.d_conv
    parent = tree.parents.astype(np.int32)
    res = {"gdn": {"tree": bench("gdn_tree", gdn_srcs(x, parent))},
           "conv": {"tree": bench("conv_tree", [x["sx"], x["c"], parent.reshape(1, -1)])}}
    gdn_t, conv_t = [], []
    for length, ps in groups_by_length(paths).items():
        bi = branch_inputs(x, ps, length, d)
        gdn_t.append(bench("gdn", gdn_srcs(bi)))
        conv_t.append(bench("conv", [bi["sx"], bi["c"]]))
    res["gdn"]["branch"], res["conv"]["branch"] = _summed(gdn_t), _summed(conv_t)
    bi = branch_inputs(x, paths, max(map(len, paths)), d)
    res["gdn"]["padded"] = bench("gdn", gdn_srcs(bi))
    res["conv"]["padded"] = bench("conv", [bi["sx"], bi["c"]])
    _, u, gamma, kc = _gdn_tree(x, parent, device=device, n_threads=n_threads)
    path = np.array([max(paths, key=len)], np.int32)
    res["commit"] = {"gdn": bench("gdn_commit", [x["state"], kc, u, gamma, path]),
                     "conv": bench("conv_commit", [x["sx"], path], d)}
    return res


def median_of_rounds(rounds: list) -> dict | float | None:
    """Element-wise median of ``time_case`` results of several rounds (nested dicts with the same keys; a statistic
    that is None in any round stays None). Raises ValueError for no rounds."""
    if not rounds:
        raise ValueError("no rounds to combine")
    first = rounds[0]
    if isinstance(first, dict):
        return {k: median_of_rounds([r[k] for r in rounds]) for k in first}
    if any(v is None for v in rounds):
        return None
    return float(np.median(rounds))


def run_case(n_nodes: int, dims: Dims, rng: np.random.Generator, device: str = "cpu", n_threads: int = 2,
             n_warmup: int = 3, n_iter: int = 10, n_repeat: int = 1, n_rounds: int = 1,
             tree: Tree | None = None) -> dict:
    """Build a DDTree of ``n_nodes`` nodes (or take ``tree``, e.g. a real one from ``load_trees``; then
    ``n_nodes`` is ignored) and random inputs, check it (``check_case``) and, when correct,
    time it (``time_case``, ``n_rounds`` times, every op once a round, so that a slow spell of a shared
    machine falls on the tree and the per-branch ops alike; the element-wise median of the rounds,
    ``median_of_rounds``). Returns ``{"nodes", "leaves", "depth", "groups": {length: n_seqs},
    "branch_tokens", "padded_tokens", "check", "times" (absent when incorrect), "speedup": {"gdn", "conv",
    "gdn_padded", "conv_padded"} (per-branch / tree, medians; with ``n_repeat`` >= 2 also the same four
    with the suffix ``_op``: ratios of the ops' own times, None where one came out <= 0)}``. Raises
    op_harness.OpUnavailable when the device cannot run an op."""
    tree = ddtree(n_nodes, rng) if tree is None else tree
    n_nodes = len(tree)
    paths = leaf_paths(tree)
    x = make_inputs(dims, n_nodes, rng)
    case = {"nodes": n_nodes, "leaves": len(paths), "depth": max(map(len, paths)),
            "groups": {str(k): len(v) for k, v in groups_by_length(paths).items()},
            "branch_tokens": sum(map(len, paths)), "padded_tokens": len(paths) * max(map(len, paths)),
            "check": check_case(x, tree, dims, device, n_threads)}
    if not case["check"]["correct"]:
        return case
    t = case["times"] = median_of_rounds([time_case(x, tree, dims, device, n_threads, n_warmup, n_iter, n_repeat)
                                          for _ in range(n_rounds)])
    keys = [("median_ms", "")] + ([("op_ms", "_op")] if n_repeat > 1 else [])
    case["speedup"] = {f"{op}{suffix}{ksuf}": _ratio(t[op][base][key], t[op]["tree"][key])
                       for key, ksuf in keys
                       for op in ("gdn", "conv") for base, suffix in (("branch", ""), ("padded", "_padded"))}
    return case


def _ratio(a: float, b: float) -> float | None:
    """a / b; None when either is not positive (an op time by differences can come out <= 0 in noise)."""
    return a / b if a > 0 and b > 0 else None
