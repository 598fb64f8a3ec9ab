"""tfm-bench verify: one full verify step of a random-weight Gated-DeltaNet hybrid (docs/gdn-tree.md).

Writes (or takes ``--model``) a qwen35 GGUF of Qwen3.6-27B's per-layer shapes (``--layers`` of them,
``--vocab`` tokens; ``--tiny`` for the 4-layer test shape), prefills ``--ctx`` random tokens, then for
each tree size (``--nodes``) times, median over ``--iters``: tree mode (Target.verify, Target.commit of the
deepest path apart), per-branch (every root-to-leaf path its own sequence of one batch) and a chain of
the deepest path with upstream's ``n_rs_seq`` snapshot rollback (tfm_local/bench/verify_step.py). Each size
is checked once first (per-branch and chain logits equal the tree's node logits); an incorrect size is
not timed and makes the exit status 1. Prints a table and writes JSON (``--json``).

    tfm-bench verify --layers 4 --vocab 248320 --json verify-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from . import verify_step as vs
from ..llama.model import gpu_available
from ..testing.hybrid import HybridShape, file_bytes, write_qwen35
from ..cli.common import add_timing_args, device_name, int_list, positive_int, run_record, write_json
from ..cli.program import alias_note, program_name
from .provenance import provenance

METHOD = ("tree = Target.verify over the N nodes (logits of all nodes to the host), commit = "
          "Target.commit of the deepest path; per-branch = each root-to-leaf path its own sequence (ids by "
          "decreasing length, llama_memory_seq_cp of the prompt's sequence, unified KV), one batch, "
          "time incl. the forks; chain = the deepest path decoded on a context with n_rs_seq = 16, rollback "
          "= llama_memory_seq_rm to the accepted prefix (bookkeeping; the snapshot is read by the next "
          "decode); every iteration starts from the post-prompt state (restore untimed)")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-verify"), description=__doc__.split("\n")[0],
                                 epilog=alias_note("tfm-bench verify"))
    ap.add_argument("--model", help="an existing qwen35 GGUF (default: write one, see --layers/--vocab)")
    ap.add_argument("--layers", type=positive_int, default=4, help="layers of the written model (multiple of 4; "
                    "default 4 = 3 DeltaNet + 1 attention)")
    ap.add_argument("--vocab", type=positive_int, default=248_320, help="vocabulary of the written model")
    ap.add_argument("--tiny", action="store_true", help="write the tiny test shape instead (n_embd 64, S 16)")
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16", help="2-D weights of the written model")
    ap.add_argument("--keep-model", metavar="PATH", help="write the model here and keep it (default: a temp file)")
    ap.add_argument("--ctx", type=positive_int, default=512, help="prompt tokens prefilled (default 512)")
    ap.add_argument("--nodes", type=int_list, default=[16, 32, 64, 128], help="tree sizes (default 16,32,64,128)")
    ap.add_argument("--accept", type=float, default=0.5, help="chain: accepted fraction of the deepest path")
    add_timing_args(ap, iters=10, warmup=2, threads=os.cpu_count() or 1)
    ap.add_argument("--modes", default="branch,chain", help="modes besides tree (default branch,chain)")
    ap.add_argument("--tol", type=float, help="check tolerance, relative to a row's largest |logit| "
                    f"(default {vs.REL_TOL['cpu']} on the CPU, {vs.REL_TOL['gpu']} on a GPU)")
    a = ap.parse_args(argv)
    if a.layers % 4 and not a.tiny:
        ap.error("--layers must be a multiple of 4 (3 DeltaNet + 1 attention per group)")
    if not 0 < a.accept < 1:
        ap.error("--accept must be in (0, 1)")
    a.modes = [m for m in a.modes.split(",") if m]
    if set(a.modes) - {"branch", "chain"}:
        ap.error("--modes takes branch and/or chain")
    return a


def model_shape(a) -> HybridShape:
    return (HybridShape(n_layer=a.layers, n_vocab=a.vocab) if a.tiny
            else HybridShape.qwen36_27b(n_layer=a.layers, n_vocab=a.vocab))


def _row(cells, widths) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def print_table(cases: list[dict]) -> None:
    """Median ms per size: tree verify / commit, per-branch, chain verify / rollback, and ratios."""
    w = (5, 6, 5, 9, 8, 10, 9, 9, 9, 9)
    print(_row(("N", "leaves", "depth", "tree", "commit", "per-branch", "chain", "rollback", "br/tree",
                "chain/tr"), w))
    for c in cases:
        t = c.get("times")
        if not t:
            print(_row((c["nodes"], c["leaves"], c["depth"], "INCORRECT"), w[:4]))
            continue
        med = {k: v["median_ms"] for k, v in t.items()}
        f = lambda k: f"{med[k]:.3f}" if k in med else "-"  # noqa: E731
        r = lambda k: f"{med[k] / med['tree']:.2f}x" if k in med else "-"  # noqa: E731
        print(_row((c["nodes"], c["leaves"], c["depth"], f("tree"), f("tree_commit"), f("branch"), f("chain"),
                    f("chain_rollback"), r("branch"), r("chain")), w))


def main(argv=None) -> None:
    a = parse_args(argv)
    tmp = None
    if a.model:
        path, shape, write_s = Path(a.model), None, None
    else:
        shape = model_shape(a)
        if a.keep_model:
            path = Path(a.keep_model)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="tfm-verify-")
            path = Path(tmp.name) / "hybrid.gguf"
        print(f"writing {path} ({file_bytes(shape, a.dtype) / 1e9:.2f} GB, {a.dtype})", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        write_qwen35(path, shape, dtype=a.dtype, seed=a.seed)
        write_s = time.perf_counter() - t0
    try:
        cases, meta = bench(a, path)
    finally:
        if tmp is not None:
            tmp.cleanup()
    device = meta["device"]
    print(f"device {device}, model {meta['model']}, ctx {a.ctx}\nmethod: {METHOD}")
    print_table(cases)
    if a.json:
        doc = {**run_record(argv), **meta,
               "dims": asdict(shape) if shape else None, "layers": meta["model"]["n_layer"],
               "vocab": meta["model"]["n_vocab"], "dtype": a.dtype if shape else None, "write_s": write_s,
               "ctx": a.ctx, "threads": a.threads, "iters": a.iters, "warmup": a.warmup, "seed": a.seed,
               "accept": a.accept, "tol": a.tol or vs.REL_TOL[device], "method": METHOD, "cases": cases,
               # a model generated here and deleted is not hashed: dims, dtype and seed make it again
               "provenance": provenance({"model": None if tmp is not None else path})}
        write_json(a.json, doc)
    if not all(c["check"]["correct"] for c in cases):
        print("some tree sizes were not correct (not timed): see the check errors", file=sys.stderr)
        raise SystemExit(1)


def bench(a, path: Path) -> tuple[list[dict], dict]:
    """Check and time every ``--nodes`` size on the model at ``path``: (case dicts, run metadata)."""
    device = "gpu" if gpu_available() else "cpu"
    rng = np.random.default_rng(a.seed)
    modes: dict = {}
    try:
        tm = modes["tree"] = vs.TreeMode(path, a.ctx, max(a.nodes), a.threads)
        n_vocab = tm.target.model.n_vocab
        prompt = [int(t) for t in rng.integers(0, n_vocab, a.ctx)]
        cases = {n: vs.make_case(n, rng, n_vocab, a.accept) for n in a.nodes}
        tm.prefill(prompt)
        if "branch" in a.modes:
            modes["branch"] = vs.BranchMode(tm.target, prompt, max(len(c.paths) for c in cases.values()),
                                            max(sum(map(len, c.paths)) for c in cases.values()), a.threads)
        if "chain" in a.modes:
            modes["chain"] = vs.ChainMode(tm.target, prompt, a.threads)
        out = []
        for n, c in cases.items():
            d = {"nodes": n, "leaves": len(c.paths), "depth": len(c.deepest), "n_keep": c.n_keep,
                 "branch_tokens": sum(map(len, c.paths)), "path_lengths": sorted({len(p) for p in c.paths}),
                 "check": vs.check_case(c, modes, a.tol or vs.REL_TOL[device])}
            print(f"N={n}: {d['leaves']} leaves, depth {d['depth']}, correct {d['check']['correct']} "
                  f"{d['check']['errors']}", file=sys.stderr, flush=True)
            if d["check"]["correct"]:
                d["times"] = vs.time_case(c, modes, a.warmup, a.iters)
            out.append(d)
        m = tm.target.model
        meta = {"device": device, "device_name": device_name(device), "modes": ["tree"] + a.modes,
                "model": {"path": str(path), "arch": m.arch, "n_layer": m.n_layer, "n_embd": m.n_embd,
                          "n_vocab": m.n_vocab, "bytes": path.stat().st_size}}
        return out, meta
    finally:
        for k in ("chain", "branch", "tree"):
            if k in modes:
                modes[k].close()


if __name__ == "__main__":
    main()
