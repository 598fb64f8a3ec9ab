"""Where a generation's time to its first token goes in the engine itself, by mode: plain decoding
(budget 0), a fixed budget (every prompt captured) and the automatic budget, each prompt twice (the
second time every shape has been seen). Each engine call on the way to the first token (public methods of
the target and drafter, and the target context's decodes through its ``observer``) is wrapped with a timer
that synchronizes the target's and the drafter's contexts before and after it; a call inside another
counts only in its own part, so the parts add up to the wrapped total; an unwrapped round gives the
engine's own time to first token beside it.

On the H200 a captured prompt's first token came ~9.6 ms later than plain decoding's while
its parts measured apart (lab/gpu/prompt_capture.py: the features' read 0.5 ms, the drafter's injection
2.5 ms, the capture itself 0.05 ms) add up to ~3 ms; this finds the rest.

    python3 lab/gpu/prefill_split.py --target ~/w/model.gguf --sets humaneval,mtbench -n 8 [--out F.json]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from prompt_capture import write_rows  # lab/gpu/, the script's own directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="default: the default target")
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--sets", default="humaneval,mtbench")
    ap.add_argument("-n", type=int, default=8, help="prompts a set")
    ap.add_argument("--modes", default="plain,ddtree@16,auto,ddtree@auto")
    ap.add_argument("--tokens", type=int, default=24, help="tokens a generation (the budget's state moves)")
    ap.add_argument("--interleave", action="store_true",
                    help="every mode on a prompt before the next prompt (as tfm-bench runs them), once each")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine
    from tfm_local.files.datasets import load_prompt_set

    eng = Engine(a.target, a.drafter, budget="auto")
    tgt, dft = eng.target, eng.drafter
    ctxs = [tgt.ctx, dft.ctx]
    parts: dict[str, float] = defaultdict(float)
    on = [False]
    running: list[list] = []  # the timed regions open now, innermost last: [label, start]

    def enter(label):
        for c in ctxs:
            c.synchronize()
        running.append([label, time.perf_counter()])

    def leave():
        for c in ctxs:
            c.synchronize()
        label, t = running.pop()
        dt = time.perf_counter() - t
        parts[label] += dt
        if running:  # an enclosing region counts only its own time: the parts add up to the total
            parts[running[-1][0]] -= dt

    def wrap(obj, name, label):
        """Time the public method ``name`` of the instance ``obj`` while ``on``."""
        fn = getattr(obj, name)

        def timed(*args, **kw):
            if not on[0]:
                return fn(*args, **kw)
            enter(label)
            try:
                return fn(*args, **kw)
            finally:
                leave()
        setattr(obj, name, timed)

    class Decodes:
        """The target's llama.cpp decodes (its context's observer, tfm_local.llama.model.DecodeObserver)."""

        def before(self, ctx, what, n):
            if on[0]:
                enter("target.decode")

        def after(self, ctx, what, n, seconds):
            if on[0]:
                leave()

    wrap(dft, "reset", "drafter.reset")
    wrap(dft, "inject", "drafter.inject")
    wrap(tgt, "features", "target.features")
    wrap(tgt, "attach_argmax", "target.attach")
    wrap(tgt, "attach_sampler", "target.attach")
    wrap(tgt, "set_features", "set_capture")  # the engine's capture switch (decode.step.set_capture)
    # the prefill's own time besides its decodes and the features' injection: the backend's choice read back
    wrap(tgt, "prefill_choice", "target.prefill, rest")
    wrap(tgt, "prefill", "target.prefill, rest")
    tgt.ctx.observer = Decodes()

    prompts = [(name, p) for name in a.sets.split(",") for p in load_prompt_set(name, a.n)]
    sp = SamplingParams()
    rows = []
    def set_mode(mode):
        shape, _, budget = mode.rpartition("@") if "@" in mode else ("chain", "", mode)
        budget = 0 if budget == "plain" else budget if budget == "auto" else int(budget)
        eng.set_draft(shape or "chain", budget)

    def one(mode, name, p, ids, rep, wrapped):
        parts.clear()
        on[0] = wrapped
        tgt.ctx.synchronize(), dft.ctx.synchronize()
        t0 = time.perf_counter()
        it = eng.generate_ids(ids, a.tokens, sp)
        next(it)
        ttft = time.perf_counter() - t0
        on[0] = False
        for _ in it:  # the rest of the generation, so the state moves as in use
            pass
        rows.append(dict(mode=mode, set=name, prompt_id=p.id, n=len(ids), rep=rep, wrapped=wrapped,
                         ttft=ttft, t_prefill=eng.stats.t_prefill, parts=dict(parts)))
        return rows[-1]

    def show(label, rs):
        print(f"{label:40s} " + " | ".join(f"rep{r['rep']}{'w' if r['wrapped'] else ''} ttft {1e3 * r['ttft']:.2f} " + " ".join(
            f"{k} {1e3 * v:.2f}" for k, v in sorted(r["parts"].items())) for r in rs), flush=True)

    if a.interleave:  # rep 1 = the wrapped run, every mode switched to right before
        for i, (name, p) in enumerate(prompts):
            ids = eng.prompt_tokens(p.messages)
            for mode in a.modes.split(","):
                set_mode(mode)
                show(f"{mode} {p.id} n {len(ids)}", [one(mode, name, p, ids, 1, True)])
            for mode in a.modes.split(","):
                set_mode(mode)
                one(mode, name, p, ids, 1, False)
    else:
        for mode in a.modes.split(","):
            set_mode(mode)
            for name, p in prompts:
                ids = eng.prompt_tokens(p.messages)
                show(f"{mode} {p.id} n {len(ids)}", [one(mode, name, p, ids, rep, w) for rep in range(2)
                                                     for w in (False, True)][1::2])
    print("\nmedian ms (unwrapped ttft, then wrapped parts), rep 1:")
    for mode in a.modes.split(","):
        un = [r["ttft"] for r in rows if r["mode"] == mode and r["rep"] == 1 and not r["wrapped"]]
        w = [r for r in rows if r["mode"] == mode and r["rep"] == 1 and r["wrapped"]]
        keys = sorted({k for r in w for k in r["parts"]})
        print(f"{mode:12s} ttft {1e3 * np.median(un):.2f}  wrapped {1e3 * np.median([r['ttft'] for r in w]):.2f}  " +
              "  ".join(f"{k} {1e3 * np.median([r['parts'].get(k, 0.0) for r in w]):.2f}" for k in keys))
        un0 = [r["ttft"] for r in rows if r["mode"] == mode and r["rep"] == 0 and not r["wrapped"]]
        if un0:
            print(f"{'':12s} rep 0 ttft {1e3 * np.median(un0):.2f}")
    write_rows(a.out, rows)
    eng.close()


if __name__ == "__main__":
    main()
