"""tfm-train: build a training corpus, train a DFlash drafter for a GGUF target, export and check it.

Subcommands (see docs/training.md for the full GPU run):
  prompts         tokenize the ShareGPT prompt selection (for `data --prompts` where llama.cpp is absent)
  data            generate the corpus: the target's own responses, greedy or sampled (resumable, appendable)
  emphasis        the prompts of a prompt file that ask for writing or role-play (for fit --emphasis)
  kinds           the kind of each prompt of a prompt file (for fit --kinds: the held-out walk per kind)
  walk            engine-style τ (chain, DDTree@16) of drafters walking recorded responses (walk.py)
  fit             train the drafter on the corpus (resumable), then export it
  export          z-lab layout + GGUF (f16, q8_0) from a checkpoint
  check-features  PyTorch vs llama.cpp layer inputs of the target (cosine per layer)
  parity          PyTorch vs llama.cpp drafter top-1 agreement
  smoke           the whole pipeline on a tiny synthetic target (CPU, about a minute)

fit on several GPUs of one host (data-parallel; each step takes one batch per GPU, so N GPUs take
N times the batches per step and a run has 1/N of the steps; --max-steps, --save-every, the log
count these steps; a checkpoint resumes only with the same number of GPUs):
  torchrun --standalone --nproc_per_node 2 -m tfm_local.cli.train fit --corpus ... --target ... --out ...
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from .common import fail


def _target(spec: str) -> str:
    from tfm_local.files.models import resolve_model

    return str(resolve_model(spec))


def _device(name: str) -> str:
    """The torch device for ``--device``: ``auto`` (cuda when torch sees a GPU), ``cpu``, ``cuda`` or
    ``cuda:N``. Raises SystemExit (exit 2 with a message) for any other name or for a GPU torch does not see."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or name.startswith("cuda:") and name[5:].isdigit()):
        fail(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {name}: this PyTorch sees no CUDA GPU (torch {torch.__version__}); use --device cpu")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        fail(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return name


def _selection_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seed", type=int, default=0, help="prompt shuffle seed (default 0)")
    ap.add_argument("--min-chars", type=int, default=8, help="shortest prompt in characters (default 8)")
    ap.add_argument("--max-chars", type=int, default=6000, help="longest prompt in characters (default 6000)")
    ap.add_argument("--scan-limit", type=int, default=None, help="read only the first N ShareGPT conversations")
    ap.add_argument("--turns", type=int, default=1,
                    help="user turns taken per conversation: 1 = the first only (default); N > 1 adds each "
                         "later turn with the conversation before it as context")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024,
                    help="skip prompts longer than this after the chat template (default 1024)")


def _selection(args):
    from tfm_local.train.prompts import Selection

    if args.turns < 1:
        raise SystemExit(f"tfm-train: --turns must be >= 1, got {args.turns}")
    return Selection(args.seed, args.min_chars, args.max_chars, args.scan_limit, args.turns)


def cmd_prompts(args) -> None:
    """``tfm-train prompts``: select, tokenize and save the prompts."""
    from tfm_local.train.corpus import target_identity
    from tfm_local.train.prompts import ChatTokenizer, PromptFile, reply_ids, select_pairs, tokenize_prompts

    target, sel = _target(args.target), _selection(args)
    pairs = select_pairs(sel)[: args.n_prompts]
    tok = ChatTokenizer(target)
    try:
        ids = tokenize_prompts([p for p, _ in pairs], tok, args.max_prompt_tokens, progress=True)
        replies = reply_ids(pairs, ids, tok, args.max_reply_tokens) if args.replies else None
        meta = {"selection": sel.to_dict(), "target": target_identity(target),
                "max_prompt_tokens": args.max_prompt_tokens}
        PromptFile(ids, tok.eog_ids(), meta, replies).save(args.out)
    finally:
        tok.close()
    kept = sum(x is not None for x in ids)
    print(f"{args.out}: {kept} prompts kept of {len(ids)} ({len(ids) - kept} over {args.max_prompt_tokens} tokens)")
    if replies is not None:
        print(f"{args.out}: {sum(r is not None for r in replies)} ShareGPT replies kept "
              f"({sum(len(r) for r in replies if r is not None)} tokens)")


