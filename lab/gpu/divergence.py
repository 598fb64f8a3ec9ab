"""Losslessness at 64 and 128 nodes: where DDTree leaves plain greedy decoding, and
how far the logits of an n-node target pass lie from decoding each node's path one token at a time.

Usage (repository root, the checkout on the path; on a GPU machine the CUDA build the package loads,
every layer offloaded unless ``--cpu``):

    PYTHONPATH=. python lab/gpu/divergence.py --out div.json [--target GGUF] [--drafter auto]
        [--sets humaneval,gsm8k,mtbench] [--prompts 40] [--tokens 256] [--budgets 64,128]
        [--sizes 1,16,64,128] [--sources ddtree,chain] [--positions 4] [--time-limit 280]
        [--spread-share 0.35] [--n-ctx 2048] [--threads N] [--cpu]

Two parts, both greedy with the target's logits on the host (the engine's ``greedy_argmax="host"``
rule: np.argmax of each row, exact ties to the lowest id like CUDA's backend argmax):

1. **Census.** The first ``--prompts`` prompts of each set (taken in turn, one of each set, so that a
   run cut short covers every set), ``--tokens`` new tokens with plain decoding (every row a 1-token
   pass, kept), then DDTree at each fixed budget B (B drafted nodes + the root per pass: DDTree@64 is a
   65-node pass) through the engine's own step (``decode.step.run_step``, its tree and walk), stopped at
   the first token that differs from plain's. Every row the walk read before that is compared with
   plain's row at the same output index (``drift``: max |Δlogit|, the shift of the competitors' gaps to
   the best; both runs' caches hold the same tokens, computed in other batch shapes). At the
   divergence: the plain and the speculative token's logits in the tree row that emitted the
   speculative token and in plain's 1-token row (the gap each saw), the tree's node count, the node,
   its depth and batch row, ``tfm_local.lossless.classify``'s gaps (a prefill of the common prefix,
   what tfm-bench reports), and a replay on a fresh cache (prefill of the step's committed prefix, the
   same tree again, and the node's path decoded one token at a time): a replayed flip that the path
   decoding does not show is the tree pass's numerics, a flip that neither shows came from the cache
   the run had built.
2. **Pass spread.** At ``--positions`` random offsets per prompt of the census (its plain output as the
   context; a fresh prefill), for each size n in ``--sizes`` (nodes, root included) and source in
   ``--sources`` (``ddtree``: the drafter's DDTree of n - 1 drafts; ``chain``: plain's own continuation,
   decoded as a plain causal batch; ``synthetic``: a DDTree shape of ``tfm_local.bench.gdn.ddtree``
   with tokens drawn from the context): one n-node pass, then every node's path decoded one token at a
   time (a depth-first walk, cut back by position; the tokens along each path are the tree's). Per
   node row against its 1-token row: max |Δlogit| over the vocabulary, the largest change of a
   top-32 competitor's gap to the best (``gap_shift``: a flip at gap g needs a shift above g), the
   change of the top-1 minus top-2 gap, and whether the argmax differs (then the 1-token row's gap of
   the pass's pick). n = 1 is the same computation twice (0 unless the backend is not deterministic).
   The largest ``gap_shift`` per backend and n is the near-tie gap that rule would need
   (``tfm_local.lossless.tie_gap``: 1.0 on the CPU, from this script's CPU run; on CUDA 0.5 below 16
   nodes and 1.5 from 16 on, from its H200 run, docs/results/divergence-h200.json).

Time: the census stops at (1 - ``--spread-share``) of ``--time-limit``, the spread at the limit (a prompt
or tree under way finishes first: a few seconds on a GPU, up to a minute on 2 CPU cores); the JSON is
rewritten after every prompt and position, so a killed run keeps what it had. Prints progress, then a
table per part.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Callable

import numpy as np

from tfm_local.bench import gdn as gdn_bench
from tfm_local.cli.common import check_writable, device_name, int_list, run_record, write_json
from tfm_local.decode.accept import children_lists
from tfm_local.decode.stats import PHASES, PhaseClock
from tfm_local.decode.methods import make_method
from tfm_local.decode.step import draft_tree, run_step
from tfm_local.decode.tree import Tree
from tfm_local.lossless import classify, tie_gap

SETS = ("humaneval", "gsm8k", "mtbench")
SOURCES = ("ddtree", "chain", "synthetic")
#: Competitors of the best token whose gap changes ``gap_shift`` takes (the 1-token row's top-K).
TOP = 32
#: ``gap_shift_near`` takes only the competitors within this many logits of the best (those a flip can reach).
NEAR = 2.0


# -- rows --------------------------------------------------------------------------------------
def row_diff(row, ref) -> dict:
    """A logits row against the reference row ``ref`` (the 1-token pass), both ``[n_vocab]``.

    max_abs: max |row - ref|; rel: that over max |ref|; gap_shift: the largest change, among ``ref``'s
    top-``TOP`` tokens, of a token's logit minus the best's (ref's argmax); gap_shift_near: the same
    over the tokens within ``NEAR`` of the best (0 when there are none); gap12: ref's top-1 minus
    top-2; gap12_change: the same two tokens' difference in ``row`` minus gap12; flip: the argmaxes
    differ; flip_gap: then ref's gap of ``row``'s argmax (what the near-tie rule sees), else None.
    """
    a = np.asarray(row, np.float64)
    b = np.asarray(ref, np.float64)
    d = a - b
    k = min(TOP, b.size)
    best = int(np.argmax(b))
    top = np.argpartition(-b, k - 1)[:k]
    others = top[top != best]
    second = int(others[np.argmax(b[others])]) if others.size else best
    pick = int(np.argmax(a))
    gap12 = float(b[best] - b[second])
    shift = np.abs(d[top] - d[best])
    near = b[top] > b[best] - NEAR
    return dict(max_abs=float(np.abs(d).max()), rel=float(np.abs(d).max() / max(np.abs(b).max(), 1e-30)),
                gap_shift=float(shift.max()), gap_shift_near=float(shift[near].max()), gap12=gap12,
                gap12_change=float(a[best] - a[second]) - gap12, flip=pick != best,
                flip_gap=float(b[best] - b[pick]) if pick != best else None)


# -- greedy generation with the engine's step ---------------------------------------------------
RowHook = Callable[[int, np.ndarray, "dict | None"], None]


def greedy_run(engine, ids: list[int], n_tokens: int, on_row: RowHook | None = None,
               stop: Callable[[], bool] = lambda: False, deadline: float | None = None) -> tuple[list[int], dict]:
    """Greedy decoding of ``n_tokens`` after ``ids`` as ``Engine.generate_ids`` does it (prefill, then
    ``run_step`` with the engine's draft shape and budget; host logits and np.argmax), with every row
    the walk reads passed to ``on_row(j, row, info)``: j the output index of the token chosen from it,
    info None for the prefill's row, else the step's tree (``n_nodes``, ``node``, ``depth``,
    ``batch_row``, ``pos`` the committed length, ``tokens``/``parents`` the tree).

    Stops after an end-of-generation token, after ``n_tokens``, when ``stop()`` turns true (checked
    after each step) or at ``deadline`` (``time.perf_counter``). Returns the output ids and
    ``dict(steps, timed_out)``.
    """
    tgt, dft = engine.target, engine.active_drafter
    shape = engine.method  # the engine's drafting method, as generate_ids holds it
    shape.begin()
    if dft is not None:
        if not tgt.feature_layers:  # the target captures the drafter's layer inputs (as run_step does)
            tgt.set_features(dft.layers)
        dft.reset()
    on_chunk = (lambda s, n: dft.inject(tgt.features(slice(0, n), n), s)) if dft is not None else None
    row = tgt.prefill(list(ids), on_chunk)
    out = [int(np.argmax(row))]
    if on_row is not None:
        on_row(0, row, None)
    state: dict = {}
    real_verify = tgt.verify

    def verify(tokens, parents=None, depth=None, **kw):
        verdict = real_verify(tokens, parents, depth, **kw)
        toks = np.asarray(tokens)
        par = np.arange(-1, len(toks) - 1) if parents is None else np.asarray(parents)
        state.update(kids=children_lists(par, toks), node=0, depth=0, n_nodes=len(toks), pos=tgt.n_past,
                     tokens=toks.copy(), parents=par.copy())
        return verdict

    def choose(r, position=None):  # run_step's host rule: (row) or (row, position), argmax either way
        t = int(np.argmax(r))
        if on_row is not None:
            info = {k: state[k] for k in ("n_nodes", "node", "depth", "pos", "tokens", "parents")}
            info["batch_row"] = int(tgt.rows([state["node"]])[0])
            on_row(state["base"] + state["depth"], r, info)
        nxt = state["kids"][state["node"]].get(t)
        if nxt is not None:
            state["node"], state["depth"] = nxt, state["depth"] + 1
        return t

    steps, timed_out = 0, False
    tgt.verify = verify  # run_step calls target.verify: the instance attribute shadows the method
    try:
        while (len(out) < n_tokens and not engine.tok.is_eog(out[-1]) and tgt.n_past + 1 <= tgt.n_ctx
               and not stop()):
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
                break
            state["base"] = len(out)
            rec = run_step(tgt, dft, shape, engine.budget, None, out[-1], n_tokens - len(out), choose, False)
            steps += 1
            for t in rec.tokens:
                out.append(int(t))
                if engine.tok.is_eog(t):
                    break
    finally:
        del tgt.verify
    return out, dict(steps=steps, timed_out=timed_out)


# -- tree passes against path decoding ----------------------------------------------------------
def tree_rows(target, tokens, parents, nodes) -> dict[int, np.ndarray]:
    """One ``Target.verify`` of the tree at the committed length; copies of ``nodes``' rows (nothing kept)."""
    v = target.verify(np.asarray(tokens), np.asarray(parents))
    rows = {int(i): np.array(v.logits[int(i)], np.float32) for i in nodes}
    target.commit([])
    return rows


def path_rows(target, tokens, parents, nodes) -> dict[int, np.ndarray]:
    """Each of ``nodes``' rows when its root-to-node path is decoded one token at a time after the
    committed tokens: a depth-first walk over the union of the paths (each tree edge decoded once,
    cut back by position between branches); the cache is left as it was."""
    if not target.can_truncate:  # each branch is cut back by position (Target.rewind)
        raise ValueError(f"a {target.model.arch} target cannot cut its cache back by position")
    parents = np.asarray(parents)
    base = target.n_past
    need = set()
    for i in nodes:
        i = int(i)
        while i >= 0 and i not in need:
            need.add(i)
            i = int(parents[i])
    kids: dict[int, list[int]] = {}
    for i in sorted(need):
        kids.setdefault(int(parents[i]), []).append(i)
    depth = np.zeros(len(parents), np.int64)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    want, rows = {int(i) for i in nodes}, {}
    stack = list(reversed(kids.get(-1, [])))
    try:
        while stack:
            i = stack.pop()
            target.rewind(base + int(depth[i]))
            v = target.verify([int(tokens[i])])
            try:
                if i in want:
                    rows[i] = np.array(v.logits[0], np.float32)
            finally:
                target.commit([0])
            stack.extend(reversed(kids.get(i, [])))
    finally:
        target.rewind(base)
    return rows


def make_tree(source: str, n: int, root: int, cont: list[int], pool: list[int], rng, engine, pos: int) -> Tree:
    """An ``n``-node tree (root included) after the committed ``pos`` tokens, root token ``root``:
    ``ddtree`` the engine's drafter's DDTree of n - 1 drafts (its features of the context injected),
    ``chain`` ``cont`` (padded from ``pool``), ``synthetic`` a DDTree shape with tokens from ``pool``."""
    if n == 1:
        return Tree.root(root)
    if source == "ddtree":
        shape = make_method("ddtree", engine.tree_top_k, engine.tree_width)
        clock = PhaseClock(dict.fromkeys(PHASES, 0.0))
        return draft_tree(engine.drafter, shape, root, pos, n - 1, n - 1, False, clock)[0]
    if source == "chain":
        toks = list(cont[:n - 1])
        toks += [int(x) for x in rng.choice(pool, n - 1 - len(toks))]
        return Tree.from_lists(root, [(i, t, 0.0) for i, t in enumerate(toks)])
    if source == "synthetic":
        parents = gdn_bench.ddtree(n, rng).parents
        tree = gdn_bench.tree_from_parents(parents)
        tree.tokens[:] = [root] + [int(x) for x in rng.choice(pool, n - 1)]
        return tree
    raise ValueError(f"unknown tree source {source!r}; choose from {', '.join(SOURCES)}")


def spread_position(engine, ctx: list[int], root: int, cont: list[int], sizes, sources, rng,
                    max_nodes: int | None = None, deadline: float | None = None) -> list[dict]:
    """The pass spread at one position: ``ctx`` committed (a fresh prefill, the drafter's features
    injected when it has one), ``root`` the last emitted token, ``cont`` plain's continuation after it.
    For every size and source, one n-node pass against each sampled node's path decoded one token at
    a time (``max_nodes`` nodes at most, the root and a random sample; None = all). Returns one dict
    per node row: source, n, node, depth, batch_row and ``row_diff``'s fields. Skips sizes over the
    batch and stops between trees at ``deadline``."""
    tgt = engine.target
    dft = engine.drafter if "ddtree" in sources and engine.drafter is not None else None
    if dft is not None:
        engine.set_draft("ddtree", max(1, max(sizes) - 1))
        if not tgt.feature_layers:
            tgt.set_features(dft.layers)
        dft.reset()
    tgt.prefill(list(ctx), (lambda s, k: dft.inject(tgt.features(slice(0, k), k), s)) if dft is not None else None)
    pos, pool = tgt.n_past, list(ctx) + list(cont)
    out = []
    for n in sizes:
        if n > tgt.n_batch:
            continue
        for src in sources:
            if deadline is not None and time.perf_counter() > deadline:
                return out
            if src == "ddtree" and dft is None:
                continue
            tree = make_tree(src, n, root, cont, pool, rng, engine, pos)
            k = len(tree)
            nodes = np.arange(k)
            if max_nodes is not None and k > max_nodes:
                nodes = np.concatenate([[0], np.sort(rng.choice(np.arange(1, k), max_nodes - 1, replace=False))])
            a = tree_rows(tgt, tree.tokens, tree.parents, nodes)
            batch_row = tgt.rows(nodes)  # the last verified tree's (a commit keeps the mapping)
            b = path_rows(tgt, tree.tokens, tree.parents, nodes)
            for i, br in zip(nodes, batch_row):
                i = int(i)
                out.append(dict(source=src, n=k, node=i, depth=int(tree.depth[i]), batch_row=int(br),
                                **row_diff(a[i], b[i])))
    return out


# -- the census --------------------------------------------------------------------------------
def census_prompt(engine, ids: list[int], n_tokens: int, budgets, deadline: float | None = None,
                  replay: bool = True) -> dict:
    """Plain decoding, then DDTree at each budget until its first divergence (module doc, part 1).

    Returns ``plain`` (output ids, steps, timed_out, near-tie positions of its 1-token rows) and per
    budget ``modes[f"ddtree@{B}"]``: emitted tokens compared, τ, ``drift`` rows ``[j, n_nodes, depth,
    max_abs, gap_shift, gap_shift_near]`` and ``divergence`` (None when equal)."""
    rows: list[np.ndarray] = []

    def keep(j, row, info):
        rows.append(np.array(row, np.float32))

    engine.set_draft("chain", 0)
    ref, meta = greedy_run(engine, ids, n_tokens, keep, deadline=deadline)
    gaps = [float(np.diff(np.partition(r, r.size - 2)[-2:])[0]) for r in rows]
    res = dict(n_prompt=len(ids), plain=dict(ids=ref, steps=meta["steps"], timed_out=meta["timed_out"],
                                             top2_gap_below_0_5=sum(g < 0.5 for g in gaps),
                                             top2_gap_below_1=sum(g < 1.0 for g in gaps)),
               modes={})
    for b in budgets:
        if deadline is not None and time.perf_counter() > deadline:
            break
        engine.set_draft("ddtree", b)
        drift: list[list] = []
        found: dict = {}

        def check(j, row, info):
            if info is None or j >= len(ref) or found:
                return
            d = row_diff(row, rows[j])
            drift.append([j, info["n_nodes"], info["depth"], round(d["max_abs"], 5), round(d["gap_shift"], 5),
                          round(d["gap_shift_near"], 5)])
            t = int(np.argmax(row))
            if t != ref[j]:
                p, s = ref[j], t
                found.update(index=j, plain_token=p, spec_token=s, n_nodes=info["n_nodes"], node=info["node"],
                             depth=info["depth"], batch_row=info["batch_row"], step_pos=info["pos"],
                             tree=dict(plain=float(row[p]), spec=float(row[s]), gap=float(row[s] - row[p])),
                             one_token=dict(plain=float(rows[j][p]), spec=float(rows[j][s]),
                                            gap=float(rows[j][p] - rows[j][s])),
                             row_vs_plain=d, _tree=(info["tokens"], info["parents"]))

        out, m = greedy_run(engine, ids, len(ref), check, stop=lambda: bool(found), deadline=deadline)
        div = None
        if found:
            div = dict(found)
            toks, pars = div.pop("_tree")
            div["flip"] = div["tree"]["gap"] + div["one_token"]["gap"]
            c = classify(engine.target, ids, ref, out, n_nodes=b + 1)
            div["prefill"] = dict(gaps=list(c.gaps) if c.gaps else None, near_tie=c.near_tie)
            if replay:
                div["replay"] = replay_divergence(engine, ids, ref, div, toks, pars)
        elif out != ref and not m["timed_out"]:
            i = next((k for k in range(min(len(out), len(ref))) if out[k] != ref[k]), min(len(out), len(ref)))
            div = dict(index=i, length_only=True, plain_len=len(ref), spec_len=len(out))
        res["modes"][f"ddtree@{b}"] = dict(budget=b, compared=len(drift), steps=m["steps"],
                                          tau=len(drift) / m["steps"] if m["steps"] else 0.0,
                                          timed_out=m["timed_out"], divergence=div, drift=drift)
    return res


def replay_divergence(engine, ids, ref, div, tokens, parents) -> dict:
    """The divergent step again on a fresh cache: prefill of the step's committed prefix, the same tree
    (the node's row), and the node's path one token at a time; both tokens' logits in each row."""
    tgt = engine.target
    j, node = div["index"], div["node"]
    prefix = list(ids) + list(ref[:j - div["depth"] - 1])
    assert len(prefix) == div["step_pos"]
    tgt.prefill(prefix)
    a = tree_rows(tgt, tokens, parents, [node])[node]
    b = path_rows(tgt, tokens, parents, [node])[node]
    p, s = div["plain_token"], div["spec_token"]
    return dict(tree=dict(plain=float(a[p]), spec=float(a[s]), gap=float(a[s] - a[p]), argmax=int(np.argmax(a))),
                one_token=dict(plain=float(b[p]), spec=float(b[s]), gap=float(b[p] - b[s]), argmax=int(np.argmax(b))),
                row_diff=row_diff(a, b))


# -- summaries ---------------------------------------------------------------------------------
def _q(x, q):
    return float(np.quantile(x, q)) if len(x) else None


def summarize_spread(rows: list[dict]) -> list[dict]:
    """Per (source, n): rows, max_abs (median, p99, max), rel max, gap_shift (p99, max), the largest
    |gap12_change|, flips and the largest 1-token gap at which a flip happened."""
    out = []
    for src, n in sorted({(r["source"], r["n"]) for r in rows}, key=lambda k: (SOURCES.index(k[0]), k[1])):
        rs = [r for r in rows if r["source"] == src and r["n"] == n]
        ma = [r["max_abs"] for r in rs]
        gs = [r["gap_shift"] for r in rs]
        gn = [r["gap_shift_near"] for r in rs]
        fl = [r["flip_gap"] for r in rs if r["flip"]]
        out.append(dict(source=src, n=n, rows=len(rs), max_abs_median=_q(ma, 0.5), max_abs_p99=_q(ma, 0.99),
                        max_abs_max=max(ma), rel_max=max(r["rel"] for r in rs), gap_shift_p99=_q(gs, 0.99),
                        gap_shift_max=max(gs), gap_shift_near_p99=_q(gn, 0.99), gap_shift_near_max=max(gn),
                        gap12_change_max=max(abs(r["gap12_change"]) for r in rs),
                        flips=len(fl), flip_fraction=len(fl) / len(rs), flip_gap_max=max(fl) if fl else None))
    return out


def summarize_census(prompts: list[dict], budgets) -> list[dict]:
    """Per budget: prompts run, tokens compared, τ, divergences (and how many outside the tie gap by the
    prefill rule and the backend's tie gap), the largest plain 1-token gap and flip at a divergence, and the drift over every
    compared row (max_abs median / max, gap_shift max)."""
    out = []
    for b in budgets:
        ms = [p["modes"][f"ddtree@{b}"] for p in prompts if f"ddtree@{b}" in p["modes"]]
        if not ms:
            continue
        divs = [m["divergence"] for m in ms if m["divergence"] and not m["divergence"].get("length_only")]
        drift = [r for m in ms for r in m["drift"]]
        ma = [r[3] for r in drift]
        steps = sum(m["steps"] for m in ms)
        out.append(dict(mode=f"ddtree@{b}", prompts=len(ms), compared=len(drift),
                        tau=len(drift) / steps if steps else 0.0, divergences=len(divs),
                        length_only=sum(1 for m in ms if m["divergence"] and m["divergence"].get("length_only")),
                        not_near_ties=sum(1 for d in divs if not d["prefill"]["near_tie"]),
                        one_token_gap_max=max((d["one_token"]["gap"] for d in divs), default=None),
                        flip_max=max((d["flip"] for d in divs), default=None),
                        drift_max_abs_median=_q(ma, 0.5), drift_max_abs_max=max(ma) if ma else None,
                        drift_gap_shift_max=max((r[4] for r in drift), default=None),
                        drift_gap_shift_near_max=max((r[5] for r in drift), default=None)))
    return out


def _f(x, w=7, p=3):
    return f"{'-':>{w}}" if x is None else f"{x:{w}.{p}f}"


def print_tables(doc: dict) -> None:
    print("\ncensus (first divergence per prompt from plain greedy decoding)")
    print("mode         prompts compared    tau  diverged (not ties)  1tok-gap max  flip max  "
          "drift |d| med / max  gap-shift max  near max")
    for s in doc["census_summary"]:
        print(f"{s['mode']:12s} {s['prompts']:7d} {s['compared']:8d} {s['tau']:6.2f}  {s['divergences']:8d} "
              f"({s['not_near_ties']})  {_f(s['one_token_gap_max'], 16)}  {_f(s['flip_max'])}  "
              f"{_f(s['drift_max_abs_median'])} / {_f(s['drift_max_abs_max'])}  {_f(s['drift_gap_shift_max'], 13)}  "
              f"{_f(s['drift_gap_shift_near_max'], 8)}")
    for p in doc["census"]:
        for label, m in p["modes"].items():
            d = m["divergence"]
            if d and not d.get("length_only"):
                r = d.get("replay") or {}
                print(f"  {p['set']}/{p['prompt_id']} {label}: token {d['index']} plain {d['plain_token']} vs "
                      f"{d['spec_token']}; tree row (n={d['n_nodes']}, node {d['node']}, depth {d['depth']}, "
                      f"batch row {d['batch_row']}) spec - plain {d['tree']['gap']:+.3f}; 1-token row plain - spec "
                      f"{d['one_token']['gap']:+.3f}; prefill gaps {d['prefill']['gaps']}; row |d| max "
                      f"{d['row_vs_plain']['max_abs']:.3f}"
                      + (f"; replay: tree {r['tree']['gap']:+.3f}, 1-token {r['one_token']['gap']:+.3f}" if r else ""))
            elif d:
                print(f"  {p['set']}/{p['prompt_id']} {label}: lengths differ from token {d['index']}")
    print("\npass spread (node row of an n-node pass against its path decoded one token at a time)")
    print("source      n   rows  |d| med    p99    max   rel max  gap-shift p99    max  near p99    max  "
          "gap12 chg  flips  flip gap max")
    for s in doc["spread_summary"]:
        print(f"{s['source']:9s} {s['n']:4d} {s['rows']:6d} {_f(s['max_abs_median'])} {_f(s['max_abs_p99'], 6)} "
              f"{_f(s['max_abs_max'], 6)}  {_f(s['rel_max'], 7, 4)}  {_f(s['gap_shift_p99'], 13)} "
              f"{_f(s['gap_shift_max'], 6)}  {_f(s['gap_shift_near_p99'], 8)} {_f(s['gap_shift_near_max'], 6)}  {_f(s['gap12_change_max'], 9)}  {s['flips']:5d}  {_f(s['flip_gap_max'], 12)}")
    print(f"(the near-tie rule, tfm_local.lossless.tie_gap, assumes {doc['tie_gap']} here; a flip at a 1-token gap g needs a "
          f"gap shift above g; near: competitors within {NEAR} of the best)")


# -- main --------------------------------------------------------------------------------------
def interleaved_prompts(sets, n: int):
    """The first ``n`` prompts of each set, taken in turn: (set, Prompt) pairs."""
    from tfm_local.files.datasets import load_prompt_set

    lists = [(s, load_prompt_set(s, n)) for s in sets]
    return [(s, ps[i]) for i in range(n) for s, ps in lists if i < len(ps)]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the JSON to write (rewritten after every prompt and position)")
    ap.add_argument("--target", default=None, help="target GGUF or built-in name (default: the default target)")
    ap.add_argument("--drafter", default="auto", help="drafter GGUF (default: the target's default drafter)")
    ap.add_argument("--draft-vocab", default="auto", help="as tfm-bench's (default auto)")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated prompt sets")
    ap.add_argument("--prompts", type=int, default=40, help="first N prompts of each set (default 40)")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per prompt (default 256)")
    ap.add_argument("--budgets", type=int_list, default=[64, 128], help="DDTree budgets (drafted nodes; default 64,128)")
    ap.add_argument("--sizes", type=int_list, default=[1, 16, 64, 128],
                    help="pass sizes of the spread, nodes with the root (default 1,16,64,128)")
    ap.add_argument("--sources", default="ddtree,chain", help=f"spread trees, of {', '.join(SOURCES)} (default ddtree,chain)")
    ap.add_argument("--positions", type=int, default=4, help="spread positions per prompt at most (default 4)")
    ap.add_argument("--max-nodes", type=int, default=None, help="spread: node rows checked per tree (default all)")
    ap.add_argument("--time-limit", type=float, default=280.0, help="seconds in all (default 280)")
    ap.add_argument("--spread-share", type=float, default=0.35, help="share of the time left to the spread (default 0.35)")
    ap.add_argument("--no-replay", action="store_true", help="no fresh-cache replay of each divergence")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default all cores)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is available")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.sets = [s.strip() for s in a.sets.split(",") if s.strip()]
    a.sources = [s.strip() for s in a.sources.split(",") if s.strip()]
    if set(a.sources) - set(SOURCES) or a.prompts < 1 or a.tokens < 2 or not 0 <= a.spread_share <= 1:
        ap.error(f"need --sources of {', '.join(SOURCES)}, --prompts >= 1, --tokens >= 2, 0 <= --spread-share <= 1")
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    t0 = time.perf_counter()
    check_writable(a.out, "--out")
    from tfm_local.engine import Engine
    from tfm_local.llama.model import gpu_available

    end = t0 + a.time_limit
    census_end = t0 + (1 - a.spread_share) * a.time_limit
    eng = Engine(a.target, a.drafter, n_ctx=a.n_ctx, budget=None, tree="ddtree", n_threads=a.threads,
                 n_gpu_layers=0 if a.cpu else -1, greedy_argmax="host", draft_vocab=a.draft_vocab)
    on_gpu = gpu_available() and not a.cpu
    doc = dict(run_record(argv), backend="cuda" if on_gpu else "cpu",
               device=device_name("gpu" if on_gpu else "cpu"), host=platform.node(),
               target=str(eng.target.model.path), drafter=str(eng.drafter.model.path) if eng.drafter else None,
               tie_gap=tie_gap(eng.target), budgets=a.budgets, sizes=a.sizes, sources=a.sources, complete=False,
               census=[], census_summary=[], spread=[], spread_summary=[])

    def save():
        doc["census_summary"] = summarize_census(doc["census"], a.budgets)
        doc["spread_summary"] = summarize_spread(doc["spread"])
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
        write_json(a.out, doc)

    def say(msg):
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)

    prompts = interleaved_prompts(a.sets, a.prompts)
    kept = []  # (set, prompt id, prompt ids, plain output) for the spread
    cut = False
    try:
        for set_name, p in prompts:
            if time.perf_counter() > census_end:
                say("census: time is up")
                cut = True
                break
            ids = eng.prompt_tokens(p.messages)
            if len(ids) + a.tokens + 2 * max(a.budgets) > a.n_ctx:
                say(f"{set_name}/{p.id}: {len(ids)} prompt tokens do not fit, skipped")
                continue
            r = census_prompt(eng, ids, a.tokens, a.budgets, census_end, replay=not a.no_replay)
            r.update(set=set_name, prompt_id=p.id)
            cut |= r["plain"]["timed_out"] or any(m["timed_out"] for m in r["modes"].values())
            doc["census"].append(r)
            kept.append((set_name, p.id, ids, r["plain"]["ids"]))
            parts = []
            for label, m in r["modes"].items():
                d = m["divergence"]
                parts.append(f"{label} τ {m['tau']:.2f} " + ("equal" if d is None else
                             f"lengths differ at {d['index']}" if d.get("length_only") else
                             f"diverged at {d['index']} (n={d['n_nodes']} depth {d['depth']}: 1-token gap "
                             f"{d['one_token']['gap']:.3f}, tree {d['tree']['gap']:+.3f}, prefill {d['prefill']['gaps']})"))
            say(f"{set_name}/{p.id}: plain {len(r['plain']['ids'])} tokens; " + "; ".join(parts))
            save()
        rng = np.random.default_rng(a.seed)
        for rnd in range(a.positions):
            for set_name, pid, ids, ref in kept:
                if time.perf_counter() > end:
                    break
                if len(ref) < 2:
                    continue
                j = int(rng.integers(0, len(ref) - 1))
                rows = spread_position(eng, ids + ref[:j], ref[j], ref[j + 1:], a.sizes, a.sources, rng,
                                       a.max_nodes, end)
                for x in rows:
                    x.update(set=set_name, prompt_id=pid, offset=j)
                doc["spread"].extend(rows)
                worst = max((x["max_abs"] for x in rows), default=float("nan"))
                say(f"spread {set_name}/{pid} offset {j}: {len(rows)} rows, max |d| {worst:.4f}, "
                    f"flips {sum(x['flip'] for x in rows)}")
                save()
            if time.perf_counter() > end:
                say("spread: time is up")
                cut = True
                break
        doc["complete"] = not cut
    except KeyboardInterrupt:
        say("interrupted: writing what there is")
    finally:
        save()
        eng.close()
    print_tables(doc)
    print(f"wrote {a.out}")
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
