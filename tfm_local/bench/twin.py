"""Random-weight twins of real targets, for timing passes and steps at sizes that cannot be downloaded here.

A twin has a real model's shape (layers, widths, heads, vocabulary) and the tensor types that
llama.cpp's ``llama-quantize`` chooses for Q4_K_M (``q4_k_m_type``, from ``src/llama-quant.cpp`` of the
pinned llama.cpp: Q6_K for the output matrix, and for ``attn_v`` and ``ffn_down`` on the layers its
``use_more_bits`` picks; Q4_K for the other matrices; F32 norms and biases). The quantized blocks are
random bytes with small finite scales: a pass costs what the real model's pass costs (the kernels do
not look at the values) and its logits are finite. The tokenizer is the tiny synthetic one, padded to
the real vocabulary size with unused tokens, so the LM head has the real size. Its drafter is
``tfm_convert.pipeline.init_random`` for the twin (random DFlash layers of the twin's width).

    tfm-bench twin --shape qwen2.5-7b --out ~/twin        # target.gguf (4.4 GB) and drafter.gguf
    tfm-bench pass --target ~/twin/target.gguf --drafter ~/twin/drafter.gguf --tokens 1,16,64
"""
from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import gguf

from ..cli.program import alias_note, program_name

QT = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    """A qwen2 decoder's sizes (the Hugging Face config's names in GGUF terms)."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    tied: bool            # the LM head is the token embedding (no output.weight)
    rope_base: float = 1e6
    n_ctx_train: int = 32768


#: Shapes of the Qwen2.5 family (their config.json files).
SHAPES = {
    "qwen2.5-0.5b": Shape(24, 896, 4864, 14, 2, 151936, True),
    "qwen2.5-1.5b": Shape(28, 1536, 8960, 12, 2, 151936, True),
    "qwen2.5-coder-1.5b": Shape(28, 1536, 8960, 12, 2, 151936, False),  # the default target: untied head
    "qwen2.5-3b": Shape(36, 2048, 11008, 16, 2, 151936, True),
    "qwen2.5-7b": Shape(28, 3584, 18944, 28, 4, 152064, False),
    "qwen2.5-14b": Shape(48, 5120, 13824, 40, 8, 152064, False),
}


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama-quantize's choice of the layers that get more bits (``use_more_bits`` in llama-quant.cpp)."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def file_rank(layer: int, n_layer: int) -> int:
    """The layer's place among ``n_layer`` layers in a converted file's tensor order, which sorts layer
    numbers as text (blk.0, blk.1, blk.10, …, blk.19, blk.2, …): llama-quantize counts ``attn_v`` and
    ``ffn_down`` tensors in file order, so its ``use_more_bits`` sees this rank, not the layer number."""
    return sorted(range(n_layer), key=str).index(layer)


def q4_k_m_type(name: str, n_layer: int, n_cols: int) -> QT:
    """The type llama-quantize gives tensor ``name`` (a 2-d weight with rows of ``n_cols`` values) in a
    Q4_K_M file of a dense qwen2 model with ``n_layer`` layers, its fallbacks for narrow rows included
    (``_fallback``)."""
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    more = name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(file_rank(layer, n_layer), n_layer)
    return _fallback(QT.Q6_K if name == "output.weight" or more else QT.Q4_K, n_cols)


def _fallback(qtype: QT, n_cols: int) -> QT:
    """llama-quantize's ``tensor_type_fallback`` for rows of ``n_cols`` values: a K type needs rows of
    whole 256-blocks, else Q4_K -> Q5_0 and Q6_K -> Q8_0, and F16 when even their 32-blocks do not fit."""
    if n_cols % 256 == 0:
        return qtype
    return ({QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}[qtype]) if n_cols % 32 == 0 else QT.F16


def _scale_fields(qtype: QT) -> tuple[int, ...]:
    """Byte offsets of the f16 scales in one block of ``qtype``."""
    return {QT.Q4_K: (0, 2), QT.Q6_K: (208,), QT.Q8_0: (0,), QT.Q5_0: (0,)}[qtype]


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: QT, scale: float = 2.0 ** -16) -> np.ndarray:
    """Random quantized data of a ``[rows, cols]`` tensor: uint8 ``[rows, cols / block · block_bytes]``,
    every block's f16 scale (and Q4_K's min scale) set to ``scale`` so that the values are small and
    finite. Raises ValueError when ``cols`` is not a multiple of the block size."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{cols} columns are not a multiple of {qtype.name}'s block of {block}")
    data = np.frombuffer(rng.bytes(rows * cols // block * nbytes), dtype=np.uint8).copy()
    blocks = data.reshape(-1, nbytes)
    f16 = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    for off in _scale_fields(qtype):
        blocks[:, off:off + 2] = f16
    return data.reshape(rows, -1)


def twin_tensors(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int], QT]]:
    """(name, numpy shape, type) of every tensor of the twin, in file order."""
    s = shape
    head_dim = s.n_embd // s.n_head
    n_kv = s.n_head_kv * head_dim
    embd = _fallback(QT.Q6_K if s.tied else QT.Q4_K, s.n_embd)
    out = [("token_embd.weight", (s.n_vocab, s.n_embd), embd),
           ("output_norm.weight", (s.n_embd,), QT.F32)]
    if not s.tied:
        out.append(("output.weight", (s.n_vocab, s.n_embd), q4_k_m_type("output.weight", s.n_layer, s.n_embd)))
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (s.n_embd,), QT.F32),
                (p + "attn_q.weight", (s.n_embd, s.n_embd), None), (p + "attn_q.bias", (s.n_embd,), QT.F32),
                (p + "attn_k.weight", (n_kv, s.n_embd), None), (p + "attn_k.bias", (n_kv,), QT.F32),
                (p + "attn_v.weight", (n_kv, s.n_embd), None), (p + "attn_v.bias", (n_kv,), QT.F32),
                (p + "attn_output.weight", (s.n_embd, s.n_embd), None),
                (p + "ffn_norm.weight", (s.n_embd,), QT.F32),
                (p + "ffn_gate.weight", (s.n_ff, s.n_embd), None), (p + "ffn_up.weight", (s.n_ff, s.n_embd), None),
                (p + "ffn_down.weight", (s.n_embd, s.n_ff), None)]
    return [(n, shp, t if t is not None else q4_k_m_type(n, s.n_layer, shp[1])) for n, shp, t in out]


