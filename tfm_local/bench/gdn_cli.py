"""tfm-bench gdn: the Gated DeltaNet tree ops against per-branch recurrent verification (docs/gdn-tree.md).

For each tree size (``--nodes``) one DDTree-shaped tree (tfm_local/gdn_bench.py) at the given layer
dimensions (defaults: Qwen3.6-27B's Gated DeltaNet, 48 layers): the tree op
(``ggml_gated_delta_net_tree``) vs every root-to-leaf path verified as its own sequence with upstream
``ggml_gated_delta_net`` (leaves grouped by path length, one call per group, group times summed; also
all leaves in one call padded to the deepest path), the same for the short conv (``ggml_ssm_conv_tree`` vs
``ggml_ssm_conv``), and the two commit ops. Each case is checked for equal outputs before it is timed;
an incorrect case is not timed and makes the exit status 1. Prints a table of per-layer times (medians,
ms) and writes JSON (``--json``) with medians and minima. ``--repeat R`` (R >= 2) also times every op as a
graph of R copies and reports the ops' own times, without the launch and synchronize each call pays
(``op_harness.op_time``), in a second table. ``--trees FILE`` times real draft trees instead of synthetic
ones (lab/capture_trees.py records them from the drafter's DDTree), ``--tree-count`` of them spread over
the file's range of per-branch cost; the bar then takes the median speedup over them.

    tfm-bench gdn --device gpu --repeat 8 --json gdn-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

import numpy as np

from . import gdn as gdn_bench
from ..testing import op_harness
from ..files.atomic import sha256_file
from ..cli.common import add_timing_args, check_writable, device_name, fail, int_list, positive_int, run_record, write_json
from ..cli.program import alias_note, program_name
from .provenance import provenance

D_CONV_MAX = 16  # GGML_SSM_CONV_TREE_MAX_D_CONV (patch 0005): a larger kernel aborts in ggml_ssm_conv_tree
BAR_NODES, BAR_SPEEDUP = 128, 7.0  # the target set for the ops (docs/gdn-tree.md): at 128 nodes the tree op >= 7x faster than per-branch
METHOD = ("per-branch = every root-to-leaf path as its own sequence of upstream ggml_gated_delta_net / "
          "ggml_ssm_conv, leaves grouped by path length, one call per group (n_seqs = leaves in the group, "
          "state replicated per sequence), time = sum over groups of each group's median (min: of its min); "
          "padded = all leaves in one call, paths zero-padded to the deepest; times are per layer, "
          "compute + synchronize of a one-op graph with inputs already on the device; op_ms (with --repeat R): "
          "(median of a graph of R copies - median of one) / (R - 1), the op's own time; with --rounds K: "
          "every op timed once a round, K rounds, the median of each statistic over the rounds")


def parse_args(argv=None) -> argparse.Namespace:
    d = gdn_bench.Dims()
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-gdn"), description=__doc__.split("\n")[0],
                                 epilog=alias_note("tfm-bench gdn"))
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="backend (default cpu)")
    ap.add_argument("--nodes", type=int_list, default=[16, 32, 64, 128], help="tree sizes (default 16,32,64,128)")
    for name, default, what in (("heads-v", d.heads_v, "value heads H_v"), ("heads-k", d.heads_k, "q/k heads H_k"),
                                ("head-dim", d.head_dim, "S_k = S_v"), ("conv-channels", d.conv_channels,
                                 "short-conv channels"), ("d-conv", d.d_conv, "conv kernel size"),
                                ("layers", d.layers, "DeltaNet layers (for the model-step totals)")):
        ap.add_argument(f"--{name}", type=positive_int, default=default, help=f"{what} (default {default})")
    ap.add_argument("--repeat", type=positive_int, default=1,
                    help=f"also time each op as a graph of this many copies (2..{op_harness.BENCH_MAX_REPEAT}) "
                         "for the ops' own times (default 1: calls only)")
    ap.add_argument("--trees", metavar="NPZ", help="time the real draft trees of this file (lab/capture_trees.py; "
                    "--nodes is then ignored) instead of synthetic DDTrees")
    ap.add_argument("--tree-count", type=positive_int, default=5,
                    help="with --trees: how many of its trees, spread over their per-branch cost (default 5)")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="time every op this many times in turn and report the medians over the rounds "
                         "(default 1; more keep a busy host from favouring one side)")
    add_timing_args(ap, iters=20, warmup=3, threads=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    if a.repeat > op_harness.BENCH_MAX_REPEAT:
        ap.error(f"--repeat must be at most {op_harness.BENCH_MAX_REPEAT}, got {a.repeat}")
    if not 2 <= a.d_conv <= D_CONV_MAX:
        ap.error(f"--d-conv must be in 2..{D_CONV_MAX} (llama.cpp's short conv; the tree conv's "
                 f"GGML_SSM_CONV_TREE_MAX_D_CONV), got {a.d_conv}")
    if a.heads_v % a.heads_k:
        ap.error(f"--heads-v ({a.heads_v}) must be a multiple of --heads-k ({a.heads_k})")
    return a


def _row(cells, widths) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def _x(ratio: float | None) -> str:
    """A speedup as printed ("-" when undefined: an op time by differences <= 0)."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def print_tables(cases: list[dict], layers: int) -> None:
    """The per-layer medians (ms) of every timed case: GDN, conv (calls, and the ops' own times when
    timed with --repeat), commits."""
    w = (5, 6, 5, 10, 10, 10, 8, 8)
    with_op = any("op_ms" in c["times"]["gdn"]["tree"] for c in cases if "times" in c)
    for op in ("gdn", "conv"):
        for key, ksuf, what in (("median_ms", "", "median ms per call"), ("op_ms", "_op", "op's own ms"))[:1 + with_op]:
            print(f"\n{op}: per layer, {what} (speedup = per-branch / tree)")
            print(_row(("N", "leaves", "depth", "tree", "branch", "padded", "speedup", "padded"), w))
            for c in cases:
                if "times" in c:
                    t, s = c["times"][op], c["speedup"]
                    print(_row((c["nodes"], c["leaves"], c["depth"], f"{t['tree'][key]:.4f}",
                                f"{t['branch'][key]:.4f}", f"{t['padded'][key]:.4f}",
                                _x(s[op + ksuf]), _x(s[op + '_padded' + ksuf])), w))
                else:
                    print(_row((c["nodes"], c["leaves"], c["depth"], "INCORRECT", "-", "-", "-", "-"), w))
    print("\ncommit (deepest path): per layer, median ms")
    print(_row(("N", "depth", "gdn", "conv", f"x{layers} lay."), (5, 5, 10, 10, 10)))
    for c in cases:
        if "times" in c:
            t = c["times"]["commit"]
            tot = layers * (t["gdn"]["median_ms"] + t["conv"]["median_ms"])
            print(_row((c["nodes"], c["depth"], f"{t['gdn']['median_ms']:.4f}", f"{t['conv']['median_ms']:.4f}",
                        f"{tot:.3f}"), (5, 5, 10, 10, 10)))


