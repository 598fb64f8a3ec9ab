"""tfm-bench soak: one process, many generations: no crash, caches consistent, memory flat.

For each mode (``--modes``, as tfm-bench's: ``auto``, ``ddtree@16``, ...) and each sampling (T = 0.8
with a seed per request, then greedy), requests over the prompt sets' prompts (one of each set in turn),
until ``--tokens`` tokens are generated. After every request the engine's caches are checked
(``Engine.state_problems``: the target's KV cache holds exactly its committed tokens, the drafter's
rows do not run past them) and the process's resident memory is read (``/proc/self/statm``). Warm-up
first: every mode and sampling for ``--warmup-tokens`` tokens (buffers of new batch shapes, CUDA
graphs, the automatic budget's first probes); memory growth is counted from the resident memory at
the end of the warm-up, for every measured run. Prints a table and writes JSON; exits 1 when a check
failed or memory grew by more than ``--max-growth-mb``.

    tfm-bench soak --tokens 20000 --modes auto,ddtree@16 --json soak.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

from ..cli.common import add_engine_args, engine_from_args, fail
from ..cli.program import alias_note, program_name
from .provenance import provenance


def rss_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc/self/statm``; else the peak, getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def soak(engine, prompts: list, mode, sp, tokens: int, max_tokens: int, seed0: int = 0,
         base: float | None = None) -> dict:
    """Generate ``tokens`` tokens in ``mode`` with sampling ``sp`` (a seed per request when sampled)
    over ``prompts`` (cycled); returns counts, memory and every state problem met. Memory growth is
    counted from ``base`` (MiB), or when None from the end of the run's first 10% of tokens."""
    from dataclasses import replace

    engine.set_draft(mode.tree, mode.budget)
    done = requests = 0
    problems, rss, t0 = [], [], time.time()
    failed = 0  # consecutive requests that raised
    while done < tokens and failed < 3:
        p = prompts[requests % len(prompts)]
        s = replace(sp, seed=seed0 + requests) if not sp.greedy else sp
        requests += 1
        try:
            ids = engine.prompt_tokens(p.messages)
            done += len(list(engine.generate_ids(ids, min(max_tokens, tokens - done), s)))
            failed = 0
        except Exception as e:  # noqa: BLE001 - a request that fails is a problem to report, not the end
            problems.append(f"request {requests} ({p.id}) raised {type(e).__name__}: {e}")
            failed += 1
        problems += [f"request {requests} ({p.id}): {x}" for x in engine.state_problems()]
        rss.append(rss_mb())
        if base is None and done >= tokens // 10:
            base = rss[-1]
    base = rss[0] if base is None else base
    return dict(mode=mode.label, sampling="greedy" if sp.greedy else f"t={sp.temperature}", tokens=done,
                requests=requests, seconds=round(time.time() - t0, 1), rss_after_warmup_mb=round(base, 1),
                rss_max_mb=round(max(rss), 1), rss_end_mb=round(rss[-1], 1),
                growth_mb=round(max(rss) - base, 1), problems=problems)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-soak"), description=__doc__.split("\n\n")[0],
                                 epilog=alias_note("tfm-bench soak"))
    add_engine_args(ap)
    ap.add_argument("--modes", default="auto,ddtree@16", help="comma-separated, as tfm-bench's (default auto,ddtree@16)")
    ap.add_argument("--tokens", type=int, default=20000, help="tokens per mode and sampling (default 20000)")
    ap.add_argument("--max-tokens", type=int, default=256, help="new tokens per request (default 256)")
    ap.add_argument("--temperature", type=float, default=0.8, help="the sampled runs' temperature (default 0.8)")
    ap.add_argument("--sets", default="humaneval,gsm8k,mtbench")
    ap.add_argument("--warmup-tokens", type=int, default=2000,
                    help="tokens per mode and sampling before the measured runs (default 2000)")
    ap.add_argument("--max-growth-mb", type=float, default=50.0, help="allowed memory growth after warm-up")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    from ..decode.sampling import SamplingParams
    from ..files.datasets import load_prompt_set
    from .tfm_bench import parse_modes

    if args.tokens < 1 or args.max_tokens < 1 or args.temperature <= 0 or args.warmup_tokens < 0:
        fail("--tokens and --max-tokens must be >= 1, --warmup-tokens >= 0 and --temperature > 0")
    try:
        modes = parse_modes(args.modes)
        sets = [load_prompt_set(name) for name in args.sets.split(",")]
        # the sets interleaved (one prompt of each in turn), so that every run meets all of them
        prompts = [p for group in itertools.zip_longest(*sets) for p in group if p is not None]
    except (ValueError, OSError, LookupError) as e:
        fail(str(e))
    args.tree, args.budget = "chain", "auto"
    engine = engine_from_args(args)
    rows, warm = [], []
    samplings = (SamplingParams(temperature=args.temperature, top_p=0.95), SamplingParams())
    try:
        base = None
        if args.warmup_tokens:
            warm = [soak(engine, prompts, m, sp, args.warmup_tokens, args.max_tokens, seed0=10**6)
                    for sp in samplings for m in modes]
            base = rss_mb()
            print(f"warm-up: {len(warm)} runs of {args.warmup_tokens} tokens, rss {base:.0f} MiB, "
                  f"problems {sum(len(r['problems']) for r in warm)}", flush=True)
        for sp in samplings:
            for m in modes:
                rows.append(soak(engine, prompts, m, sp, args.tokens, args.max_tokens, base=base))
                r = rows[-1]
                print(f"{r['mode']:12} {r['sampling']:7} {r['tokens']:7d} tokens {r['requests']:5d} requests "
                      f"{r['seconds']:8.1f} s  rss {r['rss_after_warmup_mb']:.0f} -> max {r['rss_max_mb']:.0f} MiB "
                      f"(+{r['growth_mb']:.1f})  problems {len(r['problems'])}", flush=True)
    finally:
        files = {"target": engine.target.model.path, "drafter": engine.drafter.model.path if engine.drafter else None}
        engine.close()
    ok = all(not r["problems"] for r in warm) and all(
        not r["problems"] and r["growth_mb"] <= args.max_growth_mb for r in rows)
    if args.json:
        from ..files.atomic import write_json

        write_json(args.json, dict(argv=list(sys.argv[1:] if argv is None else argv), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                   max_growth_mb=args.max_growth_mb, ok=ok, warmup=warm, runs=rows,
                                   provenance=provenance(files)))
    for r in rows:
        for x in r["problems"][:5]:
            print(f"problem: {r['mode']} {r['sampling']}: {x}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
