"""tfm-bench replay: chain τ of drafters on the greedy outputs a tfm-bench run recorded, without the
target's verify passes (tfm_local/replay.py).

    tfm-bench replay --from bench.json --drafter a-q8_0.gguf b-q4_0.gguf [--sets mtbench] [-n 20]

The outputs (``output_ids``) of each set and prompt of ``--from`` (any mode: at temperature 0 they
are the target's greedy outputs) are replayed with each drafter: one target prefill per prompt, then
the drafter's passes of the chain's steps. Prints τ per drafter and set (and MT-Bench's categories),
writes JSON (``--json``) with a tfm-bench-like run record per drafter, set and prompt.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from .replay import replay_chain, sequence_features
from ..cli.common import check_writable, fail, positive_int, run_record, write_json
from ..cli.program import alias_note, program_name
from .provenance import provenance


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-replay"), description=__doc__.split("\n\n")[0],
                                 epilog=alias_note("tfm-bench replay"))
    ap.add_argument("--from", dest="bench", required=True, help="a tfm-bench --json file with output_ids")
    ap.add_argument("--drafter", nargs="+", required=True, help="drafter GGUFs (paths or specs, as tfm-bench's)")
    ap.add_argument("--target", default=None, help="target GGUF (default: the one --from ran)")
    ap.add_argument("--sets", default=None, help="comma-separated sets of --from (default all)")
    ap.add_argument("-n", "--n-prompts", type=positive_int, default=None, help="first N prompts per set (default all)")
    ap.add_argument("--draft-vocab", default="auto", metavar="auto|full|IDS.npy",
                    help="the drafters' draft vocabulary, as tfm-bench's (default auto)")
    ap.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="layers on the GPU when there is one (default all)")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


def recorded_outputs(bench: dict, sets: list[str] | None, n: int | None) -> dict[str, dict[str, list[int]]]:
    """{set: {prompt_id: output_ids}} of a tfm-bench document, the first run of each prompt, in run order.

    Raises:
        ValueError: a set asked for is not in the document, or the document holds no output_ids.
    """
    out: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for r in bench.get("runs", []):
        if r.get("output_ids") and (sets is None or r["set"] in sets):
            out[r["set"]].setdefault(r["prompt_id"], list(r["output_ids"]))
    missing = [s for s in sets or [] if s not in out]
    if missing or not out:
        raise ValueError(f"no recorded outputs for {', '.join(missing) or 'any set'} in the tfm-bench file")
    return {s: dict(list(p.items())[:n] if n else p.items()) for s, p in out.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.json:
        check_writable(args.json, "--json")
    try:
        bench = json.loads(Path(args.bench).read_text())
        outputs = recorded_outputs(bench, args.sets.split(",") if args.sets else None, args.n_prompts)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        fail(f"cannot use --from {args.bench}: {e}")
    target = args.target or bench.get("target")
    if not target:
        fail("--from names no target: give --target")
    from ..llama.model import LlamaError
    from ..files.models import ModelError, resolve_model

    try:
        runs = replay_all(args, target, outputs, int(bench.get("max_tokens") or 256))
    except (ModelError, LlamaError, ValueError, OSError) as e:  # DrafterMismatchError is a ValueError
        fail(str(e))
    table = summarize(runs)
    print_table(table)
    if args.json:
        files = {"from": args.bench, "target": resolve_model(target),
                 "drafter": list(dict.fromkeys(r["file"] for r in runs))}
        write_json(args.json, {**run_record(argv), "from": args.bench, "target": target,
                               "max_tokens": bench.get("max_tokens"), "summary": table, "runs": runs,
                               "provenance": provenance(files)})
        print(f"wrote {args.json}", file=sys.stderr)


def replay_all(args, target: str, outputs: dict, max_tokens: int) -> list[dict]:
    """Replay every recorded output with every drafter; one run record per drafter, set and prompt."""
    from ..decode.draft import DFlashDrafter
    from ..files.drafters import resolve_drafter
    from ..engine import Engine

    engine = Engine(target, None, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers)
    tgt = engine.target
    drafters = []  # every drafter opens (and is checked against the target) before any replay
    try:
        for spec in args.drafter:
            path = resolve_drafter(spec, Path(tgt.model.path), args.draft_vocab)
            drafters.append((spec, path, DFlashDrafter(path, tgt, n_threads=args.threads,
                                                       n_gpu_layers=args.n_gpu_layers)))
        cache: dict[tuple, list] = {}  # the sequences' features per set of feature layers
        runs = []
        for spec, path, dft in drafters:
            key = tuple(dft.layers)
            if key not in cache:
                tgt.set_features(dft.layers)  # the last drafter opened set its own
                cache[key] = list(_sequences(engine, outputs))
            for s, pid, n_prompt, out, feats in cache[key]:
                r = replay_chain(dft, feats, n_prompt, out, max_tokens)
                runs.append({"drafter": spec, "file": str(path), "set": s, "prompt_id": pid, "mode": "chain",
                             "n_steps": r.n_steps, "n_step_tokens": r.n_step_tokens, "tau": r.tau,
                             "accepted": r.accepted})
        return runs
    finally:
        for _, _, dft in drafters:
            dft.close()
        engine.close()


def _sequences(engine, outputs: dict):
    """(set, prompt id, prompt length, output, features of prompt + output) of every recorded output."""
    from ..files.datasets import load_prompt_set

    for s, by_id in outputs.items():
        prompts = {p.id: p for p in load_prompt_set(s)}
        for pid, out in by_id.items():
            ids = engine.prompt_tokens(prompts[pid].messages)
            yield s, pid, len(ids), out, sequence_features(engine.target, ids + out)


def summarize(runs: list[dict]) -> list[dict]:
    """τ per drafter and set (and per MT-Bench category): step tokens over steps, as tfm-bench's."""
    from ..files.datasets import load_prompt_set

    category = {p.id: p.meta["category"] for p in load_prompt_set("mtbench")} if any(
        r["set"] == "mtbench" for r in runs) else {}
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in runs:
        keys = [(r["drafter"], r["set"])]
        if r["set"] == "mtbench":
            keys.append((r["drafter"], f"mtbench:{category[r['prompt_id']]}"))
        for k in keys:
            sums[k][0] += 1
            sums[k][1] += r["n_steps"]
            sums[k][2] += r["n_step_tokens"]
    return [{"drafter": d, "set": s, "n_prompts": p, "n_steps": st, "n_step_tokens": t, "tau": t / st if st else 0.0}
            for (d, s), (p, st, t) in sums.items()]


def print_table(table: list[dict]) -> None:
    """One line per drafter and set."""
    w = max(len(r["drafter"][-40:]) for r in table)
    print(f"{'drafter':<{w}} {'set':<20} {'prompts':>7} {'steps':>6} {'tokens':>7} {'tau':>6}")
    for r in table:
        print(f"{r['drafter'][-40:]:<{w}} {r['set']:<20} {r['n_prompts']:>7} {r['n_steps']:>6} "
              f"{r['n_step_tokens']:>7} {r['tau']:>6.3f}")


if __name__ == "__main__":
    main()