def cmd_emphasis(args) -> None:
    """``tfm-train emphasis``: the prompts of a prompt file that ask for writing or role-play."""
    import numpy as np

    from tfm_local.train.corpus import order_key
    from tfm_local.train.emphasis import CODE, WRITING, keyword_ranks, save_emphasis
    from tfm_local.train.prompts import PromptFile, Selection, select_prompts

    pf = PromptFile.load(args.prompts)
    texts = select_prompts(Selection(**pf.meta["selection"]))
    ranks = np.array([r for r, x in enumerate(pf.ids) if x is not None], dtype=np.int64)
    hit = keyword_ranks(texts, ranks)
    order = order_key(pf.meta["selection"], pf.meta["max_prompt_tokens"])
    save_emphasis(args.out, hit, order, f"writing: {WRITING.pattern} unless: {CODE.pattern}")
    print(f"{args.out}: {len(hit)} of {len(ranks)} prompts ask for writing or role-play")


def cmd_kinds(args) -> None:
    """``tfm-train kinds``: the kind of each prompt of a prompt file (role-play, code, math, writing, other)."""
    from collections import Counter

    from tfm_local.train.corpus import order_key
    from tfm_local.train.emphasis import prompt_kind, save_kinds
    from tfm_local.train.prompts import PromptFile, Selection, select_prompts

    pf = PromptFile.load(args.prompts)
    texts = select_prompts(Selection(**pf.meta["selection"]))
    ranks = [r for r, x in enumerate(pf.ids) if x is not None]
    kinds = [prompt_kind(texts[r]) for r in ranks]
    save_kinds(args.out, ranks, kinds, order_key(pf.meta["selection"], pf.meta["max_prompt_tokens"]))
    print(f"{args.out}: " + ", ".join(f"{k} {n}" for k, n in sorted(Counter(kinds).items())))


def cmd_walk(args) -> None:
    """``tfm-train walk``: engine-style τ of each drafter over the sequences of a sequence file."""
    import json

    import torch

    from tfm_local.files.atomic import write_json
    from tfm_local.train.model import DFlashDraft
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.walk import load_sequences, walk_tau
    from tfm_local.train.warmstart import load_init_source, load_source

    seqs, kinds, cap = load_sequences(args.seqs)
    target, device = _target(args.target), _device(args.device)
    cuda = device.startswith("cuda")
    tgt = TorchTarget(target, device, torch.bfloat16 if cuda else torch.float32)
    rows = []
    for path in args.drafter:
        src = load_init_source(path, target)
        drafter = DFlashDraft(src.config).to(device)
        load_source(drafter, src)
        res = walk_tau(drafter, tgt, seqs, torch.device(device), cuda, kinds, args.max_tokens or cap)
        rows.append({"drafter": path, **res})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        write_json(args.json, {"seqs": args.seqs, "target": target, "max_tokens": args.max_tokens or cap,
                               "results": rows})


def _prompt_source(args, target):
    """(prompts, selection dict, max_prompt_tokens) from --prompts FILE or ShareGPT + llama.cpp."""
    from tfm_local.train.generate import FilePrompts, LazyPrompts
    from tfm_local.train.prompts import ChatTokenizer, PromptFile, select_prompts

    if args.prompts:
        pf = PromptFile.load(args.prompts)
        return FilePrompts(pf), pf.meta["selection"], int(pf.meta["max_prompt_tokens"])
    sel = _selection(args)
    return LazyPrompts(select_prompts(sel), ChatTokenizer(target), args.max_prompt_tokens), sel.to_dict(), \
        args.max_prompt_tokens


