"""What a captured prompt costs, part by part: the target's prefill with and without the drafter's layer
inputs captured, reading those features to the host, and the drafter's injection of them (in one pass, a
second time at the same row count, and in power-of-two pieces of shapes the engine's warm-up has run).

On the H200 a generation of the automatic budget whose prompt was captured took 11.2 ms +
0.005 ms a prompt token longer to its first token than plain decoding's (docs/gpu.md), about what a probe's own step costs; this
finds where that goes. Every timed part ends with a synchronize of the context it ran on.

    python3 lab/gpu/prompt_capture.py --target ~/w/model.gguf --sets humaneval,mtbench -n 10 [--out F.json]

Prints the median ms of each part over the prompts, and writes the per-prompt rows with ``--out``.
Runs on the CPU too.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def timed(ctxs, fn):
    """Seconds of ``fn()``, every context in ``ctxs`` synchronized before and after."""
    for c in ctxs:
        c.synchronize()
    t = time.perf_counter()
    out = fn()
    for c in ctxs:
        c.synchronize()
    return time.perf_counter() - t, out


def write_rows(path: str | None, rows: list[dict]) -> None:
    """The command line and the per-prompt ``rows`` as JSON at ``path`` (nothing when None)."""
    if path:
        with open(path, "w") as f:
            json.dump(dict(command=" ".join(__import__("sys").argv), rows=rows), f, indent=1)
        print(f"wrote {path}")


def pieces(n: int, largest: int) -> list[int]:
    """``n`` as a sum of powers of two of at most ``largest``, largest first."""
    out = []
    while n:
        p = min(largest, 1 << (n.bit_length() - 1))
        out.append(p)
        n -= p
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--sets", default="humaneval,mtbench")
    ap.add_argument("-n", type=int, default=10, help="prompts a set")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from tfm_local.engine import Engine
    from tfm_local.files.datasets import load_prompt_set

    eng = Engine(a.target, a.drafter, budget="auto", n_threads=a.threads)
    tgt, dft = eng.target, eng.drafter
    layers, rows = list(dft.layers), []
    ctxs = [tgt.ctx, dft.ctx]
    for name in a.sets.split(","):
        for p in load_prompt_set(name, a.n):
            ids = eng.prompt_tokens(p.messages)
            r = dict(set=name, prompt_id=p.id, n=len(ids))
            for rep in range(2):  # the second round: every shape seen once before
                tgt.set_features([])
                r[f"prefill_plain_{rep}"], _ = timed(ctxs, lambda: tgt.prefill(ids))
                tgt.set_features(layers)
                r[f"prefill_capture_{rep}"], _ = timed(ctxs, lambda: tgt.prefill(ids))
                chunks, spent = [], [0.0]

                def read(s, n):  # each prefill chunk's features, read while they are the last batch's
                    dt, f = timed(ctxs, lambda: tgt.features(slice(0, n), n))
                    spent[0] += dt
                    chunks.append(f)
                tgt.prefill(ids, on_chunk=read)
                feats = np.concatenate(chunks)
                r[f"features_{rep}"] = spent[0]
                dft.reset()
                r[f"inject_{rep}"], _ = timed(ctxs, lambda: dft.inject(feats, 0))
                dft.reset()

                def by_pieces():
                    s = 0
                    for k in pieces(len(ids), 32):
                        dft.inject(feats[s:s + k], s)
                        s += k
                r[f"inject_pow2_{rep}"], _ = timed(ctxs, by_pieces)
            rows.append(r)
            print(f"{name:10s} {p.id:14s} n {r['n']:4d}  " + "  ".join(
                f"{k} {1e3 * v:.2f}" for k, v in r.items() if k.endswith("_1")), flush=True)
    keys = [k for k in rows[0] if k not in ("set", "prompt_id", "n")]
    print("\nmedian ms over the prompts: " + "  ".join(f"{k} {1e3 * np.median([r[k] for r in rows]):.2f}" for k in keys))
    write_rows(a.out, rows)
    eng.close()


if __name__ == "__main__":
    main()
