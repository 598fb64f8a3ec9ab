"""Which decode calls reuse their graph, per llama.cpp context (docs/gpu.md, "graph reuse").

Usage: TFM_VERBOSE=1 LLAMA_GRAPH_RESULT_DEBUG=1 PYTHONPATH=. python lab/trace_graphs.py \
           [--target GGUF] [--mode chain|ddtree] [--budget B] [--tokens N] [--gpu] > trace.log 2>&1
       python lab/trace_graphs.py --summarize trace.log

The first form generates one answer (greedy) with the target (default: the default target) and its
shipped drafter and prints a marker line before
every decode call of every context (``@@ <context> <method> <rows>``, context = target or drafter); the
log lines llama.cpp and ggml-cuda print during that call follow it. The second form counts, per
context and call kind (method, and rows for token batches; injections are pooled as "n"), the calls,
llama.cpp's graph reuses (``can reuse graph = 1``, one per reused ubatch) and ggml-cuda's CUDA-graph
messages: "same uid" (the graph llama.cpp reused, replayed as is), warmup complete and warmup reset. A
rebuilt graph whose CUDA graph is replayed after ggml-cuda's property check prints nothing, so a call
with no message may or may not have run as a CUDA graph.
"""
import argparse
import collections
import re
import sys

MARK = re.compile(r"^@@ (\w+) (\w+) (\d+)")
EVENTS = {"llama reuse": "can reuse graph = 1", "cuda same uid": "CUDA Graph id",
          "cuda warmup complete": "CUDA graph warmup complete", "cuda warmup reset": "CUDA graph warmup reset"}


def summarize(path: str) -> None:
    """Print the per-context, per-call-kind counts of a trace log."""
    counts = collections.defaultdict(collections.Counter)
    key = None
    try:
        lines = open(path, errors="replace").readlines()
    except OSError as e:
        sys.exit(f"cannot read {path}: {e}")
    for line in lines:
        m = MARK.match(line)
        if m:
            ctx, method, rows = m.groups()
            key = (ctx, method, int(rows) if method == "decode_tokens" else "n")
            counts[key]["calls"] += 1
        elif key is not None:
            for name, text in EVENTS.items():
                counts[key][name] += text in line
    if not counts:
        sys.exit(f"{path}: no '@@' decode markers: not a trace (run the tracing form with 2>&1 into the log)")
    cols = ["calls", *EVENTS]
    print(f"{'context':8s} {'call':16s} {'rows':>4s} " + " ".join(f"{c:>20s}" for c in cols))
    order = lambda kv: (kv[0][0], kv[0][1], -1 if kv[0][2] == "n" else kv[0][2])  # noqa: E731
    for (ctx, method, rows), c in sorted(counts.items(), key=order):
        print(f"{ctx:8s} {method:16s} {rows!s:>4s} " + " ".join(f"{c[k]:20d}" for k in cols))


class Marker:
    """Prints ``@@ <context> <method> <rows>`` before each decode of the contexts it observes (their
    ``observer``: ``tfm_local.llama.model.DecodeObserver``); llama.cpp's lines for the call follow it."""

    METHODS = {"tokens": "decode_tokens", "embeddings": "decode_embd"}

    def __init__(self, name: str):
        self.name = name

    def before(self, ctx, what, n):
        print(f"@@ {self.name} {self.METHODS[what]} {n}", file=sys.stderr, flush=True)

    def after(self, ctx, what, n, seconds):
        pass


def trace(a: argparse.Namespace) -> None:
    """Generate one answer, marking every decode call (see the module docstring)."""
    from tfm_local.engine import Engine
    from tfm_local.decode.sampling import SamplingParams

    eng = Engine(a.target, budget=a.budget, tree=a.mode, n_gpu_layers=-1 if a.gpu else 0)
    eng.target.ctx.observer = Marker("target")
    eng.drafter.ctx.observer = Marker("drafter")
    ids = eng.prompt_tokens([{"role": "user", "content": "Write a Python function that merges two sorted lists."}])
    list(eng.generate_ids(ids, a.tokens, SamplingParams()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarize", metavar="LOG", help="count the events of a trace log instead of tracing")
    ap.add_argument("--target", help="target GGUF (default: the default target)")
    ap.add_argument("--mode", choices=("chain", "ddtree"), default="chain")
    ap.add_argument("--budget", type=int, default=15, help="drafted tokens per step: the chain's length or the "
                    "tree's nodes besides the root (default 15)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens (default 64)")
    ap.add_argument("--gpu", action="store_true", help="offload both models (default: CPU)")
    a = ap.parse_args()
    if a.budget < 1 or a.tokens < 1:
        ap.error("--budget and --tokens must be >= 1 (a trace needs drafting)")
    summarize(a.summarize) if a.summarize else trace(a)


if __name__ == "__main__":
    main()
