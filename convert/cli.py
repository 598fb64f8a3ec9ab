"""``tfm-convert``: DFlash drafters to GGUF for llama.cpp.

    tfm-convert CHECKPOINT --target TARGET -o OUT.gguf [--outtype f16]
    tfm-convert DRAFTER.gguf --target TARGET -o OUT.gguf --outtype q4_k   (requantize)
    tfm-convert --init-random --target TARGET -o OUT.gguf [--layers N] [--ffn N] [--seed S] [--hf-out DIR] [--dflash2]
    tfm-convert --reduce DRAFTER.gguf --target TARGET -o OUT.gguf
                (--corpus DIR... [--draft-vocab-size K] | --ids IDS.npy) [--save-ids IDS.npy]
    tfm-convert --corpus DIR... --target TARGET --save-ids IDS.npy [--draft-vocab-size K]
    tfm-convert --weaver WEAVER.pt|WEAVER.gguf --target TARGET -o OUT.gguf [--outtype q8_0]

TARGET is a GGUF path or a model spec understood by ``tfm_local.files.models``.
Errors print ``tfm-convert: error: ...`` and exit with status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .errors import ConvertError, convert_errors
from .quant import OUTTYPES, parse_tensor_types


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of tfm-convert."""
    p = argparse.ArgumentParser(
        prog="tfm-convert",
        description="Convert a DFlash drafter (z-lab Hugging Face layout) to a GGUF that llama.cpp's "
                    "dflash architecture loads, or write a randomly initialised one.")
    p.add_argument("checkpoint", nargs="?",
                   help="checkpoint folder or hub id (owner/name), or a drafter GGUF to write again with --outtype")
    p.add_argument("--target", required=True, help="target GGUF path or model spec")
    p.add_argument("-o", "--out", type=Path, help="output GGUF")
    p.add_argument("--outtype", choices=sorted(OUTTYPES), default="f16", help="tensor type (default f16)")
    p.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                   help="the type of the tensors whose GGUF name matches REGEX (e.g. 'ffn_down|fc=q6_k'; "
                        "repeatable, the first match wins), as llama-quantize's --tensor-type")
    r = p.add_argument_group("random initialisation")
    r.add_argument("--init-random", action="store_true", help="write a randomly initialised drafter")
    r.add_argument("--layers", type=int, default=1, help="decoder layers (default 1)")
    r.add_argument("--ffn", type=int, default=None, help="MLP width (default 3 x hidden)")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--mask-token", type=int, default=None, help="MASK token id (default: first unused id)")
    r.add_argument("--hf-out", type=Path, help="also write the z-lab layout (config.json + model.safetensors)")
    r.add_argument("--dflash2", action="store_true",
                   help="a DFlash2 drafter (dynamic convolutions and a path selector, z-lab's sizes where they fit)")
    v = p.add_argument_group("reduced draft vocabulary (tfm_convert.draft_vocab)")
    v.add_argument("--reduce", type=Path, metavar="DRAFTER",
                   help="write DRAFTER (with or without vocabulary) with a reduced draft vocabulary: d2t and "
                        "the target LM head's rows of the draft ids")
    v.add_argument("--corpus", type=Path, nargs="+", metavar="DIR",
                   help="training corpus folders (tfm-corpus-v1): the draft ids are their most frequent "
                        "response tokens, plus the special tokens")
    v.add_argument("--draft-vocab-size", type=int, default=65536, metavar="K",
                   help="draft ids chosen from --corpus (default 65536)")
    v.add_argument("--ids", type=Path, metavar="IDS.npy", help="the draft ids: an .npy array of target token ids")
    v.add_argument("--save-ids", type=Path, metavar="IDS.npy", help="also write the draft ids (int32 .npy)")
    w = p.add_argument_group("the Weaver (Trees from Marginals; tfm_convert.weaver_gguf)")
    w.add_argument("--weaver", type=Path, metavar="WEAVER",
                   help="write a Weaver GGUF from a tfm-train weaver checkpoint (weaver.pt), or write a Weaver "
                        "GGUF again with --outtype; refused for another target")
    return p


