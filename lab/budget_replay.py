"""Replay the automatic budget (tfm_local.decode.budget.BudgetPolicy) over recorded drafter marginals
(lab/acceptance_traces.py) with a GPU's measured step costs: its speed against plain decoding per set,
without the GPU.

Usage: PYTHONPATH=. python lab/budget_replay.py TRACES.npz [--shape chain|ddtree|both] [--fixed B]
       [--set FIELD=VALUE ...] [--seeds N] [--json OUT]

Every answer of the traces is replayed in order (the sets as tfm-bench runs them, one BudgetPolicy kept
across them as an Engine keeps one per draft shape): each step asks ``choose`` for a budget, builds the
tree the engine would from the drafter's top-K at that position (a probe's curve only its budget deep,
``step.draft_tree``), accepts along the target's greedy answer, and gives ``observe`` a step record with
the costs below. ``--fixed B`` replays a fixed budget instead (DDTree@16 is ``--shape ddtree --fixed
15``), which checks the traces and costs against a bench. ``--set`` overrides BudgetConfig fields
(``budget.GPU`` is the base), e.g. ``--set overhead=0.0025``.

Costs (H200, default pair, ms; tfm-bench's phases and llama-bench's pass sizes, docs/notebook/gpu.md):
a plain step 1.88; a verification of n nodes (submit + pass + accept) 1.88 / 2.32 / 2.96 / 4.04 / 5.32 /
6.9 / 10.2 at n = 1 / 2 / 4 / 8 / 16 / 32 / 64; drafting 1.3 (pass, top-K, tree); a capturing plain step
0.35 more, a capture switch 1.5, a probe 3 more (injection of the deferred rows), a captured prompt 10 in
its prefill (measured: 11.2 + 0.005 a prompt token, docs/gpu.md), told to the budget (``observe_prompt``). Acceptance is greedy's; the drafts are the CPU drafter's (the GPU's agree but for near-ties).
"""
import argparse
import json
from dataclasses import replace

import numpy as np

from tfm_local.decode.accept import walk_tree
from tfm_local.decode.budget import GPU, BudgetPolicy, gain_curve, overrides as config_overrides
from tfm_local.decode.step import StepRecord
from tfm_local.decode.tree import build_chain, build_ddtree

SIZES_N = [1, 2, 4, 8, 16, 32, 64]
SIZES_MS = [1.88, 2.32, 2.96, 4.04, 5.32, 6.9, 10.2]
COSTS = dict(plain=1.88e-3, draft=1.3e-3, capture=0.35e-3, switch=1.5e-3, probe=3e-3, prompt=10e-3)


def pass_s(n: int) -> float:
    """Seconds of a verification of ``n`` nodes (module doc)."""
    return float(np.interp(n, SIZES_N, SIZES_MS)) * 1e-3


def accepted_path(tree, truth: np.ndarray) -> list[int]:
    """Node indices of the drafted tokens the target's greedy answer (``truth``: the next tokens, -1 past
    its end) accepts in ``tree``, root excluded: the engine's walk (``decode.accept.walk_tree``)."""
    return walk_tree(tree.parents, tree.tokens, lambda node: int(truth[tree.depth[node]])
                     if tree.depth[node] < len(truth) else -1).path[1:]


def realized(path: list[int], pred: np.ndarray, k: int) -> np.ndarray:
    """The accepted tokens of every sub-budget 1..k of this step's tree (its first b nodes: the accepted
    path's nodes numbered ≤ b), continued past k with the predicted curve's increments."""
    idx = np.asarray(path, dtype=np.int64)
    real = np.array([(idx <= b).sum() for b in range(1, k + 1)], dtype=np.float64)
    if len(pred) > k:
        real = np.concatenate([real, real[-1] + pred[k:] - pred[k - 1]])
    return real


def build(shape: str, cand: np.ndarray, logp: np.ndarray, k: int):
    depth = min(cand.shape[0], k)
    if shape == "chain":
        return build_chain(-1, cand[:depth, :1], logp[:depth, :1], k)
    return build_ddtree(-1, cand[:depth], logp[:depth], k)


def order(tr, seed: int) -> list[int]:
    """The answers' indices: as recorded (seed 0), or shuffled within each set, the sets in their order."""
    sets = [str(x) for x in tr["set"]]
    rng = np.random.default_rng(seed)
    out = []
    for name in dict.fromkeys(sets):
        idx = [i for i, x in enumerate(sets) if x == name]
        out += list(rng.permutation(idx)) if seed else idx
    return out


