"""Where a generation's time to its first token goes in the engine itself, by mode: plain decoding
(budget 0), a fixed budget (every prompt captured) and the automatic budget, each prompt twice (the
second time every shape has been seen). Each engine call on the way to the first token is wrapped with
a timer that synchronizes the target's and the drafter's contexts before and after it, so the parts add
up to the wrapped total; an unwrapped round gives the engine's own time to first token beside it.

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
    from tfm_local.decode import step as step_mod
    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine
    from tfm_local.files.datasets import load_prompt_set

    eng = Engine(a.target, a.drafter, budget="auto")
    tgt, dft = eng.target, eng.drafter
    ctxs = [tgt.ctx, dft.ctx]
    parts: dict[str, float] = defaultdict(float)
    on = [False]

    def wrap(obj, name, label=None):
        fn = getattr(obj, name)

        def timed(*args, **kw):
            if not on[0]:
                return fn(*args, **kw)
            for c in ctxs:
                c.synchronize()
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                for c in ctxs:
                    c.synchronize()
                parts[label or name] += time.perf_counter() - t
        setattr(obj, name, timed)

    wrap(dft, "reset", "drafter.reset")
    wrap(dft, "inject", "drafter.inject")
    wrap(tgt, "features", "target.features")
    wrap(tgt, "attach_argmax", "target.attach")
    wrap(tgt, "attach_sampler", "target.attach")
    wrap(tgt.ctx, "decode_tokens", "target.decode")
    wrap(tgt, "_read_choice", "target.read_choice")
    orig_set_capture = step_mod.set_capture

    def set_capture(*args):
        if not on[0]:
            return orig_set_capture(*args)
        for c in ctxs:
            c.synchronize()
        t = time.perf_counter()
        r = orig_set_capture(*args)
        parts["set_capture"] += time.perf_counter() - t
        return r
    import tfm_local.engine as engine_mod
    engine_mod.set_capture = set_capture

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
        it = eng._token_stream(ids, a.tokens, sp)
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
