"""τ of MT-Bench's categories in tfm-bench JSON files, side by side:

    python -m tfm_local.bench.tau_by_category BENCH.json [BENCH.json ...] [--mode chain]

τ of a category = its prompts' tokens over their steps (``n_step_tokens`` / ``n_steps`` summed, as
tfm-bench's own τ of a set); the categories come from the prompt set's records (``tfm_local.files.datasets``).
Prints one row per category and file, and the set's τ.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from tfm_local.files.datasets import load_prompt_set


def tau_by_category(bench: dict, mode: str = "chain") -> dict[str, float]:
    """{category: τ} (and "all") of ``bench``'s MT-Bench runs of ``mode``; empty when it has none."""
    runs = [r for r in bench["runs"] if r["set"] == "mtbench" and r["mode"] == mode]
    if not runs:
        return {}
    category = {p.id: p.meta["category"] for p in load_prompt_set("mtbench")}
    sums = defaultdict(lambda: [0, 0])
    for r in runs:
        for key in (category[r["prompt_id"]], "all"):
            sums[key][0] += r["n_step_tokens"]
            sums[key][1] += r["n_steps"]
    return {k: t / s for k, (t, s) in sums.items() if s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="+", help="tfm-bench --json files")
    ap.add_argument("--mode", default="chain", help="tfm-bench mode (default chain)")
    a = ap.parse_args(argv)
    tables = {path: tau_by_category(json.load(open(path)), a.mode) for path in a.bench}
    cats = sorted({c for t in tables.values() for c in t} - {"all"}) + ["all"]
    print(f"{'category':12}" + "".join(f" {path[-28:]:>28}" for path in a.bench))
    for c in cats:
        print(f"{c:12}" + "".join(f" {tables[p].get(c, float('nan')):28.3f}" for p in a.bench))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
