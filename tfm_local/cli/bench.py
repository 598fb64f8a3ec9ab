"""tfm-bench: τ and tokens/s of plain decoding vs speculative decoding on real prompt sets.

Modes run side by side in one process, prompt by prompt (plain, then each
speculative mode), so the ratio is measured under the same machine load.
Prints a table and writes JSON (per prompt and per set).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

from .common import add_engine_args, engine_from_args, fail


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tfm-bench", description=__doc__.split("\n")[0])
    add_engine_args(ap)
    ap.add_argument("--sets", default="humaneval,gsm8k,mtbench", help="comma-separated prompt sets")
    ap.add_argument("-n", "--n-prompts", type=int, default=40, help="first N prompts of each set (default 40)")
    ap.add_argument("--max-tokens", type=int, default=256, help="new tokens per prompt (default 256)")
    ap.add_argument("--modes", default="plain,chain", help="comma-separated: plain, chain")
    ap.add_argument("--json", default="bench.json", help="output JSON path (default bench.json)")
    return ap.parse_args(argv)


MODES = ("plain", "chain")


def run_one(engine, prompt, mode: str, max_tokens: int, budget: int | None) -> dict:
    """Greedy generation of one prompt in one mode; returns its stats and output token ids.

    ``mode`` "chain" uses the engine's draft shape (``--tree``) with ``budget``; "plain" drafts nothing.
    """
    from ..sampling import SamplingParams

    engine.set_budget(0 if mode == "plain" else budget)
    ids = engine.prompt_tokens(prompt.messages)
    out = list(engine.generate_ids(ids, max_tokens, SamplingParams()))
    d = engine.stats.to_dict()
    d.update(prompt_id=prompt.id, mode=mode if mode == "plain" else engine.tree_mode, budget=engine.budget,
             output_ids=out)
    return d


def aggregate(rows: list[dict]) -> dict:
    """Totals of a set of runs: τ = emitted / verify passes, tok/s = tokens / decode time."""
    steps = sum(r["n_steps"] for r in rows)
    toks = sum(r["n_step_tokens"] for r in rows)
    gen = sum(r["n_generated"] for r in rows)
    t = sum(r["t_decode"] for r in rows)
    return dict(n_prompts=len(rows), n_generated=gen, tau=toks / steps if steps else 0.0,
                tokens_per_s=gen / t if t else 0.0, t_draft=sum(r["t_draft"] for r in rows),
                t_verify=sum(r["t_verify"] for r in rows), t_decode=t)


def main(argv=None) -> None:
    args = parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        fail(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    if args.max_tokens < 1 or args.n_prompts < 1:
        fail("--max-tokens and -n must be >= 1")
    out_dir = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(out_dir) or os.path.isdir(args.json):
        fail(f"cannot write --json {args.json}: no such folder, or it is a folder")
    from ..data import load_prompt_set

    try:
        sets = {name: load_prompt_set(name, args.n_prompts) for name in args.sets.split(",")}
    except (ValueError, OSError) as e:
        fail(str(e))
    engine = engine_from_args(args)
    if "chain" in modes and engine.drafter is None:
        fail("mode 'chain' needs a drafter")
    runs, table = [], []
    for name, prompts in sets.items():
        for i, p in enumerate(prompts):
            for mode in modes:
                try:
                    runs.append(dict(run_one(engine, p, mode, args.max_tokens, args.budget), set=name))
                except ValueError as e:  # no chat template, prompt over the context
                    fail(str(e))
            print(f"\r{name}: {i + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        for mode in {r["mode"]: None for r in runs if r["set"] == name}:
            table.append(dict(set=name, mode=mode, **aggregate([r for r in runs if r["set"] == name and
                                                                  r["mode"] == mode])))
    print_table(table)
    write_json(args, table, runs, engine)
    engine.close()


def add_speedups(table: list[dict]) -> None:
    """Set each row's ``speedup``: its tokens/s over plain decoding's on the same set, None without a plain row."""
    base = {r["set"]: r["tokens_per_s"] for r in table if r["mode"] == "plain"}
    for r in table:
        r["speedup"] = r["tokens_per_s"] / base[r["set"]] if base.get(r["set"]) else None


def print_table(table: list[dict]) -> None:
    """Print the summary table (after ``add_speedups``, so the JSON gets them too); speed-up ``-`` without plain."""
    add_speedups(table)
    print(f"{'set':<10} {'mode':<7} {'prompts':>7} {'tokens':>7} {'tau':>6} {'tok/s':>7} {'speedup':>8}")
    for r in table:
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        print(f"{r['set']:<10} {r['mode']:<7} {r['n_prompts']:>7} {r['n_generated']:>7} {r['tau']:>6.2f} "
              f"{r['tokens_per_s']:>7.1f} {sp:>8}")


def write_json(args, table, runs, engine) -> None:
    doc = dict(command=" ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               machine=dict(platform=platform.platform(), cpus=os.cpu_count()),
               target=str(engine.target.model.path), drafter=str(engine.drafter.model.path) if engine.drafter
               else None, max_tokens=args.max_tokens, summary=table, runs=runs, written=time.time())
    tmp = args.json + ".part"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.json)
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
