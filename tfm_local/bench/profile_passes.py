"""Where a verify pass and a drafter step spend their time on a GPU: wall clock against the CUDA kernels.

    python3 -m tfm_local.bench.profile_passes --target ~/w/model.gguf --drafter auto --tokens 1,8,16 --iters 20 \\
        --json profile.json

Each case (a target pass of n tokens with the backend argmax, as ``tfm-bench pass --variants argmax``;
the drafter's top-k block pass; a drafter step = inject 1 row + top-k block, as
``tfm_local/bench/drafts.py``) runs ``--iters`` times inside a ``torch.profiler`` range, after untimed
warm-up passes. The profiler's CUPTI tracing records every CUDA kernel of the process, llama.cpp's
included; the kernels that start inside a case's range are summed. Per pass: wall ms, kernel ms
(the sum of the kernels' own durations), kernel count and the GPU's busy share (kernel / wall): a low
share means the pass waits for host work and launches, a high one for the kernels themselves. The five
kernels that took longest are listed per case. Without a GPU (or with ``--cpu``) only the wall times
are measured (the kernel columns read 0). Uses torch for the profiler only: a measurement tool, not a
part of the decode path.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from tfm_local.bench.drafts import DraftBench
from tfm_local.bench.provenance import provenance
from tfm_local.files.atomic import write_json
from tfm_local.decode.draft import DFlashDrafter
from tfm_local.files.drafters import draft_vocab_on, resolve_drafter
from tfm_local.llama.model import gpu_available
from tfm_local.files.models import resolve_model
from tfm_local.bench.passes import PassBench, dflash_feature_layers
from tfm_local.decode.verify import Target


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="target GGUF or built-in name")
    ap.add_argument("--drafter", default="auto", help="drafter GGUF, 'auto', 'random', or 'none' (no drafter cases)")
    ap.add_argument("--tokens", default="1,16", help="target pass sizes (default 1,16)")
    ap.add_argument("--ctx", type=int, default=512, help="prompt tokens before the passes (default 512)")
    ap.add_argument("--iters", type=int, default=20, help="profiled passes per case (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed passes per case first (default 3)")
    ap.add_argument("--threads", type=int, default=4, help="llama.cpp CPU threads (default 4)")
    ap.add_argument("--cpu", action="store_true", help="no GPU offload")
    ap.add_argument("--json", default=None, help="write the table here")
    return ap.parse_args(argv)


def kernel_table(prof, names: list[str], iters: int) -> list[dict]:
    """Per case name: wall ms, kernel ms and kernels per pass, busy share, top-5 kernels (ms per pass)."""
    events = prof.events()
    spans = {n: [(e.time_range.start, e.time_range.end) for e in events
                 if e.name == n and e.device_type == DeviceType.CPU] for n in names}
    # a case's record_function range shows up on the GPU's timeline too (a user annotation): not a kernel
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.name not in names]
    rows = []
    for n in names:
        inside = [k for k in kernels if any(a <= k.time_range.start <= b for a, b in spans[n])]
        wall_us = sum(b - a for a, b in spans[n])
        busy_us = sum(k.time_range.elapsed_us() for k in inside)
        top = Counter()
        for k in inside:
            top[k.name] += k.time_range.elapsed_us()
        rows.append({"case": n, "wall_ms": wall_us / iters / 1e3, "kernel_ms": busy_us / iters / 1e3,
                     "kernels": len(inside) / iters, "busy": busy_us / wall_us if wall_us else 0.0,
                     "top": [(name[:80], us / iters / 1e3) for name, us in top.most_common(5)]})
    return rows


def main(argv=None) -> int:
    a = parse_args(argv)
    sizes = [int(x) for x in a.tokens.split(",")]
    on_gpu = gpu_available() and not a.cpu
    path = resolve_model(a.target)
    target = Target(path, n_ctx=a.ctx + max(sizes) + 64, n_batch=max(64, max(sizes)), n_threads=a.threads,
                    n_gpu_layers=-1 if on_gpu else 0)
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(0, target.model.n_vocab, a.ctx)]
    cases = []  # (name, run iters passes)
    bench = PassBench(target, prompt, dflash_feature_layers(target.model.n_layer))
    variant = "argmax"
    if bench.setup("argmax", max(sizes)):  # a reason: no backend argmax here
        variant = "logits"
        bench.setup(variant, max(sizes))
    for n in sizes:
        tokens = [int(x) for x in rng.integers(0, target.model.n_vocab, n)]
        cases.append((f"target {variant} n={n}", lambda t=tokens: bench.time(variant, t, 0, a.iters),
                      lambda t=tokens: bench.time(variant, t, a.warmup, 1)))
    drafter = drafter_path = None
    if a.drafter != "none":
        drafter_path = resolve_drafter(a.drafter, path, draft_vocab_on("auto", on_gpu))
        drafter = DFlashDrafter(drafter_path, target, n_threads=a.threads, n_gpu_layers=-1 if on_gpu else 0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu and torch.cuda.is_available() else [])
    rows = []
    try:
        rows += profiled(cases, activities, a.iters)
        if drafter is not None:
            bench.teardown()  # it also turned the drafter's feature capture off
            target.set_features(drafter.layers)
            target.reset()
            target.prefill(prompt, lambda s, n: drafter.inject(target.features(slice(0, n), n), s))
            db = DraftBench(drafter, len(drafter.layers) * target.model.n_embd, rng)
            rows += profiled([(f"drafter {v}", lambda v=v: db.time(v, 0, a.iters), lambda v=v: db.time(v, a.warmup, 1))
                              for v in ("topk", "step")], activities, a.iters)
    finally:
        if drafter is not None:
            drafter.close()
        target.close()
    print(f"{'case':28} {'wall ms':>8} {'kernel ms':>9} {'kernels':>8} {'busy':>6}")
    for r in rows:
        print(f"{r['case']:28} {r['wall_ms']:8.3f} {r['kernel_ms']:9.3f} {r['kernels']:8.1f} {r['busy']:6.1%}")
        for name, ms in r["top"]:
            print(f"    {ms:7.3f} ms  {name}")
    if a.json:
        write_json(a.json, {"argv": sys.argv[1:], "gpu": on_gpu, "rows": rows,
                            "provenance": provenance({"target": path, "drafter": drafter_path})})
    return 0


def profiled(cases, activities, iters: int) -> list[dict]:
    """Warm each case up, then run them all under one profiler, each in its own named range."""
    for _, _, warm in cases:
        warm()
    with profile(activities=activities) as prof:
        for name, run, _ in cases:
            with record_function(name):
                run()
    return kernel_table(prof, [c[0] for c in cases], iters)


if __name__ == "__main__":
    sys.exit(main())
