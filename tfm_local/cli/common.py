"""Arguments and engine construction shared by the command-line tools."""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone

# write_json(path, doc): the tools' JSON output, written atomically (tfm_local.files.atomic; re-exported here)
from ..files.atomic import write_json  # noqa: F401
from ..decode.methods import TREE_SHAPES
from .program import program_name


#: What speculative decoding guarantees, for the tools' help texts.
LOSSLESS = ("Speculative decoding is lossless: at temperature 0 the answer is the target's own greedy decoding "
            "(up to numerical near-ties, where a batched pass may pick the other of two nearly equal tokens), "
            "and above 0 it is drawn from the target's own distribution; a good drafter only makes it faster.")


#: The tools' context length when --n-ctx is not given, in tokens.
DEFAULT_N_CTX = 4096


def fail(msg: str, code: int = 2) -> None:
    """Print ``prog: error: msg`` and exit without a traceback (``prog``: ``program.program_name()``, e.g.
    "tfm-bench pass" when the tfm-bench command runs the tool)."""
    print(f"{program_name()}: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _int_at_least(text: str, lo: int, expected: str, name: str = "value") -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"{name} must be >= {lo}, got {v}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    return _int_at_least(text, 1, "an integer >= 1")


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (argparse type)."""
    return _int_at_least(text, 0, "an integer >= 0")


def int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1, e.g. tree sizes ``16,32,64`` (argparse type)."""
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"node counts must be >= 1, got {text!r}")
    return out


def gpu_name() -> str | None:
    """The first GPU's name from ``nvidia-smi`` (None when there is none or it fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def device_name(device: str) -> str | None:
    """The name of a benchmark's device: ``gpu_name()`` for "gpu", else the CPU's (``platform``)."""
    return gpu_name() if device == "gpu" else platform.processor() or platform.machine()


def add_timing_args(ap: argparse.ArgumentParser, *, iters: int, warmup: int, threads: int | None) -> None:
    """--iters, --warmup (defaults given), --threads (default ``threads``; None = all cores), --seed, --json:
    the options of the op and pass benchmarks."""
    ap.add_argument("--iters", type=positive_int, default=iters, help=f"timed iterations (default {iters})")
    ap.add_argument("--warmup", type=nonnegative_int, default=warmup, help=f"untimed iterations (default {warmup})")
    ap.add_argument("--threads", type=positive_int, default=threads,
                    help=f"CPU threads (default {threads or 'all cores'})")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="random seed, >= 0 (default 0)")
    ap.add_argument("--json", metavar="PATH", help="write the results here")


def run_record(argv) -> dict:
    """The head of a result JSON: the command line as run, ``argv`` (main's, None = ``sys.argv[1:]``) and the
    date (UTC, ISO 8601 to the second)."""
    return {"command": shlex.join(sys.argv), "argv": list(sys.argv[1:] if argv is None else argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def check_writable(path: str, flag: str) -> None:
    """Exit with a clear error (``fail``) when ``path`` cannot be written: its folder is missing or not
    writable, or ``path`` is a folder. For output options, checked before a long run rather than after."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or os.path.isdir(path):
        fail(f"cannot write {flag} {path}: no such folder, or it is a folder")
    if not os.access(folder, os.W_OK):
        fail(f"cannot write {flag} {path}: the folder {folder} is not writable")


def budget_arg(text: str) -> int | str:
    """``--budget`` value: 'auto' or an integer >= 0."""
    return text if text == "auto" else _int_at_least(text, 0, "'auto' or an integer >= 0", "budget")


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    """--target, --drafter, --no-draft, --budget, --n-ctx, KV types, threads, --no-prompt-cache."""
    ap.add_argument("--target", default=None,
                    help="target GGUF: a path, hf://owner/repo/file.gguf or a built-in name, fetched with a "
                         "progress bar when missing (tfm-models list shows them; default qwen2.5-coder-1.5b-instruct)")
    ap.add_argument("--drafter", default="auto", help="DFlash drafter GGUF (path, hub spec or built-in); "
                    "'auto' = the default drafter of the target")
    ap.add_argument("--no-draft", action="store_true", help="plain decoding (no drafter)")
    ap.add_argument("--draft-vocab", default="auto", metavar="auto|full|IDS.npy",
                    help="the drafter's draft vocabulary: 'auto' (default): the reduced vocabulary shipped with "
                         "the drafter, if any, when the drafter runs on the CPU, the full one on a GPU "
                         "($TFM_DRAFT_VOCAB=0: always the full one); 'full' (the whole target "
                         "vocabulary), or an .npy file of target token ids")
    ap.add_argument("--budget", type=budget_arg, default="auto",
                    help="draft tokens verified per step: 'auto' (default: chosen per step from measured "
                         "costs and acceptance, plain decoding when drafting does not pay), or N (0 = plain)")
    ap.add_argument("--tree", default="chain", choices=TREE_SHAPES,
                    help="draft shape: the DFlash chain, a DDTree best-first tree over the marginals, a w-wide heap "
                         "tree, a TfM tree scored by a Weaver (--weaver), a DARTree tree scored by a Weaver or a "
                         "DFlash2 drafter's path selector, or a DFlash2 drafter's best-first tree over its "
                         "selector's lattice (a DFlash2 drafter's chain is the lattice's greedy walk)")
    ap.add_argument("--weaver", default=None, metavar="WEAVER.gguf",
                    help="the Weaver of --tree tfm / dartree (tfm-train weaver / tfm-convert --weaver), trained "
                         "for this target")
    ap.add_argument("--n-ctx", type=int, default=None,
                    help=f"context length in tokens (default {DEFAULT_N_CTX}; a warning when it is above the "
                         "context the target was trained for)")
    ap.add_argument("--kv-type", default="f16", choices=["f16", "q8_0"], help="target KV cache type")
    ap.add_argument("--drafter-kv-type", default="f16", choices=["f16", "q8_0"], help="drafter KV cache type")
    ap.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is available")
    ap.add_argument("--greedy-argmax", default="auto", choices=["auto", "backend", "host"],
                    help="greedy decoding: each verified row's argmax computed on the target's backend, or "
                         "its logits copied to the host and argmax there (default auto: the one measured faster, "
                         "backend on a GPU, host on the CPU; $TFM_GREEDY_ARGMAX overrides auto)")
    ap.add_argument("--no-prompt-cache", action="store_true",
                    help="prefill every prompt from its first token (default: the caches of the last answer are "
                         "kept, and a prompt that starts with the same tokens, a follow-up turn or a repeated "
                         "request, prefills only the rest)")


def add_sampling_args(ap: argparse.ArgumentParser) -> None:
    """--temperature, --top-k, --top-p, --min-p, --seed."""
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                seed=args.seed)