def bar_result(cases: list[dict]) -> dict | None:
    """The issue's bar: GDN speedup (grouped per-branch) at BAR_NODES nodes >= BAR_SPEEDUP, the median over
    the timed cases of that size (several with --trees); None without one."""
    timed = [c["speedup"] for c in cases if c["nodes"] == BAR_NODES and "speedup" in c]
    if not timed:
        return None
    speedup = float(np.median([s["gdn"] for s in timed]))
    out = {"nodes": BAR_NODES, "required": BAR_SPEEDUP, "speedup": speedup, "met": bool(speedup >= BAR_SPEEDUP),
           "n_trees": len(timed)}
    ops = [s["gdn_op"] for s in timed if s.get("gdn_op") is not None]
    if ops:  # for information: the ratio of the ops' own times
        out["speedup_op"] = float(np.median(ops))
    return out


def case_trees(a: argparse.Namespace) -> list:
    """(n_nodes, tree or None, what the case records about the tree) per case: the --nodes sizes
    (synthetic trees), or the --trees file's picks (row index and prompt set)."""
    if not a.trees:
        return [(n, None, {}) for n in a.nodes]
    try:
        picks = gdn_bench.load_trees(a.trees, a.tree_count)
    except (OSError, ValueError) as e:
        fail(f"--trees: {e}")
    return [(len(t), t, {"tree_index": i, "tree_set": s}) for i, s, t in picks]


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.json:
        check_writable(a.json, "--json")
    dims = gdn_bench.Dims(a.heads_v, a.heads_k, a.head_dim, a.conv_channels, a.d_conv, a.layers)
    rng = np.random.default_rng(a.seed)
    cases = []
    for n, tree, about in case_trees(a):
        try:
            c = {**gdn_bench.run_case(n, dims, rng, a.device, a.threads, a.warmup, a.iters, a.repeat, a.rounds, tree),
                 **about}
        except op_harness.NativeError as e:
            fail(str(e))
        print(f"N={n}: {c['leaves']} leaves, depth {c['depth']}, groups {c['groups']}, correct "
              f"{c['check']['correct']}", file=sys.stderr, flush=True)
        cases.append(c)
    print(f"device {a.device}, dims {asdict(dims)}\nmethod: {METHOD}")
    print_tables(cases, a.layers)
    bar = bar_result(cases)
    if bar:
        print(f"\nbar: gdn speedup at {BAR_NODES} nodes {bar['speedup']:.2f}x"
              + (f" (median of {bar['n_trees']} trees)" if bar["n_trees"] > 1 else "") + f" (required >= {BAR_SPEEDUP}x): "
              f"{'met' if bar['met'] else 'NOT met'}"
              + (f"; ops' own times {_x(bar['speedup_op'])}" if "speedup_op" in bar else ""))
    if a.json:
        doc = {**run_record(argv), "device": a.device, "device_name": device_name(a.device),
               "threads": a.threads, "dims": asdict(dims), "iters": a.iters, "repeat": a.repeat, "rounds": a.rounds,
               "warmup": a.warmup, "seed": a.seed,
               **({"trees": os.path.abspath(a.trees), "trees_sha256": sha256_file(a.trees)} if a.trees else {}),
               "method": METHOD, "bar": bar, "cases": cases, "provenance": provenance({"trees": a.trees})}
        write_json(a.json, doc)
    if not all(c["check"]["correct"] for c in cases):
        print("some cases were not correct (not timed): see the check errors", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
