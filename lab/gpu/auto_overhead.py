"""Where the automatic budget's time goes while it decodes plainly: plain decoding against ``auto`` (or
``ddtree@auto``) on the same prompts, interleaved prompt by prompt, with the host's Python profiled.

Prints, per mode, the step's phases (ms a step, as tfm-bench), the budget's counters (probes, capturing
plain steps, capture switches), the probes one by one (verify and drafting time, accepted / predicted,
the calibration r, the probe cycle's cost and the gap to the next probe), the steps by kind (plain decoding's, and the automatic budget's stretch,
plain, capturing, switching, probe and speculative steps: count, ms, and the sum beyond plain decoding's
median step per token), and the Python functions whose
time per step differs most between the modes (cProfile, own time). Runs on the CPU too (slowly).

    python3 lab/gpu/auto_overhead.py --target ~/w/model.gguf --set humaneval -n 10 --tokens 256 \
        --mode auto --out ~/st/auto-overhead.json

``--set humaneval,gsm8k`` runs the sets one after the other in one engine (the budget's state carried
from one to the next, as in tfm-bench); each probe and each captured prompt (``observe_prompt``) is
listed with its set. The steps come from the engine's ``on_step`` hook (the budget's state read once it
observed the step), a captured prompt's seconds from the budget's probe schedule after the prefill.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--set", default="humaneval", help="prompt set, or several separated by commas")
    ap.add_argument("-n", type=int, default=10, help="prompts")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--mode", default="auto", help="auto or ddtree@auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON file")
    ap.add_argument("--budget", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="BudgetConfig fields to override, e.g. measured_depth=False (as lab/budget_replay.py --set)")
    a = ap.parse_args()

    import numpy as np

    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine
    from tfm_local.files.datasets import load_prompt_set

    tree = "ddtree" if a.mode.startswith("ddtree") else "chain"
    eng = Engine(a.target, a.drafter, budget="auto", tree=tree, n_threads=a.threads)
    if a.budget:
        import sys
        from pathlib import Path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from budget_replay import parse_set
        from dataclasses import replace
        state = eng.budget_policy(tree)
        state.config = replace(state.config, **parse_set(a.budget))
    probes, prompts_captured = [], []
    steps_by_kind: dict[str, list] = {}
    current = {"mode": None}

    def on_step(rec, stretch):
        """Each step by kind; each speculative step with the automatic budget's state once it was observed."""
        if current["mode"] is None:
            return
        if current["mode"] == "plain":
            kind = "plain"
        elif stretch:
            kind = "auto: stretch"
        elif rec.speculative:
            kind = "auto: probe" if rec.probe else "auto: speculative"
        elif rec.switched:
            kind = "auto: capture switched"
        else:
            kind = "auto: capturing" if rec.capture else "auto: plain, no capture"
        steps_by_kind.setdefault(kind, []).append(
            [1e3 * rec.t_step, 1e3 * rec.phases["submit"], 1e3 * rec.phases["verify"],
             1e3 * rec.phases["drafter"], len(rec.tokens)])
        auto = eng.auto
        if rec.speculative and auto is not None:
            probes.append(dict(set=current.get("set"), probe=rec.probe, n_nodes=rec.n_nodes,
                               verify_ms=1e3 * rec.t_verify, draft_ms=1e3 * (rec.t_draft - rec.t_sync),
                               budget=rec.budget, accepted=rec.n_accepted, predicted=float(rec.curve[rec.budget - 1]),
                               ratio=auto.ratio, draft_mean_ms=1e3 * auto.draft_s,
                               probe_cost_ms=None if auto.probes.probe_cost is None else 1e3 * auto.probes.probe_cost,
                               probe_every=auto.probes.every))

    eng.on_step = on_step
    prompts = [(name, p) for name in a.set.split(",") for p in load_prompt_set(name, a.n)]
    sp = SamplingParams()
    modes = {"plain": 0, a.mode: "auto"}
    prof = {m: cProfile.Profile() for m in modes}
    rows = {m: [] for m in modes}
    for _, p in prompts[:1]:  # warm-up of both modes' shapes, untimed
        for m, b in modes.items():
            eng.set_budget(b)
            list(eng.generate_ids(eng.prompt_tokens(p.messages), 16, sp))
    t0 = time.time()
    for current["set"], p in prompts:
        ids = eng.prompt_tokens(p.messages)
        for m, b in modes.items():
            eng.set_budget(b)
            current["mode"] = m
            auto = eng.auto
            prompt_s = auto.probes.prompt_s if auto is not None else 0.0
            prof[m].enable()
            it = eng.generate_ids(ids, a.tokens, sp)
            next(it)  # the prefill: a captured prompt's seconds went to the budget (BudgetPolicy.observe_prompt)
            if auto is not None and auto.probes.prompt_s > prompt_s:
                prompts_captured.append(dict(set=current["set"], ms=1e3 * (auto.probes.prompt_s - prompt_s),
                                             speculating=auto.speculating))
            for _ in it:
                pass
            prof[m].disable()
            current["mode"] = None
            rows[m].append(dict(eng.stats.to_dict(), set=current["set"], prompt_id=p.id))
    out = dict(command=" ".join(__import__("sys").argv), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               elapsed_s=time.time() - t0, modes={}, probes=probes, prompts_captured=prompts_captured,
               generations=rows)
    own = {}
    for m, rs in rows.items():
        steps = sum(r["n_steps"] for r in rs)
        toks = sum(r["n_step_tokens"] for r in rs)
        t = sum(r["t_decode"] for r in rs)
        phases = {k: 1e3 * sum(r["t_phases"][k] for r in rs) / steps for k in rs[0]["t_phases"]}
        phases["other"] = 1e3 * sum(r["t_other_phases"] for r in rs) / steps
        counts = {k: sum(r.get(k, 0) for r in rs) for k in ("n_spec_steps", "n_probes", "n_capture_steps", "n_switches")}
        out["modes"][m] = dict(steps=steps, tokens=toks, tokens_per_s=toks / t, ms_per_step=phases, **counts)
        st = pstats.Stats(prof[m])
        own[m] = {f"{fn[0].split('/')[-1]}:{fn[1]}({fn[2]})": v[2] / steps * 1e6 for fn, v in st.stats.items()}
    base = out["modes"]["plain"]["tokens_per_s"]
    print(f"{'mode':<14}{'tok/s':>8}{'x plain':>9}  steps  spec probes capture switches  ms/step: "
          + " ".join(out["modes"]["plain"]["ms_per_step"]))
    for m, d in out["modes"].items():
        print(f"{m:<14}{d['tokens_per_s']:>8.1f}{d['tokens_per_s'] / base:>9.3f}  {d['steps']:>5} {d['n_spec_steps']:>5}"
              f" {d['n_probes']:>6} {d['n_capture_steps']:>7} {d['n_switches']:>8}  "
              + " ".join(f"{v:.3f}" for v in d["ms_per_step"].values()))
    print(f"\nprobes ({sum(q['probe'] for q in probes)} of {len(probes)} speculative steps: set, nodes, verify ms, "
          "draft ms, accepted / predicted, r, probe cost ms, gap)")
    for q in [q for q in probes if q["probe"]][:200]:
        print(f"  {q['set']:<10} {'probe' if q['probe'] else 'spec '} {q['n_nodes']:>3} {q['verify_ms']:7.2f} {q['draft_ms']:7.2f}"
              f"  {q['accepted']} / {q['predicted']:.2f}  r {q['ratio']:.2f}  "
              f"{q['probe_cost_ms'] if q['probe_cost_ms'] is None else round(q['probe_cost_ms'], 2)}  {q['probe_every']}")
    for name in dict.fromkeys(x["set"] for x in prompts_captured):
        ms = [x["ms"] for x in prompts_captured if x["set"] == name]
        print(f"captured prompts, {name}: {len(ms)}, median {np.median(ms):.2f} ms, max {max(ms):.2f} ms")
    kinds = {}
    base_ms = float(np.median([r[0] for r in steps_by_kind.get("plain", [[0.0]])]))
    print(f"\nsteps by kind (ms; extra = sum of t_step beyond plain decoding's median step per token)")
    print(f"  {'kind':<26}{'n':>6}{'median':>8}{'mean':>8}{'submit':>8}{'verify':>8}{'drafter':>8}{'extra ms':>10}")
    for kind, v in sorted(steps_by_kind.items()):
        x = np.array(v)
        extra = float(np.sum(x[:, 0] - base_ms * x[:, 4]))
        kinds[kind] = dict(n=len(x), median_ms=float(np.median(x[:, 0])), mean_ms=float(x[:, 0].mean()),
                           submit_ms=float(x[:, 1].mean()), verify_ms=float(x[:, 2].mean()),
                           drafter_ms=float(x[:, 3].mean()), extra_ms=extra)
        k = kinds[kind]
        print(f"  {kind:<26}{k['n']:>6}{k['median_ms']:>8.2f}{k['mean_ms']:>8.2f}{k['submit_ms']:>8.2f}"
              f"{k['verify_ms']:>8.2f}{k['drafter_ms']:>8.2f}{extra:>10.1f}")
    out["steps_by_kind"] = kinds
    diff = {k: own[a.mode].get(k, 0.0) - own["plain"].get(k, 0.0) for k in set(own[a.mode]) | set(own["plain"])}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:20]
    out["python_own_us_per_step_diff"] = dict(top)
    print(f"\nPython own time per step, {a.mode} minus plain (µs, cProfile: inflated, compare the sizes)")
    for k, v in top:
        print(f"  {v:+8.2f}  {k}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=float)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
