"""``tfm-convert``: DFlash drafters to GGUF for llama.cpp.

    tfm-convert CHECKPOINT --target TARGET -o OUT.gguf [--outtype f16]
    tfm-convert --init-random --target TARGET -o OUT.gguf [--layers N] [--ffn N] [--seed S] [--hf-out DIR]

TARGET is a GGUF path or a model spec understood by ``tfm_local.models``.
Errors print ``tfm-convert: error: ...`` and exit with status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import ConvertError
from .quant import OUTTYPES


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of tfm-convert."""
    p = argparse.ArgumentParser(
        prog="tfm-convert",
        description="Convert a DFlash drafter (z-lab Hugging Face layout) to a GGUF that llama.cpp's "
                    "dflash architecture loads, or write a randomly initialised one.")
    p.add_argument("checkpoint", nargs="?", help="checkpoint folder or hub id (owner/name)")
    p.add_argument("--target", required=True, help="target GGUF path or model spec")
    p.add_argument("-o", "--out", type=Path, help="output GGUF")
    p.add_argument("--outtype", choices=sorted(OUTTYPES), default="f16", help="tensor type (default f16)")
    r = p.add_argument_group("random initialisation")
    r.add_argument("--init-random", action="store_true", help="write a randomly initialised drafter")
    r.add_argument("--layers", type=int, default=1, help="decoder layers (default 1)")
    r.add_argument("--ffn", type=int, default=None, help="MLP width (default 3 x hidden)")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--mask-token", type=int, default=None, help="MASK token id (default: first unused id)")
    r.add_argument("--hf-out", type=Path, help="also write the z-lab layout (config.json + model.safetensors)")
    return p


def resolve_target(spec: str) -> Path:
    """A target GGUF path for ``spec``: an existing file, else ``tfm_local.models.resolve_model(spec)``.

    Falls back to ``Path(spec)`` when tfm_local.models cannot be imported.

    Raises:
        ConvertError: the spec cannot be resolved.
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    try:
        from tfm_local.models import resolve_model
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
    if args.init_random:
        if args.checkpoint:
            raise ConvertError("--init-random takes no CHECKPOINT")
        out, hf = init_random(target, args.out, hf_out=args.hf_out, layers=args.layers, ffn=args.ffn,
                              seed=args.seed, outtype=args.outtype, mask_token=args.mask_token)
        return "wrote " + " and ".join(str(p) for p in (out, hf) if p is not None)
    if not args.checkpoint:
        raise ConvertError("give a CHECKPOINT to convert, or --init-random")
    if args.out is None:
        raise ConvertError("give the output GGUF with -o OUT.gguf")
    return f"wrote {convert_checkpoint(args.checkpoint, target, args.out, args.outtype)}"


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