def cmd_data(args) -> None:
    """``tfm-train data``: generate (or resume) the corpus."""
    from tfm_local.train.generate import LlamaBackend, ReferenceBackend, TorchBackend, build_corpus

    if args.backend == "reference" and not args.prompts:
        raise SystemExit("tfm-train data: --backend reference needs --prompts FILE made with `prompts --replies`")
    target = _target(args.target)
    prompts, sel, max_prompt = _prompt_source(args, target)
    pf = getattr(prompts, "pf", None)  # the prompt file (--prompts), before any --only choice
    only = None
    if args.only:
        prompts, only = _only_prompts(prompts, args.only, sel, max_prompt)
    if args.backend == "reference":
        backend = ReferenceBackend(pf)
    elif args.backend == "torch":
        backend = TorchBackend(target, prompts.eog, _device(args.device), args.dtype, args.batch_size,
                               args.temperature, args.sample_seed)
    else:
        backend = LlamaBackend(target, max_prompt + args.max_new_tokens + 8, 0 if args.cpu else -1, args.threads,
                               args.temperature, args.sample_seed)
    try:
        m = build_corpus(args.out, target, prompts, backend, n_prompts=args.n_prompts, max_new=args.max_new_tokens,
                         shard_size=args.shard_size, selection=sel, max_prompt_tokens=max_prompt,
                         first=args.first_prompt, only=only,
                         time_budget_s=None if args.time_budget is None else 60.0 * args.time_budget)
    finally:
        backend.close()
    c = m["counts"]
    print(f"{args.out}: {c['sequences']} sequences, {c['tokens']} tokens ({c['response_tokens']} generated), "
          f"prompt ranks up to {c['prompts_consumed']} done")
    if c["sequences"] == 0:
        print(f"warning: no sequence generated (--first-prompt {args.first_prompt}, -n {args.n_prompts}, "
              f"{len(prompts)} prompts in the order)", file=sys.stderr)


def _only_prompts(prompts, path, sel: dict, max_prompt: int):
    """(the prompts of an emphasis file's ranks only, its record for the manifest).

    Raises:
        TrainError: the file's prompt order is not this selection's.
        FileNotFoundError / CorruptArtifactError: no such file, or not an emphasis file.
    """
    from tfm_local.files.atomic import sha256_file
    from tfm_local.train.corpus import order_key
    from tfm_local.train.emphasis import load_emphasis
    from tfm_local.train.errors import TrainError
    from tfm_local.train.generate import OnlyPrompts

    order, ranks = load_emphasis(path)
    if order != order_key(sel, max_prompt):
        raise TrainError(f"{path} names prompts of another prompt order than this selection's: "
                         "build it from the same prompt file")
    record = {"file": os.path.basename(path), "sha256": sha256_file(path), "prompts": len(ranks)}
    return OnlyPrompts(prompts, ranks), record


def _fit_options(args):
    from tfm_local.train.recipe import FitOptions

    return FitOptions(epochs=args.epochs, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
                      weight_decay=args.weight_decay, grad_clip=args.grad_clip, batch_tokens=args.batch_tokens,
                      anchors=args.anchors, gamma=args.gamma, max_len=args.max_len, seed=args.seed,
                      save_every=args.save_every, max_steps=args.max_steps, log_every=args.log_every,
                      time_budget_s=None if args.time_budget is None else 60.0 * args.time_budget,
                      holdout=args.holdout, eval_every=args.eval_every, soft_weight=args.soft_weight,
                      reference_weight=args.reference_weight,
                      emphasis=args.emphasis, emphasis_times=_emphasis_times(args))


def _emphasis_times(args) -> int:
    """--emphasis-times, 2 by default with --emphasis (1 = the file only checked, nothing repeated).

    Raises:
        TrainError: --emphasis-times without --emphasis.
    """
    from tfm_local.train.errors import TrainError

    if args.emphasis_times is not None and not args.emphasis:
        raise TrainError("--emphasis-times needs --emphasis FILE (the prompts to repeat)")
    return args.emphasis_times if args.emphasis_times is not None else (2 if args.emphasis else 1)


