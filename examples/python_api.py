"""The Python API: stream an answer, read its statistics, then sample a second one with a seed.

    python examples/python_api.py                      # default target and its default drafter
    python examples/python_api.py --target model.gguf --drafter auto --prompt "Explain a heap" --max-tokens 200

``--target`` takes what ``Engine`` takes: a GGUF path, ``hf://owner/repo/file.gguf`` or a built-in
name (left out: the built-in default target, downloaded once into ``~/.cache/tfm-local``).
``--drafter``: ``auto`` (the default drafter for the target, or a random one for a target that has
none), ``random``, a drafter GGUF, or ``none`` for plain decoding.
"""
from __future__ import annotations

import argparse
import sys

from tfm_local import Engine
from tfm_local.files.models import ModelError


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target model (default: the built-in default target)")
    ap.add_argument("--drafter", default="auto", help="auto (default), random, a drafter GGUF, or none")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per answer (default 128)")
    ap.add_argument("--prompt", default="Write a Python function that reverses a string.")
    args = ap.parse_args(argv)
    drafter = None if args.drafter.lower() == "none" else args.drafter

    messages = [{"role": "user", "content": args.prompt}]
    # The context manager closes the engine (frees the llama.cpp models) at the end of the block.
    with Engine(target=args.target, drafter=drafter) as engine:
        # 1. Greedy (temperature 0, the default), streamed: pieces of text as they are decoded.
        for piece in engine.generate(messages, max_tokens=args.max_tokens, stream=True):
            print(piece, end="", flush=True)
        print()
        stats = engine.stats  # the statistics of the last generation
        print("stats:", stats.summary())
        print(f"tau (tokens per target pass): {stats.tau:.2f}")
        print(f"decode speed: {stats.tokens_per_s:.1f} tokens/s over {stats.n_generated} tokens "
              f"({stats.n_steps} target passes, finish reason {stats.finish_reason or 'n/a'})")

        # 2. Sampled: temperature > 0 with a seed gives the same answer on every run.
        text = engine.generate(messages, max_tokens=args.max_tokens, temperature=0.8, top_p=0.95, seed=42)
        print("\nsampled (temperature 0.8, seed 42):")
        print(text)
        print("stats:", engine.stats.summary())


if __name__ == "__main__":
    try:
        main()
    except (ModelError, OSError, ValueError, RuntimeError) as e:  # a missing or unfit model, a bad option
        sys.exit(f"python_api.py: {e}")
