"""The Weaver's GGUF (architecture ``tfm-weaver``; the model: ``tfm_local/train/weaver.py``).

Metadata: every ``WeaverConfig`` field as ``tfm-weaver.<field>`` (u32 or f32), and what ties the file
to its pair: ``tfm-weaver.target.sha256`` / ``.target.name`` (the target GGUF it was trained for) and
``tfm-weaver.drafter.sha256`` (the drafter's weights, as ``tfm-train`` records them), plus
``tfm-weaver.target.n_vocab`` and ``tfm-weaver.target.key`` (the target's cheap file key,
``tfm_local.files.drafters.file_key``, checked when an engine loads the Weaver). Tensors: the PyTorch state under GGUF-style names (``blocks.N.`` →
``blk.N.``), and ``codes`` ``[n_vocab, rank]``, the candidates' codes ``P · W_lm[c]`` of every token
computed at export from the target's LM head, so that scoring K candidates reads K rows of it.
Norm weights stay F32; matrices take the output type (F16 where a row is not a multiple of its block).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gguf
from tfm_local.files.atomic import atomic_output
from tfm_local.files.gguf_meta import GGUFError, dequantize_tensor, read_gguf_meta

from .errors import ConvertError, convert_errors
from .quant import FILE_TYPES, OUTTYPES, encode, tensor_type
from .writer import _add_info

ARCH = "tfm-weaver"
_INT_FIELDS = ("target_hidden", "drafter_hidden", "depth", "top_k", "width", "layers", "heads", "ffn", "rank")
_FLOAT_FIELDS = ("rope_theta", "eps")


@dataclass
class WeaverFile:
    """A Weaver GGUF read back.

    Attributes:
        config: the ``WeaverConfig`` fields (dict). tensors: GGUF name → float32 array (numpy order).
        identity: ``{"target_sha256", "target_name", "drafter_sha256", "n_vocab"}``.
        path: the file.
    """

    config: dict
    tensors: dict[str, np.ndarray]
    identity: dict
    path: Path

    def state_dict(self) -> dict:
        """The PyTorch state (``Weaver.load_state_dict``) as float32 arrays, ``codes`` left out."""
        return {_torch_name(n): a for n, a in self.tensors.items() if n != "codes"}


def gguf_name(torch_name: str) -> str:
    """``blocks.N.x`` → ``blk.N.x``; other names as they are."""
    return "blk." + torch_name[len("blocks."):] if torch_name.startswith("blocks.") else torch_name


def _torch_name(name: str) -> str:
    return "blocks." + name[len("blk."):] if name.startswith("blk.") else name


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
            for f in _INT_FIELDS:
                w.add_uint32(f"{ARCH}.{f}", int(config[f]))
            for f in _FLOAT_FIELDS:
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


def read_weaver_gguf(path: str | os.PathLike) -> WeaverFile:
    """Read a Weaver GGUF (tensors dequantized to float32).

    Raises:
        ConvertError: missing, truncated or corrupt file; not a ``tfm-weaver`` GGUF; missing keys.
    """
    path = Path(path)
    try:
        meta = read_gguf_meta(path)
        arch = meta.kv.get("general.architecture")
        if arch is None or arch.value != ARCH:
            raise ConvertError(f"{path} is not a Weaver GGUF (architecture "
                               f"{arch.value if arch else None!r}, expected {ARCH!r})")
        kv = {k: v.value for k, v in meta.kv.items()}
        missing = [f for f in _INT_FIELDS + _FLOAT_FIELDS if f"{ARCH}.{f}" not in kv]
        if missing or f"{ARCH}.target.sha256" not in kv or f"{ARCH}.drafter.sha256" not in kv:
            raise ConvertError(f"{path}: Weaver GGUF without {missing or 'its pair identity'}")
        config = {f: int(kv[f"{ARCH}.{f}"]) for f in _INT_FIELDS} | {f: float(kv[f"{ARCH}.{f}"]) for f in _FLOAT_FIELDS}
        identity = {"target_sha256": kv[f"{ARCH}.target.sha256"], "target_name": kv.get(f"{ARCH}.target.name", ""),
                    "drafter_sha256": kv[f"{ARCH}.drafter.sha256"], "n_vocab": int(kv.get(f"{ARCH}.target.n_vocab", 0)),
                    "target_key": kv.get(f"{ARCH}.target.key", "")}
        with open(path, "rb") as f:
            raw = np.fromfile(f, dtype=np.uint8)
        tensors = {e.name: dequantize_tensor(raw[e.begin:e.begin + e.nbytes], e) for e in meta.tensors}
    except GGUFError as e:
        raise ConvertError(str(e)) from None
    if "codes" not in tensors:
        raise ConvertError(f"{path}: Weaver GGUF without its codes table")
    return WeaverFile(config, tensors, identity, path)


def read_weaver_codes(path: str | os.PathLike) -> tuple[np.ndarray, dict]:
    """The codes table (float32 ``[n_vocab, rank]``) and the identity of a Weaver GGUF, the other tensors
    left unread (the runtime's backend loads them).

    Raises:
        ConvertError: as ``read_weaver_gguf``.
    """
    path = Path(path)
    try:
        meta = read_gguf_meta(path)
        kv = {k: v.value for k, v in meta.kv.items()}
        if kv.get("general.architecture") != ARCH:
            raise ConvertError(f"{path} is not a Weaver GGUF (architecture {kv.get('general.architecture')!r}, "
                               f"expected {ARCH!r})")
        entry = next((e for e in meta.tensors if e.name == "codes"), None)
        if entry is None:
            raise ConvertError(f"{path}: Weaver GGUF without its codes table")
        with open(path, "rb") as f:
            f.seek(entry.begin)
            raw = np.frombuffer(f.read(entry.nbytes), dtype=np.uint8)
        if raw.size != entry.nbytes:
            raise ConvertError(f"{path} is truncated (its codes table ends past the end of the file)")
        codes = dequantize_tensor(raw, entry)
    except GGUFError as e:
        raise ConvertError(str(e)) from None
    identity = {"target_sha256": kv.get(f"{ARCH}.target.sha256", ""), "target_name": kv.get(f"{ARCH}.target.name", ""),
                "drafter_sha256": kv.get(f"{ARCH}.drafter.sha256", ""), "n_vocab": int(kv.get(f"{ARCH}.target.n_vocab", 0)),
                "target_key": kv.get(f"{ARCH}.target.key", "")}
    return np.ascontiguousarray(codes, dtype=np.float32), identity


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