def cmd_fit(args) -> None:
    """``tfm-train fit``: train (or resume), then export (under torchrun: rank 0 exports)."""
    from tfm_local.train.export import export
    from tfm_local.train.fit import fit
    from tfm_local.train.parallel import is_main_process
    from tfm_local.train.warmstart import ShapeRequest

    if args.selector_rank is not None and not args.dflash2:
        fail("--selector-rank goes with --dflash2")
    if args.selector_rank is not None and args.selector_rank < 1:
        fail(f"--selector-rank must be at least 1, got {args.selector_rank}")
    opts = _fit_options(args)  # option errors before any model is looked up
    target = _target(args.target)
    # the shape options given: a new drafter's shape; checked against a resumed or warm-start drafter's
    shape = ShapeRequest(args.layers, args.ffn, args.target_layers, args.mask_token, True if args.dflash2 else None,
                         args.selector_rank)
    ckpt = fit(args.corpus, target, args.out, opts, None, _device(args.device),
               restart=args.restart, init_from=args.init_from, shape=shape, grow=args.grow_layers, kinds=args.kinds)
    if not is_main_process():  # under torchrun rank 0 alone reports and exports
        return
    print(f"checkpoint: {ckpt}")
    if not args.no_export:
        for k, p in export(ckpt, target, f"{args.out}/export", tuple(args.outtype)).items():
            print(f"{k}: {p}")


def cmd_weaver(args) -> None:
    """``tfm-train weaver``: train (or resume) a Weaver for the target and its drafter, both frozen."""
    import json
    from pathlib import Path

    from tfm_local.train.weaver_fit import WeaverOptions, fit_weaver

    if args.steps < 1 or args.batch_tokens < 1 or args.anchors < 1 or args.holdout < 0:
        fail("--steps, --batch-tokens and --anchors must be at least 1, --holdout at least 0")
    shape = {k: getattr(args, k) for k in ("width", "layers", "heads", "ffn", "rank", "top_k")
             if getattr(args, k) is not None}
    try:
        trees = tuple(int(b) for b in args.trees.split(",") if b.strip())
    except ValueError:
        fail(f"--trees must be comma-separated budgets, got {args.trees!r}")
    if any(b < 1 for b in trees):
        fail(f"--trees budgets must be at least 1, got {args.trees!r}")
    opts = WeaverOptions(steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens, anchors=args.anchors,
                         max_len=args.max_len, seed=args.seed, holdout=args.holdout, save_every=args.save_every,
                         log_every=args.log_every, shape=shape, trees=trees,
                         time_budget_s=None if args.time_budget is None else 60.0 * args.time_budget)
    target = _target(args.target)
    drafter = args.drafter
    if not Path(drafter).exists():
        from tfm_local.files.drafters import resolve_drafter, shipped_drafter_for

        if drafter == "auto" and shipped_drafter_for(Path(target), "full") is None:
            fail(f"no shipped drafter for {target}: give --drafter (GGUF, checkpoint.pt or z-lab folder)")
        drafter = str(resolve_drafter(drafter, Path(target), "full"))
    try:
        res = fit_weaver(args.corpus, target, drafter, args.out, opts, _device(args.device), progress=True,
                         restart=args.restart)
    except ValueError as e:  # a bad shape (WeaverConfig)
        fail(str(e))
    print(json.dumps(res, indent=1))
    if not args.no_export:
        from tfm_local.train.weaver_fit import export_weaver

        for k, p in export_weaver(res["checkpoint"], target, f"{args.out}/export", tuple(args.outtype)).items():
            print(f"{k}: {p}")


def cmd_export(args) -> None:
    """``tfm-train export``: z-lab layout and GGUFs of a checkpoint."""
    from tfm_local.train.export import export

    for k, p in export(args.checkpoint, _target(args.target), args.out, tuple(args.outtype)).items():
        print(f"{k}: {p}")


