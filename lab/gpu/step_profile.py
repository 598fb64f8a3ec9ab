"""Where a decode step's time goes on the GPU, phase by phase: host wall time, the CUDA API calls the
host makes in it (launches, copies, synchronisations), and the GPU kernels launched in it.

The engine generates for each mode (``plain``, ``chain``, ``ddtree@16`` … as tfm-bench's ``--modes``)
under ``torch.profiler`` (CPU + CUDA activities, CUPTI); ``PhaseClock.observe`` sees every mark, so that each
stretch between two marks (the step's phases: drafter, tree, submit, verify, accept; "other" between
steps) is a named profiler range. Per mode and phase, per step: wall ms; the CUDA runtime and driver
calls that start inside the phase (count and ms, by name: ``cudaLaunchKernel``, ``cudaMemcpyAsync``,
``cudaStreamSynchronize``, ``cudaGraphLaunch`` …); the kernels launched from inside it (count, and their
summed GPU time); and the GPU's busy time inside the phase's wall span. A phase whose wall time is mostly
a synchronising call waits for the GPU; one with many launches and a short busy time is host-bound.
The profiler's own cost (~1–2 µs a launch) inflates launch-heavy phases; compare modes, not to tfm-bench.

    python3 lab/gpu/step_profile.py --target ~/w/model.gguf --drafter auto \
        --modes plain,chain,ddtree@16,ddtree@64 --set humaneval -n 2 --tokens 96 --out step-profile.json

Runs on the CPU too (no CUDA columns). A measurement tool: torch is never on the decode path.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--modes", default="plain,chain,ddtree@16,ddtree@64")
    ap.add_argument("--set", default="humaneval")
    ap.add_argument("-n", type=int, default=2, help="prompts per mode")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON file")
    a = ap.parse_args()

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    from tfm_local.bench.tfm_bench import parse_modes
    from tfm_local.decode.stats import PhaseClock
    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine
    from tfm_local.files.datasets import load_prompt_set

    labels: list[str] = []
    open_range: list = [None]

    def close(label: str) -> None:
        if open_range[0] is not None:
            open_range[0].__exit__(None, None, None)
            labels.append(label)
        r = record_function(f"seg{len(labels)}")
        r.__enter__()
        open_range[0] = r

    PhaseClock.observe(lambda phase: close(phase or "other"))  # every step's clock: a range per phase
    modes = parse_modes(a.modes)
    eng = Engine(a.target, a.drafter, budget="auto", n_threads=a.threads)
    prompts = load_prompt_set(a.set, a.n)
    sp = SamplingParams()
    on_gpu = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    out = dict(command=" ".join(sys.argv), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), gpu=on_gpu, modes={})
    for m in modes:
        eng.set_draft(m.tree, m.budget)
        ids = [eng.prompt_tokens(p.messages) for p in prompts]
        list(eng.generate_ids(ids[0], 16, sp))  # warm-up: this shape's first passes allocate
        labels.clear()
        open_range[0] = None
        steps = taus = 0
        with profile(activities=acts) as prof:
            for x in ids:
                list(eng.generate_ids(x, a.tokens, sp))
                steps += eng.stats.n_steps
                taus += eng.stats.n_step_tokens
            close("other")
            open_range[0].__exit__(None, None, None)
        out["modes"][m.label] = table(prof, labels, steps, DeviceType)
        out["modes"][m.label].update(steps=steps, tau=taus / max(steps, 1))
        print_mode(m.label, out["modes"][m.label])
    PhaseClock.observe(None)
    eng.close()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


def table(prof, labels: list[str], steps: int, DeviceType) -> dict:
    """Per phase: wall, CUDA API calls, kernels launched and GPU busy time, all per step."""
    segs, api, kernels = {}, [], []
    raw = prof.profiler.kineto_results.events()
    for e in raw:
        name, dev = e.name(), e.device_type()
        s, t = e.start_ns() / 1e3, e.end_ns() / 1e3
        if dev == DeviceType.CPU and name.startswith("seg") and name[3:].isdigit():
            i = int(name[3:])
            if i < len(labels):
                segs[i] = (s, t, labels[i])
        elif dev == DeviceType.CPU and name.startswith("cu"):
            api.append((s, t, name, e.correlation_id()))
        elif dev == DeviceType.CUDA and not (name.startswith("seg") and name[3:].isdigit()):
            kernels.append((s, t, name, e.correlation_id()))
    spans = sorted(segs.values())
    starts = [s for s, _, _ in spans]
    import bisect

    def phase_of(ts):
        i = bisect.bisect_right(starts, ts) - 1
        return spans[i][2] if i >= 0 and ts <= spans[i][1] else None

    per = defaultdict(lambda: dict(wall_us=0.0, api=Counter(), api_n=Counter(), launched=0, launched_us=0.0,
                                   busy_us=0.0))
    for s, t, ph in spans:
        per[ph]["wall_us"] += t - s
    launch_phase = {}
    for s, t, name, cid in api:
        ph = phase_of(s)
        if ph is None:
            continue
        per[ph]["api"][name] += t - s
        per[ph]["api_n"][name] += 1
        launch_phase[cid] = ph
    # GPU busy inside each phase's span: the union of kernel intervals clipped to the span
    kernels.sort()
    ks = [k[0] for k in kernels]
    for s, t, ph in spans:
        j = max(bisect.bisect_left(ks, s) - 64, 0)
        busy, cur = 0.0, s
        while j < len(kernels) and kernels[j][0] < t:
            a, b = max(kernels[j][0], cur), min(kernels[j][1], t)
            if b > a:
                busy += b - a
                cur = b
            j += 1
        per[ph]["busy_us"] += busy
    for s, t, name, cid in kernels:
        ph = launch_phase.get(cid)
        if ph is not None:
            per[ph]["launched"] += 1
            per[ph]["launched_us"] += t - s
    n = max(steps, 1)
    res = {}
    for ph, d in per.items():
        res[ph] = dict(wall_ms=d["wall_us"] / n / 1e3, busy_ms=d["busy_us"] / n / 1e3,
                       kernels_launched=d["launched"] / n, kernel_ms_launched=d["launched_us"] / n / 1e3,
                       api={k: dict(ms=v / n / 1e3, calls=d["api_n"][k] / n) for k, v in d["api"].most_common(8)})
    return dict(phases=res)


def print_mode(label: str, d: dict) -> None:
    print(f"\n== {label}: {d['steps']} steps, tau {d['tau']:.2f}; ms (or counts) per step")
    print(f"{'phase':8} {'wall':>7} {'busy':>7} {'kernels':>8} {'k.ms':>7}  top CUDA API calls (ms / calls)")
    for ph, r in sorted(d["phases"].items(), key=lambda kv: -kv[1]["wall_ms"]):
        calls = ", ".join(f"{k} {v['ms']:.3f}/{v['calls']:.0f}" for k, v in list(r["api"].items())[:4])
        print(f"{ph:8} {r['wall_ms']:7.3f} {r['busy_ms']:7.3f} {r['kernels_launched']:8.1f} "
              f"{r['kernel_ms_launched']:7.3f}  {calls}")


if __name__ == "__main__":
    main()
