"""Does the automatic budget cost anything while it decodes plainly? (docs/cpu.md)

    PYTHONPATH=. python lab/measure_auto_plain.py [--tiny-gens 30] [--set mtbench] [-n 10] [--tokens 96]

Two parts, greedy, one engine each, budget 0 and ``"auto"`` alternating generation by generation:
- tiny: the tiny synthetic pair (3 layers of width 64: tfm_local/testing/synth.py), 200-token generations
  (and the same at T = 0.7 / top-p 0.95): the median ms a step and its submit phase, so the host's own
  work per step shows (the passes are short);
- real: the default pair on ``-n`` prompts of ``--set``, two rounds: the median submit (target pass) time
  of each generation's steps, paired plain / auto per prompt and round (mean ± standard error), and the
  probes, speculative and capturing steps ``auto`` made.
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np

from tfm_local.decode.sampling import SamplingParams
from tfm_local.engine import Engine
from tfm_local.files.datasets import load_prompt_set


def tiny(gens: int) -> None:
    from tfm_convert.pipeline import init_random
    from tfm_local.testing.synth import write_tiny_target

    d = pathlib.Path(tempfile.mkdtemp())
    target = write_tiny_target(d / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, d / "d.gguf", seed=4)
    eng = Engine(target, drafter, n_threads=2, budget="auto", tree="chain")
    prompt = list(range(5, 40))
    for sp in (SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=3)):
        res = {0: [], "auto": []}
        for b in (0, "auto"):  # warm-up
            eng.set_budget(b)
            list(eng.generate_ids(prompt, 200, sp))
        for r in range(gens):
            for b in ((0, "auto") if r % 2 == 0 else ("auto", 0)):
                eng.set_budget(b)
                list(eng.generate_ids(prompt, 200, sp))
                st = eng.stats
                res[b].append((1e3 * st.t_decode / st.n_steps, 1e3 * st.t_phases["submit"] / st.n_steps))
        for b, v in res.items():
            v = np.array(v)
            print(f"tiny T={sp.temperature} budget {b}: step {np.median(v[:, 0]):.4f} ms, "
                  f"submit {np.median(v[:, 1]):.4f} ms (median of {len(v)} generations)", flush=True)
    eng.close()


def real(set_name: str, n: int, tokens: int) -> None:
    submits: list[float] = []
    eng = Engine(budget="auto")
    eng.on_step = lambda rec, stretch: submits.append(rec.phases["submit"])
    sp = SamplingParams()
    med = {0: [], "auto": []}
    work = 0
    for rnd in range(2):
        for i, p in enumerate(load_prompt_set(set_name, n)):
            ids = eng.prompt_tokens(p.messages)
            for b in ((0, "auto") if (i + rnd) % 2 == 0 else ("auto", 0)):
                eng.set_budget(b)
                submits.clear()
                list(eng.generate_ids(ids, tokens, sp))
                st = eng.stats
                if b == "auto":
                    work += st.n_probes + st.n_spec_steps + st.n_capture_steps
                med[b].append(1e3 * float(np.median(submits)))
    a, p = np.array(med["auto"]), np.array(med[0])
    d = a - p
    print(f"real {set_name}: median submit per generation plain {np.median(p):.2f} ms, auto {np.median(a):.2f}; "
          f"paired auto - plain mean {d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(len(d)):.3f} ms, median "
          f"{np.median(d):+.3f}; auto's probes + speculative + capturing steps {work}", flush=True)
    eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny-gens", type=int, default=30)
    ap.add_argument("--set", default="mtbench")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    tiny(a.tiny_gens)
    real(a.set, a.n, a.tokens)


if __name__ == "__main__":
    main()
