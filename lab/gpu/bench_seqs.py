"""The prompts and recorded greedy outputs of a tfm-bench JSON as a sequence file for `tfm-train walk`
(the engine-style walk of the PyTorch drafter on the GPU machine, where llama.cpp may not be built):
prompt tokens from the target's chat template (as tfm-bench's, checked against the recorded n_prompt),
one kind per sequence (its set).

    python lab/gpu/bench_seqs.py --from docs/results/bench-cpu-L3i-n40.json --out seqs.npz [-n 40]
"""
import argparse
import sys

import numpy as np

from tfm_local.bench.replay_cli import recorded_outputs
from tfm_local.files.datasets import load_prompt_set
from tfm_local.files.models import resolve_model
from tfm_local.train.corpus import Sequence
from tfm_local.train.prompts import ChatTokenizer
from tfm_local.train.walk import save_sequences

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--from", dest="bench", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("-n", type=int, default=None, help="first N prompts per set")
args = ap.parse_args()
import json  # noqa: E402

bench = json.load(open(args.bench))
outputs = recorded_outputs(bench, None, args.n)
n_prompt = {(r["set"], r["prompt_id"]): r["n_prompt"] for r in bench["runs"]}
tok = ChatTokenizer(str(resolve_model(bench["target"])))
seqs, kinds = [], []
for s, by_id in outputs.items():
    prompts = {p.id: p for p in load_prompt_set(s)}
    for pid, out in by_id.items():
        ids = tok.prompt_ids(prompts[pid].messages)
        if len(ids) != n_prompt[(s, pid)]:
            sys.exit(f"{pid}: {len(ids)} prompt tokens, the bench recorded {n_prompt[(s, pid)]}")
        seqs.append(Sequence(np.array(ids + list(out), np.int32), len(ids), len(seqs)))
        kinds.append(s)
tok.close()
save_sequences(args.out, seqs, kinds, int(bench.get("max_tokens") or 256))
print(f"{args.out}: {len(seqs)} sequences ({', '.join(f'{k} {kinds.count(k)}' for k in dict.fromkeys(kinds))})")