def check_weaver_use(args: argparse.Namespace) -> None:
    """``--weaver`` with the draft options of tfm-chat / tfm-serve: an error without drafting (nothing
    would read it), a note on stderr with a tree that does not use it (it is loaded all the same)."""
    if getattr(args, "weaver", None) is None:
        return
    if args.no_draft or args.budget == 0:
        fail("--weaver scores the drafter's candidates and needs drafting: drop --no-draft / --budget 0, "
             "or --weaver")
    if args.tree not in ("tfm", "dartree"):
        print(f"note: --weaver is read by --tree tfm or dartree only (here --tree {args.tree})", file=sys.stderr)


def engine_from_args(args: argparse.Namespace):
    """Build the Engine; model and drafter problems end the program with a clear message."""
    from ..engine import Engine
    from ..files.models import ModelError

    try:
        budget = args.budget
        engine = Engine(target=args.target, drafter=None if args.no_draft else args.drafter,
                        n_ctx=DEFAULT_N_CTX if args.n_ctx is None else args.n_ctx, budget=budget, kv_type=args.kv_type,
                        drafter_kv_type=args.drafter_kv_type, n_threads=args.threads,
                        n_gpu_layers=0 if args.cpu else -1, tree=args.tree,
                        greedy_argmax=getattr(args, "greedy_argmax", "auto"),
                        draft_vocab=getattr(args, "draft_vocab", "auto"), weaver=getattr(args, "weaver", None),
                        prompt_cache=not getattr(args, "no_prompt_cache", False))
    except (OSError, ValueError, RuntimeError, ModelError) as e:
        fail(str(e))
    if args.n_ctx is not None:  # the user's choice (the default is below every built-in's training context)
        warn_past_training(args.n_ctx, engine.target.model)
    return engine


def warn_past_training(n_ctx: int, model) -> None:
    """One warning line on stderr when ``n_ctx`` (tokens) is above the context the target was trained for
    (its GGUF's ``context_length``, ``model.n_ctx_train``; nothing when the file does not say)."""
    n_train = model.n_ctx_train
    if 0 < n_train < n_ctx:
        print(f"warning: --n-ctx {n_ctx} is above the {n_train} tokens {model.path.name} was trained for "
              f"(its context_length): answers may degrade past {n_train} tokens", file=sys.stderr)
