"""Host (Python + llama.cpp API) time per decode step of the engine, on a tiny random target + drafter.

    PYTHONPATH=. python lab/measure_host.py [--json out.json] [--gens 20] [--tokens 64]

The models are tiny (3 layers, width 64: tfm_local/testing/synth.py), so each llama_process call is short and the
rest of a step is the driver's own overhead: building batches and trees, the acceptance walk, the
commits, feature copies. Per mode (chain, DDTree@16): wall time of ``--gens`` generations of
``--tokens`` tokens (greedy, random drafter: tau ~ 1, one token per step), the time inside
``llama_process`` (each context's ``observer``: ``tfm_local.llama.model.DecodeObserver``) and the difference
per step. Prints a table and writes JSON (docs/cpu.md).
"""
import argparse
import os
import pathlib
import platform
import sys
import tempfile
import time

from tfm_local.testing.synth import write_tiny_target
from tfm_convert.pipeline import init_random
from tfm_local.cli.common import write_json
from tfm_local.engine import Engine
from tfm_local.decode.sampling import SamplingParams

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--gens", type=int, default=20)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--json")
a = ap.parse_args()

d = pathlib.Path(tempfile.mkdtemp())
target = write_tiny_target(d / "t.gguf", n_layer=3)
drafter, _ = init_random(target, d / "d.gguf", seed=4)
inside = {"s": 0.0, "calls": 0}


class Inside:
    """Adds up the time of every llama.cpp decode of the contexts it observes."""

    def before(self, ctx, what, n):
        pass

    def after(self, ctx, what, n, seconds):
        inside["s"] += seconds
        inside["calls"] += 1


rows = []
for mode, budget in (("chain", 15), ("ddtree", 16)):
    eng = Engine(target, drafter, n_threads=1, budget=budget, tree=mode)
    eng.target.ctx.observer = eng.drafter.ctx.observer = Inside()
    prompt, sp = list(range(5, 40)), SamplingParams()
    list(eng.generate_ids(prompt, 16, sp))  # warm-up
    inside.update(s=0.0, calls=0)
    steps, t0 = 0, time.perf_counter()
    for _ in range(a.gens):
        list(eng.generate_ids(prompt, a.tokens, sp))
        steps += eng.stats.n_steps
    wall = time.perf_counter() - t0
    rows.append({"mode": f"{mode}@{budget}", "steps": steps, "wall_s": wall, "llama_process_s": inside["s"],
                 "calls": inside["calls"], "host_ms_per_step": 1e3 * (wall - inside["s"]) / steps})
    eng.close()
print(f"{'mode':10} {'steps':>6} {'wall s':>8} {'in llama_process s':>19} {'host ms/step':>13}")
for r in rows:
    print(f"{r['mode']:10} {r['steps']:6d} {r['wall_s']:8.3f} {r['llama_process_s']:19.3f} {r['host_ms_per_step']:13.3f}")
if a.json:
    doc = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "platform": platform.platform(), "cpus": os.cpu_count(), "gens": a.gens, "tokens": a.tokens, "rows": rows}
    write_json(a.json, doc)