def replay(tr, shape: str, overrides: dict, fixed: int | None = None, max_tokens: int = 256,
           use_realized: bool = False, seed: int = 0, price_prompt: bool = True) -> dict:
    """Per-set time against plain decoding for the same tokens (prefills' extra included: ``ratio``; the
    decode steps alone, as tfm-bench's speed-up: ``decode_ratio``), τ, steps;
    ``seed`` > 0 replays the answers of each set in a shuffled order (``order``)."""
    k_cap = 15 if shape == "chain" else 63
    auto = BudgetPolicy(replace(GPU, **overrides))
    for n in (1, 2, 4, 8, 16, 32, 64):  # the engine's warm-up at load
        if n - 1 <= k_cap:
            for _ in range(2):
                auto.costs.record(n, pass_s(n))
    c = COSTS
    out = {}
    start, sets = tr["start"], tr["set"]
    capture = True
    for a in order(tr, seed):
        s0, s1 = int(start[a]), int(start[a + 1])
        L = s1 - s0
        row = out.setdefault(str(sets[a]), dict(time=0.0, plain=0.0, tokens=0, steps=0, spec=0, probes=0,
                                                 loss=dict(spec=0.0, probe=0.0, plain=0.0, prompt=0.0)))
        t, spec0 = 0.0, row["spec"]
        if fixed is None:
            cap = auto.capture_prompt(max_tokens, k_cap)
            t += c["prompt"] * cap + c["switch"] * (cap != capture)
            row["loss"]["prompt"] += c["prompt"] * cap + c["switch"] * (cap != capture)
            capture = cap
            auto.begin(cap)
            if cap and price_prompt:
                auto.observe_prompt(c["prompt"])
        e = 1  # the prefill emitted the answer's first token
        while e < L:
            remaining = max_tokens - e
            i = s0 + e
            if fixed is not None:
                k, probing, k_plan = min(fixed, L - e), False, fixed
            else:
                k = auto.choose(min(k_cap, remaining - 1), remaining)
                probing, k_plan = auto.probing, (k if auto.probing else min(k_cap, remaining - 1))
            sw = 0.0 if fixed is not None else c["switch"] * (auto.capture != capture)
            if fixed is None:
                capture = auto.capture
            if k:
                tree = build(shape, tr["cand"][i], tr["logp"][i].astype(np.float64), k_plan)
                curve = gain_curve(tree.logp[1:], k_plan)
                tree = tree.truncate(k)
                path = accepted_path(tree, tr["truth"][i])
                acc = min(len(path), L - e - 1)
                if use_realized:
                    curve = realized(path, curve, k)
                tv, td = pass_s(len(tree)), c["draft"] + c["probe"] * probing
                row["spec"] += not probing
                row["probes"] += probing
            else:
                curve, acc = None, 0
                tv, td = c["plain"] + c["capture"] * capture, 0.0
            if fixed is None:
                rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1] * (acc + 1), probe=k > 0 and probing,
                                 curve=curve if k else None, capture=capture)
                rec.phases["verify"], rec.phases["drafter"] = tv + sw, td
                rec.t_sync = c["probe"] * (k > 0 and probing)
                rec.switched = sw > 0
                auto.observe(rec)
            t += tv + td + sw
            kind = "plain" if not k else "probe" if probing else "spec"
            row["loss"][kind] += tv + td + sw - (acc + 1) * c["plain"]
            e += acc + 1
            row["steps"] += 1
        row["time"] += t
        row.setdefault("answers", []).append(dict(id=str(tr["prompt_id"][a]), tokens=L - 1, gain=(L - 1) * c["plain"] - t,
                                                  spec=row["spec"] - spec0))
        row["plain"] += (L - 1) * c["plain"]
        row["tokens"] += L - 1
    for row in out.values():
        row["ratio"] = row["plain"] / row["time"]  # speed-up against plain decoding
        # tfm-bench's headline speed-up: tokens a second of the decode steps, the prefill left out
        row["decode_ratio"] = row["plain"] / (row["time"] - row["loss"]["prompt"])
        row["tau"] = row["tokens"] / row["steps"]
    return out


def parse_set(items: list[str]) -> dict:
    """``FIELD=VALUE`` strings → BudgetConfig keyword arguments (``budget.overrides``); exits on an unknown field."""
    try:
        return config_overrides(items)
    except ValueError as e:
        raise SystemExit(str(e))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces")
    ap.add_argument("--shape", default="both", choices=["chain", "ddtree", "both"])
    ap.add_argument("--fixed", type=int, default=None)
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--cost", nargs="*", default=[], help="COSTS overrides, seconds: e.g. prompt=0.010")
    ap.add_argument("--orders", type=int, default=1, help="replay this many answer orders (the first as recorded)")
    ap.add_argument("--unpriced-prompt", action="store_true", help="the budget is not told what a captured prompt cost")
    ap.add_argument("--realized", action="store_true", help="steps report their realized acceptance curve")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    tr = dict(np.load(a.traces))
    ov = parse_set(a.set)
    for it in a.cost:
        k, _, v = it.partition("=")
        if k not in COSTS:
            raise SystemExit(f"no cost {k!r}: one of {', '.join(COSTS)}")
        COSTS[k] = float(v)
    res = {}
    for shape in (["chain", "ddtree"] if a.shape == "both" else [a.shape]):
        runs = [replay(tr, shape, ov, a.fixed, use_realized=a.realized, seed=k,
                       price_prompt=not a.unpriced_prompt) for k in range(a.orders)]
        res[shape] = runs[0] if a.orders == 1 else runs
        for s, row in runs[0].items():
            loss = " ".join(f"{k} {v * 1e3:+.0f}" for k, v in row["loss"].items())
            spread = ""
            if a.orders > 1:
                x = np.array([r[s]["ratio"] for r in runs])
                y = np.array([r[s]["decode_ratio"] for r in runs])
                spread = (f" (orders: mean {x.mean():.3f} sd {x.std(ddof=1):.3f} min {x.min():.3f}; decode steps "
                          f"alone mean {y.mean():.3f} min {y.min():.3f})")
            print(f"{shape:7s} {s:10s} x plain {row['ratio']:.3f} (decode {row['decode_ratio']:.3f}){spread}  tau {row['tau']:.2f}  steps {row['steps']:5d} "
                  f"spec {row['spec']:5d} probes {row['probes']:4d}  ms beyond plain: {loss}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(overrides=ov, fixed=a.fixed, results=res), f, indent=1)


if __name__ == "__main__":
    main()
