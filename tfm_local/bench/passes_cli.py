"""tfm-bench pass: where one target verification pass of n tokens spends its time.

Loads the target (``--target``: a path, ``hf://owner/repo/file.gguf`` or a built-in name), prefills
``--ctx`` random token ids, then for each pass size (``--tokens``) times ``--iters`` passes of n tokens
appended after the prompt and removed again, in the variants of tfm_local/bench/passes.py: all rows'
logits to the host (today's chain verify), the backend argmax, the backend token sampler (T = 0.7,
top-p 0.95), logits + host argmax, logits with the
drafter's layer-input features captured and read, and the last row only (with the decode call's
return time apart from the wait for the backend). Prints a table of median and min ms per pass and
writes JSON (``--json``).

    tfm-bench pass --tokens 1,2,4,8,16,32,64,128 --json pass-h200.json
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from . import drafts as db
from . import passes as pb
from ..cli.common import add_timing_args, device_name, fail, int_list, positive_int, run_record, write_json
from ..cli.program import alias_note, program_name
from .provenance import provenance


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-pass"), description=__doc__.split("\n")[0],
                                 epilog=alias_note("tfm-bench pass"))
    ap.add_argument("--target", default=None, help="target GGUF: a path, hf://owner/repo/file.gguf or a built-in "
                    "name (default qwen2.5-coder-1.5b-instruct)")
    ap.add_argument("--ctx", type=positive_int, default=512, help="prompt tokens prefilled (default 512)")
    ap.add_argument("--tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128],
                    help="pass sizes n (default 1,2,4,8,16,32,64,128)")
    ap.add_argument("--variants", default=",".join(pb.VARIANTS), help=f"what each pass reads back (default {','.join(pb.VARIANTS)}; see tfm_local/bench/passes.py)")
    ap.add_argument("--feature-layers", type=int_list, default=None, help="layer inputs captured by the features "
                    "variant (default: the 5 a DFlash drafter for this target reads)")
    add_timing_args(ap, iters=20, warmup=3, threads=None)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is available")
    ap.add_argument("--drafter", default=None, help="also time this DFlash drafter's passes (inject, block "
                    "top-k, block logits, a step; tfm_local/draft_bench.py): a path or 'auto' (the default drafter)")
    ap.add_argument("--draft-depths", type=int_list, default=[1, 2, 3, 4, 8],
                    help="with --drafter: also time a drafter step drafting each of these depths (step@d: "
                    "inject one row, then a block of d + 1 rows with top-k), reported in plain tokens (the "
                    "1-token pass of the first variant); default 1,2,3,4,8")
    ap.add_argument("--draft-vocab", default="auto", metavar="auto|full|IDS.npy",
                    help="the drafter's draft vocabulary, as tfm-chat's --draft-vocab (default auto)")
    a = ap.parse_args(argv)
    a.variants = [v for v in a.variants.split(",") if v]
    bad = set(a.variants) - set(pb.VARIANTS)
    if bad or not a.variants:
        ap.error(f"--variants takes some of {','.join(pb.VARIANTS)}, got {sorted(bad) or 'none'}")
    return a


def print_table(cases: list[dict], skipped: dict) -> None:
    """One row per (n, variant): median and min ms per pass, ms per token, the median over the same
    variant's smallest n, the remove time and (last_row) the submit time."""
    first = {}
    for c in cases:
        first.setdefault(c["variant"], c)
    w = max(len("variant"), *(len(c["variant"]) for c in cases)) if cases else len("variant")
    print(f"{'n':>4}  {'variant':<{w}}  {'median':>8}  {'min':>8}  {'ms/tok':>8}  {'x n0':>6}  {'remove':>7}"
          f"  {'submit':>8}")
    for c in cases:
        base = first[c["variant"]]
        sub = f"{c['submit']['median_ms']:.3f}" if "submit" in c else "-"
        print(f"{c['tokens']:>4}  {c['variant']:<{w}}  {c['median_ms']:>8.3f}  {c['min_ms']:>8.3f}  "
              f"{c['ms_per_token']:>8.3f}  {c['median_ms'] / base['median_ms']:>5.2f}x  "
              f"{c['remove']['median_ms']:>7.3f}  {sub:>8}")
    print("ms per pass; x n0 = median / the same variant's median at the smallest n; remove = dropping the "
          "pass from the cache; submit = until the decode call returned (last_row)")
    for v, why in skipped.items():
        print(f"{v}: skipped: {why}")


def load_target(a):
    """Resolve ``--target`` and load it with room for the prompt and the largest pass: (path, Target).
    Exits with a message (status 2) when the model cannot be found or loaded."""
    from ..llama.model import LlamaError
    from ..files.models import DEFAULT_TARGET, ModelError, resolve_model
    from ..decode.verify import Target

    try:
        path = resolve_model(a.target or DEFAULT_TARGET)
        n_max = max(a.tokens)
        return path, Target(path, n_ctx=max(a.ctx + n_max + 64, 256), n_batch=max(512, n_max),
                            n_threads=a.threads, n_gpu_layers=0 if a.cpu else -1)
    except (ModelError, OSError, ValueError, LlamaError) as e:
        fail(str(e))