def cmd_check_features(args) -> None:
    """``tfm-train check-features``: exit 1 when a layer's mean cosine is below --min-cos."""
    import torch

    from tfm_local.train.checks import feature_cosines, sample_sequences

    target = _target(args.target)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    seqs = sample_sequences(target, args.max_new, args.threads)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    rows = feature_cosines(target, seqs, layers, _device(args.device), dtype, args.threads)
    print(f"{'layer':>5} {'mean cos':>9} {'min cos':>9} tokens")
    for r in rows:
        print(f"{r.layer:5d} {r.mean:9.5f} {r.min:9.5f} {r.n_tokens}")
    worst = min(r.mean for r in rows)
    print(f"worst layer mean cosine {worst:.5f} (threshold {args.min_cos})")
    if worst < args.min_cos:
        raise SystemExit(1)


def cmd_parity(args) -> None:
    """``tfm-train parity``: exit 1 when the agreement is below --min."""
    from tfm_local.train.checks import drafter_parity, lattice_parity, load_torch_drafter, sample_sequences
    from tfm_local.train.corpus import load_corpus

    target = _target(args.target)
    seqs = ([s.ids.tolist()[: args.max_len] for s in load_corpus(args.corpus)[1][: args.n_seqs]] if args.corpus
            else sample_sequences(target, 64, args.threads))
    model = load_torch_drafter(args.weights)
    agree, n = drafter_parity(args.drafter, model, target, seqs, args.points, args.threads)
    print(f"top-1 agreement {agree:.4f} over {n} block positions (threshold {args.min})")
    if model.config.dflash2:  # the selector's lattice too
        rows, err, m = lattice_parity(args.drafter, model, target, seqs, args.points, args.threads)
        print(f"DFlash2 lattice: best successors agree in {rows:.4f} of {m} rows (threshold {args.min}); "
              f"largest score difference {err:.2e} of the largest score")
        agree = min(agree, rows)
    if agree < args.min:
        raise SystemExit(1)


