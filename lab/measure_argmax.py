"""Target pass with host logits vs the backend argmax, side by side (default target, CPU; docs/cpu.md).

Usage: PYTHONPATH=. python lab/measure_argmax.py [REPS]. Prefills 300 tokens, then per repetition
and mode one untimed and one timed pass of 1 token, a 16-node and a 64-node tree (freed after
each pass); host = logits to the host + np.argmax of every row, backend = Target.verify(..., backend_choice=True).
"""
import sys, time
import numpy as np
from tfm_local.files.models import DEFAULT_TARGET, resolve_model
from tfm_local.decode.verify import Target

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
t = Target(resolve_model(DEFAULT_TARGET), n_ctx=2048, n_batch=512, n_gpu_layers=0)
prompt = t.tok.encode("def quicksort(xs):\n    " * 30)[:300]
rng = np.random.default_rng(0)
trees = {}
for n in (16, 64):
    parents = np.array([-1] + [int(rng.integers(max(0, i - 3), i)) for i in range(1, n)], np.int32)
    depth = np.zeros(n, np.int32)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    trees[n] = (rng.integers(100, 20000, n).astype(np.int32), depth, parents)

def one(mode, n):
    t0 = time.perf_counter()
    tok, depth, par = ([1234], None, None) if n == 1 else trees[n]
    v = t.verify(tok, par, depth, backend_choice=mode == "backend")
    ids = v.ids if mode == "backend" else np.argmax(np.asarray(v.logits), axis=1)
    dt = time.perf_counter() - t0
    t.commit([])
    return dt, ids

res = {(m, n): [] for m in ("host", "backend") for n in (1, 16, 64)}
same = True
for r in range(reps):
    got = {}
    for mode in ("host", "backend"):
        if mode == "backend":
            t.attach_argmax(64)
            t.prefill_choice(prompt)
        else:
            t.prefill(prompt)
        for n in (1, 16, 64):
            one(mode, n)  # untimed: the first pass of a shape (re)allocates
            dt, ids = one(mode, n)
            res[(mode, n)].append(dt * 1e3)
            got[(mode, n)] = list(ids)
    same &= all(got[("host", n)] == got[("backend", n)] for n in (1, 16, 64))
print("rows  host ms (median, all)            backend ms (median, all)")
for n in (1, 16, 64):
    h, b = res[("host", n)], res[("backend", n)]
    print(f"{n:>4}  {np.median(h):8.1f} {[round(x) for x in h]}  {np.median(b):8.1f} {[round(x) for x in b]}")
print("argmax ids equal:", same)
