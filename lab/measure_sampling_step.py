"""What a sampled plain step costs beyond a greedy one on this machine (docs/cpu.md, "Sampling in the graph").

    PYTHONPATH=. python lab/measure_sampling_step.py [--sets humaneval,mtbench] [-n 4] [--tokens 96]

Two parts, on the default target:
- pass A/B: three targets in one process decode the same sampled continuation (T = 0.7, top-p 0.95)
  token by token, in alternating order: the draw in the graph (``attach_sampler``), host logits +
  ``np.argmax`` (the CPU's greedy default) and the argmax in the graph (``attach_argmax``). Prints the
  host-argmax step's median and the paired differences (median, mean ± standard error), ms.
- op: ``ggml_sample_tokens`` alone (``op_harness.bench_op``) on the target's real logit rows of the greedy
  continuations, on 1 and 2 threads (a single row is split over the threads), T = 0.7 / top-p 0.95 and
  T = 1; median ms a row.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.verify import Target
from tfm_local.engine import Engine
from tfm_local.files.datasets import load_prompt_set
from tfm_local.files.models import DEFAULT_TARGET, resolve_model
from tfm_local.testing import op_harness


def pass_ab(eng: Engine, path: str, name: str, n: int, tokens: int) -> None:
    sp = SamplingParams(temperature=0.7, top_p=0.95, seed=1)
    t = {k: Target(path, n_ctx=1024) for k in ("sampler", "host", "argmax")}
    t["sampler"].attach_sampler(sp, 1, 1)
    t["argmax"].attach_argmax(1)
    ms = {k: [] for k in t}
    for p in load_prompt_set(name, n):
        ids = eng.prompt_tokens(p.messages)
        gen = list(eng.generate_ids(ids, tokens, sp))
        for k, tg in t.items():
            tg.reset()
            tg.prefill(ids) if k == "host" else tg.prefill_choice(ids)
        for j, tok in enumerate(gen[:-1]):
            for k in (t if j % 2 == 0 else reversed(list(t))):
                t0 = time.perf_counter()
                v = t[k].verify([tok], backend_choice=k != "host")
                int(np.argmax(v.logits[0])) if k == "host" else int(v.ids[0])
                t[k].commit([0])
                ms[k].append(1e3 * (time.perf_counter() - t0))
    r = {k: np.array(v) for k, v in ms.items()}
    out = [f"{name}: {len(r['host'])} steps, host argmax {np.median(r['host']):.2f} ms"]
    for k in ("sampler", "argmax"):
        d = r[k] - r["host"]
        out.append(f"{k} - host median {np.median(d):+.3f} mean {d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(len(d)):.3f}")
    print("; ".join(out), flush=True)
    for tg in t.values():
        tg.close()


def op_times(eng: Engine, name: str, n: int, tokens: int) -> None:
    tg = eng.target
    rows = []
    for p in load_prompt_set(name, n):
        ids = eng.prompt_tokens(p.messages)
        gen = list(eng.generate_ids(ids, tokens, SamplingParams()))
        tg.reset()
        tg.ctx.decode_tokens(np.asarray(ids + gen), 0, "all")
        rows.append(np.array(tg.ctx.logits(len(ids) + len(gen))[len(ids) - 1:-1]))
        tg.reset()  # the cache emptied again: the engine's next generation prefills from position 0
    x = np.concatenate(rows).astype(np.float32)
    for temp, top_p in ((0.7, 0.95), (1.0, 1.0)):
        op_harness.set_op_fparams(temp, top_p, 0.0)
        cells = []
        for nt in (1, 2):
            per_row = [np.median(op_harness.bench_op("sample_tokens", [np.ascontiguousarray(x[i:i + 1]),
                                                                      np.array([[i, 7]], np.int32)],
                                                     n_threads=nt, n_warmup=2, n_iter=7))
                       for i in range(0, len(x), 4)]
            cells.append(f"{nt} thread(s) {np.median(per_row):.3f} ms")
        print(f"{name} op T={temp} top-p {top_p}, {len(x)} rows: " + ", ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="humaneval,mtbench")
    ap.add_argument("-n", type=int, default=4, help="prompts a set")
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    eng = Engine(drafter=None, budget=0)
    path = resolve_model(DEFAULT_TARGET)
    for name in a.sets.split(","):
        pass_ab(eng, path, name, a.n, a.tokens)
        op_times(eng, name, a.n, a.tokens)
    eng.close()


if __name__ == "__main__":
    main()