def write_twin_target(path: str | Path, shape: Shape, seed: int = 0) -> Path:
    """Write the twin target GGUF of ``shape`` to ``path``, atomically (``files.atomic.atomic_output``:
    the file appears complete or not at all), streamed (one tensor in memory at a time).

    Returns the path. Raises ValueError for inconsistent head counts, a vocabulary smaller than the
    synthetic tokenizer's used tokens (``TinyVocab``), or a negative seed; ``OutputPathError`` /
    ``OSError`` for a path that cannot be written."""
    from ..files.atomic import atomic_output
    from ..testing.synth import CHATML_TEMPLATE, TinyVocab

    check_shape(shape)
    if seed < 0:
        raise ValueError(f"the seed must be >= 0, got {seed}")
    vocab = TinyVocab(n_vocab=shape.n_vocab)
    with atomic_output(path) as tmp:
        try:
            _write(tmp, shape, vocab, np.random.default_rng(seed), CHATML_TEMPLATE)
        except OSError as e:
            raise OSError(f"could not write {path}: {e.strerror or e}") from e
    return Path(path)


#: The largest twin written (bytes): the Qwen2.5-72B shape at Q4_K_M is ~47 GB.
MAX_BYTES = 64 << 30


def twin_bytes(shape: Shape) -> int:
    """Bytes of the twin's tensor data (the file is a few MB more: the tokenizer and metadata)."""
    return sum(int(np.prod(gguf.quant_shape_to_byte_shape(shp, qt))) for _, shp, qt in twin_tensors(shape))


