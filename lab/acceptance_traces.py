"""The shipped drafter's marginals at every position of the target's greedy answers, for replaying the
automatic budget offline (lab/budget_replay.py).

Usage: PYTHONPATH=. python lab/acceptance_traces.py BENCH.json OUT.npz [--sets humaneval,gsm8k,mtbench]
       [--prompts 40] [--top-k 8]

BENCH.json is a tfm-bench result holding the output ids of its plain greedy runs (an unstripped one, or
docs/results/answers-h200-greedy-n40.json, the H200's): those answers are the target's greedy decoding, and every speculative step of any
budget would have continued them. For each answer the target takes prompt + answer in one prefill with
the drafter's layer inputs captured; the drafter then drafts one block (the full depth, block size - 1)
after the prompt's last token and after every answer token but the last (row i drafts the answer's tokens
i, i + 1, …; the replay starts at row 1, the prefill having emitted token 0), with the features of every token before it injected one row at a time (as
a chain that accepts nothing would: the drafter's cache is the engine's at that position), and the top-K
candidates and their log-probabilities of each block row are kept. CPU (n_gpu_layers 0), the full
vocabulary head (the GPU's drafter); ~9 positions a second on the 2-core machine.

Writes OUT.npz: ``cand`` int32 [positions, depth, K], ``logp`` float32 [positions, depth, K] (log-softmax
over the vocabulary), ``truth`` int32 [positions, depth] (the answer's next tokens; -1 past its end),
``start`` int64 [prompts + 1] (each answer's first position), ``set`` / ``prompt_id`` str [prompts].
"""
import argparse
import json
import sys
import time

import numpy as np

from tfm_local.engine import Engine
from tfm_local.files.datasets import load_prompt_set


def answers(bench: str, sets: list[str]) -> dict:
    """{set: {prompt_id: output ids}} of the plain greedy runs in ``bench``."""
    with open(bench) as f:
        runs = json.load(f)["runs"]
    out = {s: {} for s in sets}
    for r in runs:
        if r["mode"] == "plain" and r.get("sampling", "greedy") == "greedy" and r.get("set") in out:
            if "output_ids" not in r:
                sys.exit(f"{bench} has no output ids (a stripped result): use the unstripped JSON")
            out[r["set"]][r["prompt_id"]] = r["output_ids"]
    return out


def trace(eng: Engine, prompt: list[int], answer: list[int], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cand, logp, truth of one answer (module doc)."""
    tgt, dft = eng.target, eng.drafter
    seq = prompt + answer
    depth = dft.block_size - 1
    tgt.set_features(dft.layers)
    tgt.reset()
    feats = []
    tgt.prefill(seq, on_chunk=lambda s, n: feats.append(tgt.features(slice(0, n), n).copy()))
    feats = np.concatenate(feats)
    dft.reset()
    p = len(prompt)
    dft.inject(feats[:p - 1], 0)
    cand = np.zeros((len(answer), depth, k), np.int32)
    logp = np.zeros((len(answer), depth, k), np.float32)
    truth = np.full((len(answer), depth), -1, np.int32)
    for i, pos in enumerate(range(p - 1, len(seq) - 1)):
        c, lp = dft.top_k(seq[pos], pos, depth, k)
        cand[i], logp[i] = c, lp
        nxt = seq[pos + 1:pos + 1 + depth]
        truth[i, :len(nxt)] = nxt
        dft.inject(feats[pos:pos + 1], pos)
    return cand, logp, truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench")
    ap.add_argument("out")
    ap.add_argument("--sets", default="humaneval,gsm8k,mtbench")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--top-k", type=int, default=8)
    a = ap.parse_args()
    sets = a.sets.split(",")
    ans = answers(a.bench, sets)
    eng = Engine(budget=15, tree="ddtree", n_gpu_layers=0, draft_vocab="full", warm_up=False)
    C, L, T, start, names, ids = [], [], [], [0], [], []
    t0 = time.time()
    for s in sets:
        for p in load_prompt_set(s, a.prompts):
            if p.id not in ans[s]:
                sys.exit(f"{a.bench} has no plain greedy answer for {s}/{p.id}")
            c, lp, tr = trace(eng, eng.prompt_tokens(p.messages), ans[s][p.id], a.top_k)
            C.append(c), L.append(lp), T.append(tr)
            start.append(start[-1] + len(c))
            names.append(s), ids.append(p.id)
            print(f"\r{s} {p.id}: {start[-1]} positions, {time.time() - t0:.0f} s", end="", file=sys.stderr,
                  flush=True)
        print(file=sys.stderr)
    np.savez_compressed(a.out, cand=np.concatenate(C), logp=np.concatenate(L), truth=np.concatenate(T),
                        start=np.array(start), set=np.array(names), prompt_id=np.array(ids))
    print(f"wrote {a.out}: {len(names)} answers, {start[-1]} positions")


if __name__ == "__main__":
    main()