def resolve_drafter_arg(a, target_path):
    """The ``--drafter`` GGUF's path (None without ``--drafter``), resolved before any timing. Exits with a
    message (status 2) when it cannot be found or is not a GGUF."""
    if not a.drafter:
        return None
    from ..files.drafters import draft_vocab_on, resolve_drafter
    from ..llama.model import gpu_available
    from ..files.models import ModelError

    try:  # "auto" as the engine reads it: the full vocabulary on a GPU
        return resolve_drafter(a.drafter, target_path, draft_vocab_on(a.draft_vocab, gpu_available() and not a.cpu))
    except (ModelError, OSError, ValueError) as e:
        fail(f"drafter: {e}")


def time_drafter(a, drafter_path, target, rng) -> list[dict]:
    """Load the drafter at ``drafter_path`` on ``target`` (its prompt re-prefilled with the drafter's
    features injected) and time every drafter variant. Exits with a message (status 2) when llama.cpp
    cannot load it or it does not fit the target."""
    from ..decode.draft import DFlashDrafter
    from ..llama.model import LlamaError

    try:
        d = DFlashDrafter(drafter_path, target, n_threads=a.threads, n_gpu_layers=0 if a.cpu else -1)
    except (LlamaError, OSError, ValueError) as e:  # ValueError includes DrafterMismatchError
        fail(f"drafter: {e}")
    try:
        prompt = [int(x) for x in rng.integers(0, target.model.n_vocab, a.ctx)]
        target.reset()
        target.prefill(prompt, lambda s, n: d.inject(target.features(slice(0, n), n), s))
        bench = db.DraftBench(d, len(d.layers) * target.model.n_embd, rng)
        depths = [db.depth_variant(x) for x in a.draft_depths if 0 < x < d.block_size]
        return db.run_drafter(bench, list(db.DRAFT_VARIANTS) + depths, a.warmup, a.iters)
    finally:
        d.close()


def main(argv=None) -> None:
    a = parse_args(argv)
    from ..llama.model import default_threads, gpu_available

    path, target = load_target(a)
    try:
        drafter_path = resolve_drafter_arg(a, path)
    except SystemExit:
        target.close()
        raise
    rng = np.random.default_rng(a.seed)
    m = target.model
    try:
        if a.feature_layers and max(a.feature_layers) >= m.n_layer:
            fail(f"--feature-layers {a.feature_layers} out of range for a {m.n_layer}-layer target")
        layers = a.feature_layers or (pb.dflash_feature_layers(m.n_layer) if m.n_layer >= 2 else [])
        bench = pb.PassBench(target, [int(x) for x in rng.integers(0, m.n_vocab, a.ctx)], layers)
        cases, skipped = pb.run(bench, a.tokens, a.variants, a.warmup, a.iters, rng,
                                log=lambda s: print(s, file=sys.stderr, flush=True))
        draft_cases = time_drafter(a, drafter_path, target, rng) if drafter_path else []
    except ValueError as e:
        fail(str(e))
    finally:
        target.close()
    device = "gpu" if gpu_available() and not a.cpu else "cpu"
    threads = a.threads or default_threads()
    print(f"device {device}, target {path.name} ({path.stat().st_size / 1e9:.2f} GB), ctx {a.ctx}, "
          f"threads {threads}\nmethod: {pb.METHOD}")
    print_table(cases, skipped)
    plain = next((c["median_ms"] for c in cases if c["tokens"] == 1), None)
    for c in draft_cases:
        if plain:
            c["plain_tokens"] = c["median_ms"] / plain
        rel = f"  {c['plain_tokens']:5.2f} plain tokens" if plain else ""
        print(f"drafter {c['variant']:<9} median {c['median_ms']:8.3f} ms  min {c['min_ms']:8.3f} ms{rel}")
    if plain and draft_cases:
        print(f"plain tokens = the drafter pass's median / the 1-token {cases[0]['variant']} pass's median "
              f"({plain:.3f} ms)")
    if a.json:
        doc = {**run_record(argv), "device": device, "device_name": device_name(device),
               "target": {"path": str(path), "bytes": path.stat().st_size, "arch": m.arch, "n_layer": m.n_layer,
                          "n_embd": m.n_embd, "n_vocab": m.n_vocab},
               "ctx": a.ctx, "threads": threads, "iters": a.iters, "warmup": a.warmup, "seed": a.seed,
               "tokens": a.tokens, "variants": a.variants, "feature_layers": layers, "method": pb.METHOD,
               "skipped": skipped, "cases": cases, "drafter": a.drafter, "drafter_method": db.DRAFT_METHOD,
               "drafter_cases": draft_cases, "provenance": provenance({"target": path, "drafter": drafter_path})}
        write_json(a.json, doc)


if __name__ == "__main__":
    main()
