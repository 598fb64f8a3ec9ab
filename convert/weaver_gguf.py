"""Writing the Weaver's GGUF (architecture ``tfm-weaver``; its format and reader:
``tfm_local.files.weaver``; the model: ``tfm_local/train/weaver.py``), reading it back, and refusing
a Weaver trained for another pair.

Norm weights stay F32; matrices take the output type (F16 where a row is not a multiple of its block).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import gguf
from tfm_local.files import weaver as weaver_format
from tfm_local.files.atomic import atomic_output
from tfm_local.files.weaver import ARCH, FLOAT_FIELDS, INT_FIELDS, WeaverFile, gguf_name

from .errors import ConvertError, convert_errors
from .quant import FILE_TYPES, OUTTYPES, encode, tensor_type
from .writer import _add_info


@convert_errors()
def write_weaver_gguf(out: str | os.PathLike, config: dict, state: dict, codes: np.ndarray, identity: dict,
                      outtype: str = "f16", name: str | None = None) -> Path:
    """Write the Weaver GGUF; the file appears only when complete.

    Args:
        config: ``WeaverConfig.to_dict()``. state: PyTorch state (name → tensor or array).
        codes: float32 ``[n_vocab, rank]``. identity: ``{"target_sha256", "target_name",
            "drafter_sha256"}`` (strings).
        outtype: a name of ``quant.OUTTYPES``.
    Raises:
        ValueError: unknown outtype. ConvertError: a state or table that does not fit the config.
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {sorted(OUTTYPES)}, got {outtype!r}")
    arrays = {gguf_name(k): np.asarray(v.detach().cpu().float().numpy() if hasattr(v, "detach") else v, np.float32)
              for k, v in state.items()}
    codes = np.asarray(codes, dtype=np.float32)
    if codes.ndim != 2 or codes.shape[1] != config["rank"]:
        raise ConvertError(f"codes must be [n_vocab, {config['rank']}], got {list(codes.shape)}")
    arrays["codes"] = codes
    out = Path(out)
    with atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), ARCH)
        try:
            w.add_name(name or out.stem)
            w.add_file_type(FILE_TYPES[outtype])
            for f in INT_FIELDS:
                w.add_uint32(f"{ARCH}.{f}", int(config[f]))
            for f in FLOAT_FIELDS:
                w.add_float32(f"{ARCH}.{f}", float(config[f]))
            w.add_string(f"{ARCH}.target.sha256", str(identity["target_sha256"]))
            w.add_string(f"{ARCH}.target.name", str(identity.get("target_name", "")))
            w.add_string(f"{ARCH}.drafter.sha256", str(identity["drafter_sha256"]))
            w.add_string(f"{ARCH}.target.key", str(identity.get("target_key", "")))
            w.add_uint32(f"{ARCH}.target.n_vocab", int(codes.shape[0]))
            plan = [(n, a, tensor_type(a.shape, outtype)) for n, a in arrays.items()]
            fell = [n for n, a, qt in plan if a.ndim > 1 and qt != OUTTYPES[outtype]]
            if fell:
                import sys

                print(f"note: {len(fell)} of the Weaver's matrices are not {outtype} (rows not a multiple of its "
                      f"block), e.g. {fell[0]}", file=sys.stderr)
            for n, a, qt in plan:
                _add_info(w, n, a.shape, qt)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for _, a, qt in plan:
                w.write_tensor_data(encode(a, qt))
        finally:
            w.close()
    return out


@convert_errors()
def read_weaver_gguf(path: str | os.PathLike) -> WeaverFile:
    """Read a Weaver GGUF (``tfm_local.files.weaver.read_weaver_gguf``).

    Raises:
        ConvertError: missing, truncated or corrupt file; not a ``tfm-weaver`` GGUF; missing keys.
    """
    return weaver_format.read_weaver_gguf(path)


def check_pair(weaver: WeaverFile, target_sha256: str | None = None, drafter_sha256: str | None = None,
               n_vocab: int | None = None) -> None:
    """Refuse a Weaver trained for another target or drafter (the identities given are checked).

    Raises:
        ConvertError: a mismatch, with both sides named.
    """
    ident = weaver.identity
    if target_sha256 is not None and ident["target_sha256"] != target_sha256:
        raise ConvertError(f"{weaver.path.name} was trained for target {ident['target_name'] or '?'} "
                           f"(sha256 {ident['target_sha256'][:12]}…), not this one ({target_sha256[:12]}…)")
    if drafter_sha256 is not None and ident["drafter_sha256"] != drafter_sha256:
        raise ConvertError(f"{weaver.path.name} was trained with another drafter (sha256 "
                           f"{ident['drafter_sha256'][:12]}…, this drafter {drafter_sha256[:12]}…)")
    if n_vocab is not None and ident["n_vocab"] != n_vocab:
        raise ConvertError(f"{weaver.path.name} scores a vocabulary of {ident['n_vocab']} tokens, the target has {n_vocab}")
