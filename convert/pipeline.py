"""The two conversions of tfm-convert, as library calls.

``convert_checkpoint``: z-lab checkpoint (or a drafter GGUF, ``requantize``) + target GGUF → drafter GGUF.
``init_random``: target GGUF → random drafter (GGUF and/or z-lab layout).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .errors import ConvertError
from .random_init import random_config, random_tensors
from .read_drafter import read_drafter_gguf
from .target_info import read_target_info
from .validate import check_against_target, check_config, check_tensors
from .writer import write_drafter_gguf
from .zlab import index_tensors, locate_checkpoint, read_config, write_checkpoint


def convert_checkpoint(checkpoint: str | os.PathLike, target: str | os.PathLike,
                       out: str | os.PathLike, outtype: str = "f16",
                       tensor_types: Sequence[tuple[str, str]] = ()) -> Path:
    """Convert a DFlash checkpoint in the z-lab layout to a drafter GGUF for ``target``.

    Args:
        checkpoint: checkpoint folder or hub id (``owner/name``), or a drafter GGUF (``requantize``).
        target: target GGUF path; its vocabulary and tokenizer are copied.
        out: output GGUF path (appears only when complete).
        outtype: a name of ``quant.OUTTYPES`` ("f16", "q8_0", "q4_0", "q4_k", ...).
        tensor_types: per-tensor types by GGUF name (``writer.write_drafter_gguf``).

    Returns:
        the output Path.

    Raises:
        ConvertError: unreadable target or checkpoint, malformed config,
            missing/extra/misshapen tensors, or a drafter that does not fit
            the target (width, vocabulary, mask token, target layers).
    """
    info = read_target_info(target)
    _refuse_input_as_output(out, [target])
    if str(checkpoint).endswith(".gguf") and Path(checkpoint).is_file():
        _refuse_input_as_output(out, [checkpoint])
        try:
            return requantize(checkpoint, info, out, outtype, tensor_types)
        except ConvertError as e:  # name the drafter: some checks see only its tensors
            raise (e if str(checkpoint) in str(e) else ConvertError(f"drafter {checkpoint}: {e}")) from None
        except ValueError as e:  # a tensor whose data does not fit its shape or type (a damaged file)
            raise ConvertError(f"drafter {checkpoint} cannot be requantized: {e}") from None
    folder = locate_checkpoint(str(checkpoint))
    _refuse_input_as_output(out, [p for p in folder.iterdir() if p.is_file()])
    config = read_config(folder)
    tensors = index_tensors(folder)
    try:
        check_config(config)
        check_tensors({n: t.shape for n, t in tensors.items()}, config.dims)
        check_against_target(config, info)
    except ConvertError as e:  # name the checkpoint: the checks only see its parts
        raise ConvertError(f"checkpoint {folder}: {e}") from None
    return write_drafter_gguf(out, config, tensors, info, outtype, tensor_types=tensor_types)


def _refuse_input_as_output(out: str | os.PathLike, inputs) -> None:
    """ConvertError when ``out`` is one of the ``inputs`` files (the conversion would replace it)."""
    o = Path(out).resolve()
    for p in inputs:
        if Path(p).resolve() == o:
            raise ConvertError(f"the output {out} is an input of this conversion ({p}): choose another path")


def init_random(target: str | os.PathLike, out: str | os.PathLike | None = None, *,
                hf_out: str | os.PathLike | None = None, layers: int = 1, ffn: int | None = None,
                seed: int = 0, outtype: str = "f16", mask_token: int | None = None,
                hf_dtype: str = "F32", dflash2: bool = False) -> tuple[Path | None, Path | None]:
    """Write a randomly initialised drafter for ``target``.

    Args:
        target: target GGUF path.
        out: drafter GGUF to write, or None.
        hf_out: folder for the z-lab layout (config.json + model.safetensors), or None.
        layers, ffn, seed, mask_token: see ``random_init.random_config`` / ``random_tensors``.
        outtype: GGUF output type.
        hf_dtype: safetensors dtype, "F32", "F16" or "BF16".
        dflash2: a DFlash2 drafter (``random_init.dflash2_geometry``; z-lab's ``DFlash2DraftModel`` layout).

    Returns:
        (GGUF path or None, HF folder or None).

    Raises:
        ConvertError: neither output given, a bad size or mask token, or an unreadable target.
    """
    if out is None and hf_out is None:
        raise ConvertError("nothing to write: give an output GGUF (-o) and/or --hf-out DIR")
    info = read_target_info(target)
    if out is not None:
        _refuse_input_as_output(out, [target])
    config = random_config(info, layers=layers, ffn=ffn, mask_token=mask_token, dflash2=dflash2)
    check_config(config)
    check_against_target(config, info)
    tensors = random_tensors(config, seed)
    # the GGUF first: a GGUF that cannot be written then leaves no checkpoint behind
    gguf_path = write_drafter_gguf(out, config, tensors, info, outtype) if out is not None else None
    hf = write_checkpoint(hf_out, config, tensors, hf_dtype) if hf_out is not None else None
    return gguf_path, hf


def requantize(drafter: str | os.PathLike, info, out: str | os.PathLike, outtype: str,
               tensor_types: Sequence[tuple[str, str]] = ()) -> Path:
    """A drafter GGUF written again with ``outtype`` (as ``llama-quantize --allow-requantize``): its weights
    dequantized (``read_drafter_gguf``), checked against the target ``info`` (``TargetInfo``) and encoded
    anew. From a quantized file the new one carries both roundings: start from F16/BF16/Q8_0.

    Raises:
        ConvertError: unreadable drafter, or one that does not fit the target.
    """
    config, tensors = read_drafter_gguf(drafter, info.n_vocab, info.n_layer)
    check_config(config)
    check_against_target(config, info)
    return write_drafter_gguf(out, config, tensors, info, outtype, tensor_types=tensor_types)
