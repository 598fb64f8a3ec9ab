"""Real DDTree shapes from the shipped drafter, for the tree-GDN benchmark (docs/gdn-tree.md).

Usage: PYTHONPATH=. python docs/capture_trees.py OUT.npz [N_PROMPTS] [MAX_TOKENS] [NODES]

Greedy generation with the default pair (CPU) in DDTree mode at budget NODES - 1 (root + NODES - 1
drafts, default 128 nodes) over the first N_PROMPTS (default 3) prompts of HumanEval, GSM8K and
MT-Bench (first turn), MAX_TOKENS (default 200) new tokens each; the parent array of every tree of
NODES nodes is kept (the engine cuts a draft to the tokens still to generate: the last trees of an
answer are smaller). Writes OUT.npz (``parents``: int32 [n_trees, NODES], ``set``: the prompt set of each tree)
and prints per set: trees, leaves and depth (median, range) and the tokens per-branch verification
processes (the sum of the root-to-leaf path lengths), beside the synthetic trees of
tfm_local.gdn_bench.ddtree for seeds 0-9 (what tfm-bench-gdn times).
"""
import sys
import numpy as np
from tfm_local import gdn_bench
from tfm_local.data import load_prompt_set
from tfm_local.engine import Engine
from tfm_local.sampling import SamplingParams


def stats(parents: np.ndarray) -> tuple[int, int, int]:
    """(leaves, depth in nodes, per-branch tokens) of one parent array (root = -1)."""
    n = len(parents)
    depth = np.ones(n, np.int64)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    leaf = np.ones(n, bool)
    leaf[parents[parents >= 0]] = False
    return int(leaf.sum()), int(depth.max()), int(depth[leaf].sum())


def show(name: str, rows: list[tuple[int, int, int]]) -> None:
    a = np.array(rows)
    parts = [f"{k} {int(np.median(a[:, j]))} ({a[:, j].min()}-{a[:, j].max()})"
             for j, k in enumerate(("leaves", "depth", "per-branch tokens"))]
    print(f"{name:10s} {len(rows):4d} trees  " + "  ".join(parts), flush=True)


def main() -> None:
    out = sys.argv[1]
    given = [int(x) for x in sys.argv[2:5]]
    n_prompts, max_tokens, nodes = given + [3, 200, 128][len(given):]
    eng = Engine(budget=nodes - 1, tree="ddtree", n_gpu_layers=0)
    trees, sets = [], []
    draft = eng._draft

    def recording(*args, **kw):
        tree, curve = draft(*args, **kw)
        if len(tree) == nodes:
            trees.append(np.asarray(tree.parents, np.int32))
            sets.append(current)
        return tree, curve

    eng._draft = recording
    for current in ("humaneval", "gsm8k", "mtbench"):
        for p in load_prompt_set(current, n_prompts):
            list(eng.generate_ids(eng.prompt_tokens(p.messages), max_tokens, SamplingParams()))
        show(current, [stats(t) for t, s in zip(trees, sets) if s == current])
    np.savez(out, parents=np.stack(trees), set=np.array(sets))
    show("synthetic", [stats(gdn_bench.ddtree(nodes, np.random.default_rng(s)).parents) for s in range(10)])


if __name__ == "__main__":
    main()
