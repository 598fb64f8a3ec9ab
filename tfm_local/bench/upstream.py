"""Benchmark upstream llama.cpp's own DFlash chain (``llama-speculative-simple``) on tfm-bench's prompts.

The comparison point for our chain and trees (docs/gpu.md): the same target and drafter GGUFs and the same prompt sets
(first N prompts, the target's chat template, greedy, ``--max-tokens`` new tokens) run through
upstream's example program, built from the pinned llama.cpp source without our speculative
patches. The pinned qwen2 graph does not expose the layer inputs DFlash reads (upstream aborts with
``GGML_ASSERT(t_layer_inp[il] != nullptr)``), so for qwen2 targets apply our patch 0002 alone
(layer inputs for qwen2 and gemma3) first, e.g.::

    patch -p1 < ggml_ops/patches/0002-layer-inputs-qwen2-gemma3.patch    # in the sdist root
    cmake -S vendor/llama.cpp -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
    cmake --build build --target llama-speculative-simple
    python -m tfm_local.bench.upstream --binary build/bin/llama-speculative-simple \\
        --target T.gguf --drafter D.gguf -n 10 --json upstream.json

Per prompt the program is started once (model loading is not timed: the program reports its
own decode time). τ = generated / verify steps, where steps = generated − accepted (each
verify step emits its accepted draft tokens plus one target token). Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..cli.common import write_json
from .provenance import provenance

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
# lines may carry a log prefix ("0.03.256.937 I n_drafted = 1380") when the build logs with timestamps
_COUNTER = re.compile(r"^(?:[\d.]+ [A-Z] )?(n_drafted|n_accept|n_predict)\s*=\s*(\d+)", re.M)


def parse_output(text: str) -> dict:
    """Numbers of one ``llama-speculative-simple`` run from its log.

    Returns ``n_generated`` (tokens), ``t_decode`` (seconds), ``n_drafted``, ``n_accept``;
    raises ValueError when the log lacks them (the program failed).
    """
    m = _DECODED.search(text)
    counters = dict((k, int(v)) for k, v in _COUNTER.findall(text))
    if m is None or "n_accept" not in counters or "n_drafted" not in counters:
        raise ValueError("no speed/acceptance summary in the program's output:\n" + text[-2000:])
    return dict(n_generated=int(m.group(1)), t_decode=float(m.group(2)),
                n_drafted=counters["n_drafted"], n_accept=counters["n_accept"])


def aggregate(rows: list[dict]) -> dict:
    """τ and tokens/s over runs (see the module doc for τ)."""
    gen = sum(r["n_generated"] for r in rows)
    acc = sum(r["n_accept"] for r in rows)
    t = sum(r["t_decode"] for r in rows)
    steps = gen - acc
    return dict(n_prompts=len(rows), n_generated=gen, n_accept=acc,
                n_drafted=sum(r["n_drafted"] for r in rows), tau=gen / steps if steps else 0.0,
                tokens_per_s=gen / t if t else 0.0, t_decode=t)


def run_prompt(args, text: str) -> dict:
    """Run the program on one rendered prompt; returns :func:`parse_output`'s numbers."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    cmd = [args.binary, "-m", args.target, "-md", args.drafter, "--spec-type", "draft-dflash",
           "--spec-draft-n-max", str(args.draft_max), "-ngl", "99", "-ngld", "99", "-f", f.name,
           "-n", str(args.max_tokens), "--temp", "0", "--top-k", "1", "-c", str(args.n_ctx), "--seed", "0"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=args.timeout)
    finally:  # also when the program times out
        Path(f.name).unlink(missing_ok=True)
    return parse_output(r.stdout + r.stderr)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_upstream", description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True, help="path of llama-speculative-simple")
    ap.add_argument("--target", required=True, help="target GGUF path")
    ap.add_argument("--drafter", required=True, help="DFlash drafter GGUF path (with vocabulary)")
    ap.add_argument("--sets", default="humaneval,gsm8k,mtbench")
    ap.add_argument("-n", "--n-prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--draft-max", type=int, default=15, help="draft tokens per step (block size - 1)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per prompt")
    ap.add_argument("--json", default="bench-upstream.json")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from ..files.datasets import load_prompt_set
    from ..llama.model import Model
    from ..llama.tokenizer import Tokenizer, render_chat

    model = Model(args.target, n_gpu_layers=0)  # for its chat template and vocabulary only
    tok = Tokenizer(model)
    table, runs = [], []
    for name in args.sets.split(","):
        rows = []
        for i, p in enumerate(load_prompt_set(name, args.n_prompts)):
            rows.append(dict(run_prompt(args, render_chat(model, tok, p.messages)), set=name, prompt_id=p.id))
            print(f"\r{name}: {i + 1}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        runs += rows
        table.append(dict(set=name, mode=f"upstream-dflash-chain@{args.draft_max}", **aggregate(rows)))
    print(f"{'set':10} {'mode':28} {'tokens':>7} {'tau':>6} {'tok/s':>8}")
    for t in table:
        print(f"{t['set']:10} {t['mode']:28} {t['n_generated']:7d} {t['tau']:6.2f} {t['tokens_per_s']:8.1f}")
    write_result(args, table, runs)


def write_result(args, table: list[dict], runs: list[dict]) -> None:
    """The JSON: command, date, table, runs and provenance (this machine, upstream's program, the models);
    the llama.cpp build recorded is the Python package's, not the program's (``binary`` is hashed)."""
    write_json(args.json, dict(argv=sys.argv, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               table=table, runs=runs,
                               provenance=provenance({"binary": args.binary, "target": args.target,
                                                      "drafter": args.drafter})))


if __name__ == "__main__":
    main()
