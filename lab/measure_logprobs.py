"""What log-probabilities and penalties cost on this machine (README's Server section, docs/cpu.md).

    PYTHONPATH=. python lab/measure_logprobs.py [--set humaneval] [-n 4] [--tokens 64] [--budget 7] [--agreement]

Three parts, on the default target (its vocabulary: 151,936 logits a row):
- host: the per-token host work of ``decode.host_choice.HostChooser`` on the target's real logit rows
  (greedy continuations of the prompts): ``np.argmax`` (the CPU's greedy choice without them), the
  host draw ``sample_row`` (T 0.7, top-p 0.95), ``Penalties.apply`` after 64 generated tokens, and
  ``token_logprob`` with 0, 5 and 20 alternatives; median ms a row.
- end to end: tokens/s of whole generations, plain (budget 0) and with the default drafter's chain at
  a fixed budget (every step drafts; the automatic budget may choose plain steps), greedy and sampled (T 0.7, top-p 0.95, seed 1), without and with ``logprobs=20``,
  and greedy with penalties (frequency 0.5, presence 0.5); the settings of one prompt run back to back
  in alternating order. Prints the median tokens/s and τ of each, and whether the tokens with
  ``logprobs`` equal those without (they must).
- agreement (``--agreement``): greedy ``logprobs=5`` records of plain decoding against the chain at
  ``--budget`` and DDTree at 16, over the tokens where the outputs agree: the median, 99th percentile
  and largest |difference| of the emitted token's value and of the alternatives' (batched passes
  compute the logits with other kernels than one-row decoding).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tfm_local.decode.logprobs import token_logprob
from tfm_local.decode.penalties import Penalties
from tfm_local.decode.sampling import SamplingParams, draw_key, sample_row
from tfm_local.engine import Engine
from tfm_local.files.datasets import load_prompt_set

SAMPLED = dict(temperature=0.7, top_p=0.95, seed=1)
PENALTIES = dict(frequency_penalty=0.5, presence_penalty=0.5)


def median_ms(fn, rows) -> float:
    out = []
    for x in rows:
        t0 = time.perf_counter()
        fn(x)
        out.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(out))


def host_part(eng: Engine, prompts, tokens: int) -> None:
    rows = []
    tg = eng.target
    for p in prompts:
        ids = eng.prompt_tokens(p.messages)
        gen = list(eng.generate_ids(ids, tokens, SamplingParams()))
        tg.ctx.clear()
        tg.ctx.decode_tokens(np.asarray(ids + gen), 0, "all")
        rows.extend(np.array(tg.ctx.logits(len(ids) + len(gen))[len(ids) - 1:-1]))
        tg.reset()
    pen = Penalties(SamplingParams(**PENALTIES), [])
    for t in np.random.default_rng(0).integers(0, rows[0].shape[0], 64):
        pen.push(int(t))
    sp = SamplingParams(temperature=0.7, top_p=0.95)
    cells = {"np.argmax": lambda x: int(np.argmax(x)),
             "sample_row": lambda x: sample_row(x, sp, draw_key(1, 7)),
             "Penalties.apply (64 generated)": pen.apply,
             "token_logprob k=0": lambda x: token_logprob(x, 0, 0),
             "token_logprob k=5": lambda x: token_logprob(x, 0, 5),
             "token_logprob k=20": lambda x: token_logprob(x, 0, 20)}
    print(f"host, {len(rows)} rows of {rows[0].shape[0]} logits: "
          + ", ".join(f"{k} {median_ms(f, rows):.3f} ms" for k, f in cells.items()), flush=True)


def run(eng: Engine, ids, tokens: int, sp: SamplingParams, logprobs) -> tuple[list[int], float, float]:
    out = list(eng.generate_ids(ids, tokens, sp, logprobs=logprobs))
    st = eng.stats
    return out, st.n_generated / (st.t_total - st.t_prefill) if st.t_total > st.t_prefill else 0.0, st.tau


def end_to_end(name: str, eng: Engine, prompts, tokens: int) -> None:
    settings = {"greedy": (SamplingParams(), None), "greedy+logprobs20": (SamplingParams(), 20),
                "greedy+penalties": (SamplingParams(**PENALTIES), None),
                "sampled": (SamplingParams(**SAMPLED), None), "sampled+logprobs20": (SamplingParams(**SAMPLED), 20)}
    tps = {k: [] for k in settings}
    tau = {k: [] for k in settings}
    outs: dict[str, list] = {k: [] for k in settings}
    for j, p in enumerate(prompts):
        ids = eng.prompt_tokens(p.messages)
        order = list(settings) if j % 2 == 0 else list(reversed(settings))
        for k in order:
            out, r, t = run(eng, ids, tokens, *settings[k])
            tps[k].append(r)
            tau[k].append(t)
            outs[k].append(out)
    same = {k: outs[k] == outs[k.split("+")[0]] for k in settings if k.endswith("logprobs20")}
    print(f"{name}: " + "; ".join(f"{k} {np.median(tps[k]):.2f} tok/s (tau {np.median(tau[k]):.2f})"
                                  for k in settings) + f"; equal tokens with logprobs: {same}", flush=True)


def agreement(prompts, tokens: int, budget: int) -> None:
    ref = {}
    with Engine(drafter=None, budget=0) as plain:
        for j, p in enumerate(prompts):
            ids = plain.prompt_tokens(p.messages)
            ref[j] = (ids, list(plain.generate_ids(ids, tokens, SamplingParams(), logprobs=5)), list(plain.logprobs))
    for tree, b in (("chain", budget), ("ddtree", 16)):
        d_tok, d_top, n_eq, taus = [], [], 0, []
        with Engine(budget=b, tree=tree) as spec:
            for ids, out_ref, recs in ref.values():
                out = list(spec.generate_ids(ids, tokens, SamplingParams(), logprobs=5))
                taus.append(spec.stats.tau)
                n = next((i for i, (x, y) in enumerate(zip(out, out_ref)) if x != y), min(len(out), len(out_ref)))
                n_eq += n
                for x, y in zip(spec.logprobs[:n], recs[:n]):
                    d_tok.append(abs(x.logprob - y.logprob))
                    d_top += [abs(u[1] - v[1]) for u, v in zip(x.top, y.top)]
        d_tok, d_top = np.array(d_tok), np.array(d_top)
        print(f"agreement {tree}@{b} (tau {np.median(taus):.2f}), {n_eq} equal tokens of {len(ref) * tokens}: "
              f"emitted token median {np.median(d_tok):.1e} p99 {np.quantile(d_tok, 0.99):.1e} max {d_tok.max():.3f}; "
              f"alternatives median {np.median(d_top):.1e} p99 {np.quantile(d_top, 0.99):.1e} "
              f"max {d_top.max():.3f} nats", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", default="humaneval")
    ap.add_argument("-n", type=int, default=4, help="prompts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=7, help="drafted tokens a speculative step verifies")
    ap.add_argument("--agreement", action="store_true", help="only the plain / speculative agreement part")
    a = ap.parse_args()
    prompts = list(load_prompt_set(a.set, a.n))
    if a.agreement:
        agreement(prompts, a.tokens, a.budget)
        return
    with Engine(drafter=None, budget=0) as plain:
        host_part(plain, prompts, a.tokens)
        end_to_end("plain", plain, prompts, a.tokens)
    with Engine(budget=a.budget) as spec:  # the default drafter's chain at a fixed budget
        end_to_end(f"chain, budget {a.budget}", spec, prompts, a.tokens)


if __name__ == "__main__":
    main()