def resolve_target(spec: str) -> Path:
    """A target GGUF path for ``spec``: an existing file, else ``tfm_local.files.models.resolve_model(spec)``.

    Falls back to ``Path(spec)`` when tfm_local.files.models cannot be imported.

    Raises:
        ConvertError: the spec cannot be resolved.
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    try:
        from tfm_local.files.models import resolve_model
    except ImportError:
        return path
    try:
        return Path(resolve_model(spec))
    except Exception as e:  # resolver errors are user-facing
        raise ConvertError(f"cannot resolve target {spec!r}: {e}") from None


def run(args: argparse.Namespace) -> str:
    """Carry out the parsed command; returns the summary line to print.

    Raises:
        ConvertError: any user-facing failure.
    """
    from .pipeline import convert_checkpoint, init_random

    if args.out is not None and not args.out.parent.is_dir():
        raise ConvertError(f"output folder {args.out.parent} does not exist")
    target = resolve_target(args.target)
    if args.weaver is not None:
        return run_weaver(args, target)
    if args.reduce or args.corpus or args.ids or args.save_ids:
        return run_draft_vocab(args, target)
    if args.init_random:
        if args.checkpoint or args.tensor_type:
            raise ConvertError("--init-random takes no CHECKPOINT and no --tensor-type")
        out, hf = init_random(target, args.out, hf_out=args.hf_out, layers=args.layers, ffn=args.ffn,
                              seed=args.seed, outtype=args.outtype, mask_token=args.mask_token,
                              dflash2=args.dflash2)
        return "wrote " + " and ".join(str(p) for p in (out, hf) if p is not None)
    if args.dflash2:
        raise ConvertError("--dflash2 goes with --init-random (a checkpoint's config.json says which it is)")
    if not args.checkpoint:
        raise ConvertError("give a CHECKPOINT to convert, or --init-random")
    if args.out is None:
        raise ConvertError("give the output GGUF with -o OUT.gguf")
    try:
        types = parse_tensor_types(args.tensor_type)
    except ValueError as e:
        raise ConvertError(str(e)) from None
    return f"wrote {convert_checkpoint(args.checkpoint, target, args.out, args.outtype, types)}"


def run_weaver(args: argparse.Namespace, target: Path) -> str:
    """``--weaver``: a Weaver checkpoint or GGUF to a Weaver GGUF of ``--outtype`` for ``target``."""
    from .weaver_gguf import check_pair, read_weaver_gguf, write_weaver_gguf

    if args.checkpoint or args.init_random or args.reduce or args.corpus or args.ids or args.save_ids or args.tensor_type:
        raise ConvertError("--weaver takes only --target, -o and --outtype")
    if args.out is None:
        raise ConvertError("give the output GGUF with -o OUT.gguf")
    if not args.weaver.exists():
        raise ConvertError(f"Weaver not found: {args.weaver}")
    with open(args.weaver, "rb") as f:
        is_gguf = f.read(4) == b"GGUF"
    if is_gguf:
        from tfm_local.train.corpus import target_identity

        from tfm_local.files.drafters import file_key

        wf = read_weaver_gguf(args.weaver)
        check_pair(wf, target_sha256=target_identity(target)["sha256"])
        identity = {**wf.identity, "target_key": file_key(target)}
        out = write_weaver_gguf(args.out, wf.config, wf.state_dict(), wf.tensors["codes"], identity, args.outtype)
        return f"wrote {out}"
    from tfm_local.train.errors import CorruptArtifactError, TrainError
    from tfm_local.train.weaver_fit import weaver_gguf_from_checkpoint

    try:
        return f"wrote {weaver_gguf_from_checkpoint(args.weaver, target, {args.outtype: args.out})[args.outtype]}"
    except CorruptArtifactError:
        raise ConvertError(f"{args.weaver} is neither a Weaver GGUF nor a readable tfm-train weaver checkpoint "
                           f"(weaver.pt)") from None
    except (TrainError, FileNotFoundError) as e:
        raise ConvertError(str(e)) from None


def run_draft_vocab(args: argparse.Namespace, target: Path) -> str:
    """The draft-vocabulary commands (``--reduce`` / ``--save-ids``); returns the summary line."""
    from tfm_local.files.atomic import atomic_output

    from .draft_vocab import (always_ids, check_draft_ids, choose_draft_ids, coverage, load_draft_ids,
                              reduce_drafter, token_counts)
    from .target_info import read_target_info

    if args.init_random or args.checkpoint:
        raise ConvertError("--reduce/--corpus/--ids/--save-ids take no CHECKPOINT and no --init-random")
    if (args.corpus is None) == (args.ids is None):
        raise ConvertError("give the draft ids with exactly one of --corpus DIR... or --ids IDS.npy")
    if args.reduce is None and args.save_ids is None:
        raise ConvertError("nothing to write: give --reduce DRAFTER -o OUT.gguf and/or --save-ids IDS.npy")
    if args.reduce is not None and args.out is None:
        raise ConvertError("give the output GGUF with -o OUT.gguf")
    n_vocab = read_target_info(target).n_vocab
    said = []
    if args.corpus is not None:
        counts = token_counts(args.corpus, n_vocab)
        ids = choose_draft_ids(counts, args.draft_vocab_size, always_ids(target))
        said.append(f"{ids.size} draft ids covering {coverage(counts, ids):.2%} of the corpus's response tokens")
    else:
        ids = check_draft_ids(load_draft_ids(args.ids), n_vocab)
        said.append(f"{ids.size} draft ids")
    if args.save_ids is not None:
        with convert_errors(), atomic_output(args.save_ids) as tmp, open(tmp, "wb") as f:
            np.save(f, ids.astype(np.int32))
        said.append(f"wrote {args.save_ids}")
    if args.reduce is not None:
        said.append(f"wrote {reduce_drafter(args.reduce, target, ids, args.out)}")
    return "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfm-convert`` console script; returns the exit status (0 or 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        print(run(args))
    except ConvertError as e:
        parser.exit(2, f"tfm-convert: error: {e}\n")
    except OSError as e:
        parser.exit(2, f"tfm-convert: error: {e.strerror or e}: {e.filename or ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
