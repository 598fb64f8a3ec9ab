"""Real DDTree shapes from the shipped drafter, for the tree-GDN benchmark (docs/gdn-tree.md).

Usage: PYTHONPATH=. python lab/capture_trees.py OUT.npz [--prompts 3] [--tokens 200] [--nodes 128]

Greedy generation with the default pair (CPU) in DDTree mode at budget NODES - 1 (root + NODES - 1
drafts) over the first PROMPTS prompts of HumanEval, GSM8K and MT-Bench (first turn), TOKENS new
tokens each; the parent array of every tree of exactly NODES nodes is kept (the engine cuts a draft to
the tokens still to generate, so TOKENS must exceed NODES, and the last trees of an answer are
smaller). Writes OUT.npz (``parents``: int32 [n_trees, NODES], ``set``: the prompt set of each tree),
then prints per set: trees, leaves and depth (median, range) and the tokens per-branch verification
processes (the sum of the root-to-leaf path lengths), beside the synthetic trees of
tfm_local.bench.gdn.ddtree for seeds 0-9 (what tfm-bench gdn times without --trees).
"""
import argparse
import sys

import numpy as np

from tfm_local.bench import gdn as gdn_bench
from tfm_local.files.datasets import load_prompt_set
from tfm_local.engine import Engine
from tfm_local.decode.sampling import SamplingParams

SETS = ("humaneval", "gsm8k", "mtbench")


def stats(parents: np.ndarray) -> tuple[int, int, int]:
    """(leaves, depth in nodes, per-branch tokens) of one parent array (root = -1)."""
    paths = gdn_bench.leaf_paths(gdn_bench.tree_from_parents(parents))
    return len(paths), max(map(len, paths)), sum(map(len, paths))


def show(name: str, rows: list[tuple[int, int, int]]) -> None:
    """One line of medians and ranges (nothing to show for no trees)."""
    if not rows:
        print(f"{name:10s}    0 trees", flush=True)
        return
    a = np.array(rows)
    parts = [f"{k} {np.median(a[:, j]):g} ({a[:, j].min()}-{a[:, j].max()})"
             for j, k in enumerate(("leaves", "depth", "per-branch tokens"))]
    print(f"{name:10s} {len(rows):4d} trees  " + "  ".join(parts), flush=True)


def capture(n_prompts: int, max_tokens: int, nodes: int) -> tuple[list[np.ndarray], list[str]]:
    """The parent arrays of every verified tree of ``nodes`` nodes, and the prompt set of each."""
    eng = Engine(budget=nodes - 1, tree="ddtree", n_gpu_layers=0)
    trees, sets, current = [], [], [None]

    def recording(rec, stretch):  # Engine.on_step: each step's record holds the tree it verified
        if rec.n_nodes == nodes:
            trees.append(np.asarray(rec.tree.parents, np.int32))
            sets.append(current[0])

    eng.on_step = recording
    for current[0] in SETS:
        for p in load_prompt_set(current[0], n_prompts):
            list(eng.generate_ids(eng.prompt_tokens(p.messages), max_tokens, SamplingParams()))
    return trees, sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the .npz to write")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set (default 3)")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per prompt (default 200)")
    ap.add_argument("--nodes", type=int, default=128, help="tree size, root included (default 128)")
    a = ap.parse_args()
    if a.prompts < 1 or a.nodes < 2 or a.tokens <= a.nodes:
        ap.error("need --prompts >= 1, --nodes >= 2 and --tokens > --nodes (drafts are cut to the tokens left)")
    trees, sets = capture(a.prompts, a.tokens, a.nodes)
    if not trees:
        sys.exit(f"no tree of {a.nodes} nodes was drafted: nothing written")
    np.savez(a.out, parents=np.stack(trees), set=np.array(sets))
    print(f"wrote {len(trees)} trees to {a.out}")
    for name in SETS:
        show(name, [stats(t) for t, s in zip(trees, sets) if s == name])
    show("synthetic", [stats(gdn_bench.ddtree(a.nodes, np.random.default_rng(s)).parents) for s in range(10)])


if __name__ == "__main__":
    main()
