"""Tree-building time with a Weaver: the TfM w-wide heap against DARTree, on the host and on the backend.

    tfm-bench trees --weaver weaver-q8_0.gguf --target ~/w/model.gguf --budgets 16,64 --json trees.json

For each device the Weaver loads on (``--devices``, default the CPU, and the GPU when there is one), each
budget B, on the same random drafts of the Weaver's shape (the target's embedding rows, random prefixes,
candidates and logits; the tree's shape, not its quality, sets the cost): the median ms of a tree

- ``tfm``: the w-wide heap (``decode.weaver.tfm_tree``; ⌈B/16⌉ entries a round, one Weaver call a round);
- ``dartree_host``: DARTree with one Weaver call a depth and the supertree on the host
  (``tree.build_dartree`` with ``WeaverPaths``);
- ``dartree``: DARTree in one backend call (``Weaver.dartree``: the supertree, its scores and the global
  top-B on the device), as the engine builds it;

and how many of the drafts' DARTrees the two builders made node for node alike (``same``; float32 ties
aside they should all be). Prints a table, writes JSON. Timing only: the engine's ``tfm-bench`` gives τ
and tokens/s of ``tfm@B`` and ``dartree@B``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ..cli.program import alias_note, program_name


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-trees"), description=__doc__.split("\n")[0],
                                 epilog=alias_note("tfm-bench trees"))
    ap.add_argument("--weaver", required=True, help="Weaver GGUF (tfm-train weaver, tfm-convert --weaver)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="target GGUF or built-in name")
    ap.add_argument("--budgets", default="16,64", help="drafted nodes a tree (default 16,64)")
    ap.add_argument("--width", type=int, default=12, help="DARTree's live branches a depth (default 12, at most 256)")
    ap.add_argument("--beta", type=float, default=-0.2, help="DARTree's depth bonus, <= 0 (default -0.2)")
    ap.add_argument("--devices", default=None, help="cpu,gpu (default: cpu, and gpu when there is one)")
    ap.add_argument("--drafts", type=int, default=20, help="random drafts timed (default 20)")
    ap.add_argument("--threads", type=int, default=4, help="CPU threads of the Weaver (default 4, as the engine)")
    ap.add_argument("--json", default=None, help="write the table here")
    return ap.parse_args(argv)


def _median_ms(fn, drafts) -> tuple[float, list]:
    fn(*drafts[0])  # warm-up: graphs built, buffers allocated
    times, out = [], []
    for d in drafts:
        t0 = time.perf_counter()
        out.append(fn(*d))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times)), out


def main(argv=None) -> int:
    from tfm_local.decode.tree import build_dartree
    from tfm_local.decode.weaver import TargetEmbeddings, Weaver, WeaverPaths, tfm_tree
    from tfm_local.files.models import resolve_model
    from tfm_local.llama.model import gpu_available
    from tfm_local.llama.weaver_native import DARTREE_MAX_WIDTH

    a = parse_args(argv)

    def fail(msg: str) -> int:
        print(f"{program_name('tfm-bench-trees')}: {msg}", file=sys.stderr)
        return 2

    try:
        budgets = [int(b) for b in a.budgets.split(",")]
    except ValueError:
        return fail(f"--budgets must be comma-separated integers, got {a.budgets!r}")
    if not a.beta <= 0 or a.width < 1 or a.drafts < 1 or min(budgets) < 1:
        return fail("--beta must be <= 0, --width, --drafts and every budget >= 1")
    if a.width > DARTREE_MAX_WIDTH:
        return fail(f"--width {a.width} is above the backend DARTree's limit of {DARTREE_MAX_WIDTH} live branches a depth")
    if a.json:
        from tfm_local.cli.common import check_writable

        try:
            check_writable(a.json, "--json")
        except SystemExit:
            return 2
    devices = a.devices.split(",") if a.devices else ["cpu"] + (["gpu"] if gpu_available() else [])
    if not set(devices) <= {"cpu", "gpu"}:
        return fail(f"--devices takes cpu and gpu, got {a.devices!r}")
    try:
        target = str(resolve_model(a.target))
        embed = TargetEmbeddings(target)
    except Exception as e:  # an unreadable or missing target: a clear line, not a traceback
        return fail(f"target {a.target}: {e}")
    rows = []
    for dev in devices:
        try:
            w = Weaver(a.weaver, dev, a.threads)
            t0 = time.perf_counter()
            w.attach_target(target)
        except Exception as e:  # a missing or malformed Weaver, one of another target, no such device
            return fail(f"Weaver {a.weaver} on the {dev}: {e}")
        attach_s = time.perf_counter() - t0
        s, rng = w.shape, np.random.default_rng(0)
        D, K = s["depth"], s["top_k"]
        drafts = []
        for _ in range(a.drafts):
            cand = np.stack([rng.choice(embed.n_vocab, K, replace=False) for _ in range(D)]).astype(np.int32)
            drafts.append((int(rng.integers(embed.n_vocab)), rng.standard_normal(s["target_hidden"]).astype(np.float32),
                           rng.standard_normal((D, s["drafter_hidden"])).astype(np.float32), cand,
                           (3 * rng.standard_normal((D, K))).astype(np.float32)))
        for B in budgets:
            tfm_ms, _ = _median_ms(lambda r, ht, hd, c, lg: tfm_tree(w, embed, r, ht, hd, c, lg, B), drafts)
            host_ms, host = _median_ms(lambda r, ht, hd, c, lg: build_dartree(
                r, c, B, WeaverPaths(w, embed, r, ht, hd, c, lg, capacity=1 + a.width * D), a.width, a.beta), drafts)
            dev_ms, dev_trees = _median_ms(lambda r, ht, hd, c, lg: w.dartree(r, ht, hd, c, lg, B, a.width, a.beta),
                                           drafts)
            same = sum(t is not None and np.array_equal(t.parents, h.parents) and np.array_equal(t.tokens, h.tokens)
                       for t, h in zip(dev_trees, host))
            rows.append({"device": dev, "budget": B, "width": a.width, "top_k": K, "depth": D, "tfm_ms": tfm_ms,
                         "dartree_host_ms": host_ms, "dartree_ms": dev_ms, "dartree_over_tfm": dev_ms / tfm_ms,
                         "same": same, "drafts": len(drafts), "attach_s": attach_s})
        w.close()
    print(f"{'device':6} {'B':>4} {'tfm ms':>8} {'dartree host ms':>16} {'dartree ms':>11} {'÷ tfm':>6} {'same':>7}")
    for r in rows:
        print(f"{r['device']:6} {r['budget']:4d} {r['tfm_ms']:8.2f} {r['dartree_host_ms']:16.2f} {r['dartree_ms']:11.2f} "
              f"{r['dartree_over_tfm']:6.2f} {r['same']:3d}/{r['drafts']:<3d}")
    if a.json:
        from tfm_local.bench.provenance import provenance
        from tfm_local.files.atomic import write_json

        write_json(a.json, {"argv": list(sys.argv[1:] if argv is None else argv), "weaver": a.weaver, "target": target, "rows": rows,
                            "provenance": provenance({"weaver": a.weaver, "target": target})})
    return 0


if __name__ == "__main__":
    sys.exit(main())