def check_shape(s: Shape) -> None:
    """ValueError unless ``s`` is a shape llama.cpp's qwen2 graph runs and that fits ``MAX_BYTES``."""
    if s.n_embd % s.n_head or s.n_head % s.n_head_kv:
        raise ValueError("n_embd must be divisible by n_head and n_head by n_head_kv")
    if (s.n_embd // s.n_head) % 2:
        raise ValueError(f"the head size n_embd / n_head = {s.n_embd // s.n_head} must be even (rotary embeddings)")
    if s.n_layer > 1024 or s.n_vocab > 1 << 22:
        raise ValueError(f"at most 1024 layers and {1 << 22} vocabulary entries, got {s.n_layer} and {s.n_vocab}")
    size = twin_bytes(s)
    if size > MAX_BYTES:
        raise ValueError(f"the twin would be {size / 2**30:.1f} GiB, over the {MAX_BYTES >> 30} GiB this tool writes")


def _write(path: Path, s: Shape, vocab, rng: np.random.Generator, template: str) -> None:
    from ..testing.synth import _common_hparams_to

    tensors = twin_tensors(s)
    w = gguf.GGUFWriter(str(path), "qwen2")
    _common_hparams_to(w, "qwen2", n_layer=s.n_layer, n_embd=s.n_embd, n_head=s.n_head, n_head_kv=s.n_head_kv,
                       n_ff=s.n_ff, n_ctx_train=s.n_ctx_train, rope_base=s.rope_base,
                       name=f"tfm-twin-qwen2-{s.n_layer}x{s.n_embd}", file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    vocab.write_to(w, template)
    for name, shp, qt in tensors:
        stored = gguf.quant_shape_to_byte_shape(shp, qt)  # bytes per row, whatever the type
        w.add_tensor_info(name, stored, np.dtype(np.uint8), int(np.prod(stored)), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, qt in tensors:
        if qt == QT.F32:
            data = np.ones(shp, np.float32) if name.endswith("norm.weight") else np.zeros(shp, np.float32)
        elif qt == QT.F16:
            data = (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16)
        else:
            data = random_blocks(rng, shp[0], shp[1], qt)
        w.write_tensor_data(data)
    w.close()


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-twin"), description=__doc__.split("\n\n")[0],
                                 epilog=alias_note("tfm-bench twin"))
    ap.add_argument("--shape", required=True, help=f"one of {', '.join(SHAPES)}, or N_LAYER,N_EMBD,N_FF,"
                    "N_HEAD,N_HEAD_KV,N_VOCAB[,tied]")
    ap.add_argument("--out", required=True, help="folder for target.gguf and drafter.gguf")
    ap.add_argument("--drafter-layers", type=int, default=5, help="layers of the random drafter (0: none)")
    ap.add_argument("--drafter-type", default="q8_0", help="the drafter's GGUF type (tfm-convert's --outtype)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def parse_shape(text: str) -> Shape:
    """A preset name of ``SHAPES`` or "N_LAYER,N_EMBD,N_FF,N_HEAD,N_HEAD_KV,N_VOCAB[,tied]"; ValueError otherwise."""
    if text in SHAPES:
        return SHAPES[text]
    parts = text.split(",")
    if len(parts) not in (6, 7) or (len(parts) == 7 and parts[6] != "tied"):
        raise ValueError(f"--shape: a preset ({', '.join(SHAPES)}) or N_LAYER,N_EMBD,N_FF,N_HEAD,N_HEAD_KV,N_VOCAB[,tied]"
                         f", got {text!r}")
    try:
        nums = [int(p) for p in parts[:6]]
    except ValueError:
        raise ValueError(f"--shape: the six sizes must be integers, got {text!r}") from None
    if min(nums) < 1:
        raise ValueError(f"--shape: sizes must be >= 1, got {text!r}")
    return Shape(*nums, tied=len(parts) == 7)


def main(argv=None) -> None:
    a = parse_args(argv)
    try:
        shape = parse_shape(a.shape)
        check_shape(shape)
        if a.drafter_layers < 0:
            raise ValueError(f"--drafter-layers must be >= 0, got {a.drafter_layers}")
        if a.drafter_layers and shape.n_layer < 2:
            raise ValueError("a drafter needs a target of at least 2 layers (give --drafter-layers 0)")
        if a.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {a.seed}")
        from tfm_convert.writer import OUTTYPES

        if a.drafter_layers and a.drafter_type not in OUTTYPES:
            raise ValueError(f"--drafter-type must be one of {sorted(OUTTYPES)}, got {a.drafter_type!r}")
        if not a.out:
            raise ValueError("--out is empty: give the folder to write target.gguf and drafter.gguf to")
        out = Path(a.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        need, free = twin_bytes(shape), shutil.disk_usage(out).free
        if need > free:
            raise ValueError(f"the twin needs {need / 2**30:.2f} GiB, {out} has {free / 2**30:.2f} GiB free")
        target = write_twin_target(out / "target.gguf", shape, a.seed)
        print(f"wrote {target} ({target.stat().st_size / 2**30:.2f} GiB, {asdict(shape)})")
        stale = out / "drafter.gguf"
        if a.drafter_layers == 0 and stale.exists():
            stale.unlink()  # an earlier twin's drafter does not fit this target
            print(f"removed {stale} (an earlier twin's drafter)")
        if a.drafter_layers > 0:
            from tfm_convert.pipeline import init_random

            drafter, _ = init_random(target, out / "drafter.gguf", layers=a.drafter_layers, seed=a.seed,
                                     outtype=a.drafter_type)
            print(f"wrote {drafter} ({drafter.stat().st_size / 2**30:.2f} GiB)")
    except (ValueError, OSError) as e:  # ConvertError is a ValueError; OutputPathError an OSError
        sys.exit(f"{program_name('tfm-bench-twin')}: {e}")
    except MemoryError:
        sys.exit(f"{program_name('tfm-bench-twin')}: out of memory (a smaller shape or fewer --drafter-layers)")


if __name__ == "__main__":
    main()