def cmd_smoke(args) -> None:
    """``tfm-train smoke``: exit 1 unless the loss fell and parity ≥ 0.99."""
    import tempfile

    from tfm_local.train.smoke import run_smoke

    wd = args.workdir or tempfile.mkdtemp(prefix="tfm-train-smoke-")
    r = run_smoke(wd, args.steps, progress=True)
    k = max(1, len(r.losses) // 5)
    first, last = sum(r.losses[:k]) / k, sum(r.losses[-k:]) / k
    print(f"workdir {wd}: {r.n_sequences} sequences; loss {first:.3f} -> {last:.3f}; "
          f"tau {r.taus[0]:.2f} -> {r.taus[-1]:.2f}; parity {r.parity:.4f} over {r.parity_positions} positions; "
          f"llama.cpp drafted {r.drafted}")
    if not (last < first and r.parity >= 0.99):
        raise SystemExit(1)


_OUTTYPES = ["f32", "f16", "bf16", "q8_0", "q5_0", "q4_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl"]  # tfm_convert.quant.OUTTYPES


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every subcommand."""
    ap = argparse.ArgumentParser(prog="tfm-train", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prompts", help="tokenize the prompt selection into an .npz")
    p.add_argument("--target", required=True, help="target GGUF (path or built-in name)")
    p.add_argument("--out", required=True, help="output .npz")
    p.add_argument("-n", "--n-prompts", type=int, default=None, help="first N of the shuffled selection (default all)")
    p.add_argument("--replies", action="store_true",
                   help="also keep ShareGPT's own reply to each kept prompt, tokenized as the target's turn "
                        "(for `data --backend reference`: a corpus without generation)")
    p.add_argument("--max-reply-tokens", type=_positive_int, default=1024,
                   help="with --replies: keep each reply's first N tokens (default 1024; set it to data's "
                        "--max-new-tokens to keep the file small)")
    _selection_args(p)
    p.set_defaults(func=cmd_prompts)

    p = sub.add_parser("data", help="generate the corpus (resumable)")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True, help="corpus folder (resumed when it exists)")
    p.add_argument("--prompts", default=None, help="prompt file from `tfm-train prompts` (no llama.cpp needed)")
    p.add_argument("-n", "--n-prompts", type=int, default=10**9,
                   help="generate up to this prompt rank, exclusive (default all)")
    p.add_argument("--first-prompt", type=_nonnegative_int, default=0, metavar="RANK",
                   help="start at this rank of the prompt order: machines can each take one slice, e.g. "
                        "`-n 20000` on one and `--first-prompt 20000` on another (default 0)")
    p.add_argument("--only", default=None, metavar="FILE",
                   help="generate for the prompts of this emphasis file only (`tfm-train emphasis`), keeping "
                        "their ranks: e.g. more sampled responses to writing prompts (another --sample-seed)")
    p.add_argument("--time-budget", type=_positive_float, default=None, metavar="MIN",
                   help="stop before a shard that would end after MIN minutes of generation (model loading "
                        "not counted); the same command resumes")
    _selection_args(p)
    p.add_argument("--backend", choices=["llama", "torch", "reference"], default="llama",
                   help="llama: Engine, one prompt at a time; torch: batched on a GPU; reference: ShareGPT's own "
                        "replies from a --prompts file made with `prompts --replies`, no model (default llama)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="response cap (default 1024)")
    p.add_argument("--temperature", type=_nonnegative_float, default=0.0,
                   help="0 = greedy responses (default); T > 0 = tokens sampled from softmax(logits / T): other "
                        "responses to the same prompts (fit them with --soft-weight)")
    p.add_argument("--sample-seed", type=int, default=0, help="sampling seed (with --temperature; default 0)")
    p.add_argument("--shard-size", type=int, default=512,
                   help="prompts per shard (default 512; with --only: chosen prompts per shard)")
    p.add_argument("--device", default="auto", help="torch backend device (default cuda when available)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="torch backend dtype")
    p.add_argument("--batch-size", type=int, default=128, help="torch backend rows per batch (default 128)")
    p.add_argument("--threads", type=int, default=None, help="llama backend CPU threads")
    p.add_argument("--cpu", action="store_true", help="llama backend: no GPU offload")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("emphasis", help="the prompts of a prompt file that ask for writing or role-play")
    p.add_argument("--prompts", required=True, help="prompt file (`tfm-train prompts`) the corpora came from")
    p.add_argument("--out", required=True, help="output emphasis .npz (for fit --emphasis)")
    p.set_defaults(func=cmd_emphasis)

    p = sub.add_parser("kinds", help="the kind of each prompt of a prompt file (for fit --kinds)")
    p.add_argument("--prompts", required=True, help="prompt file (`tfm-train prompts`) the corpora came from")
    p.add_argument("--out", required=True, help="output kinds .npz")
    p.set_defaults(func=cmd_kinds)

    p = sub.add_parser("walk", help="engine-style τ of drafters walking recorded responses")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, nargs="+", help="drafter GGUFs, checkpoints or z-lab folders")
    p.add_argument("--seqs", required=True, help="sequence file (walk.save_sequences; lab/gpu/bench_seqs.py)")
    p.add_argument("--max-tokens", type=_positive_int, default=None, help="generation cap (default: the file's)")
    p.add_argument("--device", default="auto", help="cuda or cpu (default cuda when available)")
    p.add_argument("--json", default=None, help="write the results here")
    p.set_defaults(func=cmd_walk)

    p = sub.add_parser("fit", help="train the drafter (resumable), then export")
    p.add_argument("--corpus", required=True, nargs="+", help="corpus folder(s) of the target, trained on together")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, log.jsonl, export/")
    p.add_argument("--layers", type=int, default=None, help="drafter layers (default 5)")
    p.add_argument("--ffn", type=int, default=None, help="drafter MLP width (default 3 × hidden)")
    p.add_argument("--target-layers", type=int, default=None, help="target layers read, shallow to deep (default 5)")
    p.add_argument("--mask-token", type=int, default=None, help="MASK id (default: first unused id of the vocabulary)")
    p.add_argument("--dflash2", action="store_true",
                   help="a DFlash2 drafter: dynamic convolutions and a path selector, trained jointly; with "
                        "--init-from a DFlash drafter, they start as the identity (the same drafts at step 0)")
    p.add_argument("--selector-rank", type=int, default=None, metavar="R",
                   help="with --dflash2: the path selector's rank (default min(256, hidden / 2)); its two codebooks "
                        "are vocabulary x R each (151,936 x 256: 44 MB in q4_0), so a smaller rank keeps the file "
                        "small; a multiple of 32 keeps them quantizable")
    p.add_argument("--init-from", default=None, metavar="PATH",
                   help="start a new run from this drafter's weights (z-lab folder with config.json + "
                        "model.safetensors, a checkpoint.pt, or a drafter GGUF of any type, e.g. the shipped "
                        "q4_0 one: its dequantized values), fresh optimiser and schedule; its shape is "
                        "kept (--layers/--ffn, if given, must match); ignored once --out holds a checkpoint")
    p.add_argument("--grow-layers", type=int, default=None, metavar="N",
                   help="with --init-from: deepen that drafter to N layers, the new ones appended with zero "
                        "output projections (they start as the identity: the same predictions at step 0)")
    d = _fit_defaults()
    for name, typ in (("epochs", int), ("lr", float), ("min-lr", float), ("warmup", float),
                      ("weight-decay", float), ("grad-clip", float), ("batch-tokens", int), ("anchors", int),
                      ("gamma", float), ("max-len", int), ("seed", int), ("save-every", int), ("log-every", int),
                      ("holdout", int), ("eval-every", int), ("soft-weight", _unit_float),
                      ("reference-weight", _unit_float)):
        key = name.replace("-", "_")
        p.add_argument(f"--{name}", type=typ, default=d[key], help=f"{_FIT_HELP.get(key, '')}(default {d[key]})")
    p.add_argument("--emphasis", default=None, metavar="FILE",
                   help="emphasis file (`tfm-train emphasis`): train more often on these prompts' sequences")
    p.add_argument("--emphasis-times", type=_positive_int, default=None, metavar="K",
                   help="with --emphasis: each of those sequences K times per epoch (default 2)")
    p.add_argument("--kinds", default=None, metavar="FILE",
                   help="kinds file (`tfm-train kinds`): the held-out walk also per kind of prompt")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps in total")
    p.add_argument("--time-budget", type=_positive_float, default=None, metavar="MIN",
                   help="end the fit (schedule included) within MIN minutes of wall clock")
    p.add_argument("--device", default="auto", help="cuda or cpu (default cuda when available)")
    p.add_argument("--restart", action="store_true", help="discard an existing checkpoint in --out")
    p.add_argument("--no-export", action="store_true", help="skip the export at the end")
    p.add_argument("--outtype", nargs="+", default=["f16", "q8_0"], choices=_OUTTYPES,
                   help="GGUF types to export (default f16 q8_0)")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("weaver", help="train a Weaver (TfM correction head) for the target and its drafter")
    p.add_argument("--corpus", required=True, nargs="+", help="corpus folder(s) of the target")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", default="auto",
                   help="the frozen DFlash drafter: GGUF, checkpoint.pt or z-lab folder (default: the shipped one)")
    p.add_argument("--out", required=True, help="run folder (weaver.pt; resumed when present)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--batch-tokens", type=int, default=32768)
    p.add_argument("--anchors", type=int, default=16, help="drafts per sequence per step")
    p.add_argument("--max-len", type=int, default=3072)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--holdout", type=int, default=0, help="sequences kept out and scored at the end")
    p.add_argument("--time-budget", type=_positive_float, default=None, metavar="MIN",
                   help="minutes of training steps: the schedule is fitted to the steps that fit (at most --steps)")
    p.add_argument("--trees", default="16,32,64",
                   help="with --holdout: budgets of the held-out τ of chain, DDTree and TfM trees (default 16,32,64)")
    p.add_argument("--save-every", type=int, default=250)
    p.add_argument("--log-every", type=int, default=10)
    for name in ("width", "layers", "heads", "ffn", "rank", "top-k"):
        p.add_argument(f"--{name}", type=int, default=None, help="Weaver shape (default: weaver.WeaverConfig)")
    p.add_argument("--device", default="auto", help="cuda or cpu (default cuda when available)")
    p.add_argument("--restart", action="store_true", help="discard an existing weaver.pt in --out")
    p.add_argument("--no-export", action="store_true", help="skip the GGUF export at the end")
    p.add_argument("--outtype", nargs="+", default=["f16", "q8_0"], choices=_OUTTYPES,
                   help="Weaver GGUF types to export to --out/export (default f16 q8_0)")
    p.set_defaults(func=cmd_weaver)

    p = sub.add_parser("export", help="z-lab layout + GGUF from a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True, help="output folder (hf/ and drafter-<type>.gguf)")
    p.add_argument("--outtype", nargs="+", default=["f16", "q8_0"], choices=_OUTTYPES)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("check-features", help="PyTorch vs llama.cpp target layer inputs")
    p.add_argument("--target", required=True)
    p.add_argument("--layers", default=None, help="comma-separated layer-input indices (default all)")
    p.add_argument("--max-new", type=int, default=64, help="greedy tokens appended to each sample prompt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--min-cos", type=float, default=0.99, help="fail below this mean cosine (default 0.99)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=cmd_check_features)

    p = sub.add_parser("parity", help="PyTorch vs llama.cpp drafter agreement")
    p.add_argument("--drafter", required=True, help="drafter GGUF")
    p.add_argument("--weights", required=True, help="checkpoint.pt or z-lab folder of the same drafter")
    p.add_argument("--target", required=True)
    p.add_argument("--corpus", default=None, help="take sequences from this corpus (default: sample prompts)")
    p.add_argument("--n-seqs", type=int, default=3)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--points", type=int, default=8, help="draft positions per sequence")
    p.add_argument("--min", type=float, default=0.99, help="fail below this agreement (default 0.99)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("smoke", help="whole pipeline on a tiny synthetic target (CPU)")
    p.add_argument("--workdir", default=None, help="folder to keep the artifacts (default a temporary one)")
    p.add_argument("--steps", type=int, default=150)
    p.set_defaults(func=cmd_smoke)
    return ap


_FIT_HELP = {
    "holdout": "corpus sequences set aside (the last N), never trained on; their loss and acceptance proxy "
               "are logged as heldout_loss / heldout_tau ",
    "eval_every": "steps between held-out evaluations ",
    "soft_weight": "weight in [0, 1] of the cross-entropy against the target's whole next-token distribution "
                   "(distillation; the rest is the greedy label's) ",
    "reference_weight": "the same weight for the sequences of reference corpora (`data --backend reference`: "
                        "ShareGPT's replies; 1 = the target's distribution only, their tokens are context) ",
}


def _unit_float(text: str) -> float:
    """argparse type: a float in [0, 1]."""
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def _nonnegative_int(text: str) -> int:
    """argparse type: an int ≥ 0."""
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _positive_int(text: str) -> int:
    """argparse type: an int ≥ 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


def _nonnegative_float(text: str) -> float:
    """argparse type: a finite float ≥ 0."""
    v = float(text)
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _fit_defaults() -> dict:
    import dataclasses

    from tfm_local.train.recipe import FitOptions

    return dataclasses.asdict(FitOptions())


def main(argv=None) -> None:
    """Entry point of ``tfm-train``."""
    args = build_parser().parse_args(argv)
    from tfm_convert import ConvertError
    from tfm_local.files.atomic import OutputPathError
    from tfm_local.files.datasets import DataNotFoundError
    from tfm_local.files.models import ModelError
    from tfm_local.train.errors import TrainError

    try:
        args.func(args)
    except (TrainError, ConvertError, DataNotFoundError, FileNotFoundError, OutputPathError, ModelError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted (the last checkpoint / shard is intact; run the same command to resume)", 130)


if __name__ == "__main__":
    main(sys.argv[1:])
