"""Patch 0012: MMQ products of at most N columns with one CUDA block per tile (TFM_CUDA_MMQ_TILES_MAX_COLS), CUDA only.

A tiny qwen2 target, quantized by llama.cpp itself (Q8_0 and Q4_0 weights), decodes batches of
1-16 tokens on the GPU in a process of its own per setting (the switch is read once per
process). Upstream's stream-k split (switch unset: each tile's dot products cut across blocks and
summed by the fixup kernel) and one block per tile must agree to float32 accumulation order: the
same kernel multiplies the same quantized activations by the same weights. A tile written to the
wrong place, or a tile left unwritten, would be far outside that bound.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import synth

_DECODE_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import synth
lc = synth.llama_cpp_lib()
params = lc.llama_model_default_params()
params.n_gpu_layers = -1
model = lc.llama_model_load_from_file(sys.argv[2].encode(), params)
assert model, "the model did not load"
out = {}
for n in (1, 8, 9, 12, 16):
    ctx = synth.new_context(model, n_ctx=128, n_batch=32)
    out[f"n{n}"] = synth.decode_tokens(ctx, [(7 * i + 3) % 200 + 5 for i in range(n)])
    lc.llama_free(ctx)
np.savez(sys.argv[3], **out)
"""


def _quantized_target(tmp_path: Path, ftype: str) -> Path:
    lc = synth.llama_cpp_lib()
    f32 = synth.write_tiny_target(tmp_path / "f32.gguf", n_embd=512, n_ff=1024, seed=3)
    out = tmp_path / f"{ftype}.gguf"
    params = lc.llama_model_quantize_default_params()
    params.ftype = {"q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0}[ftype]
    assert lc.llama_model_quantize(str(f32).encode(), str(out).encode(), params) == 0
    return out


def _decode(model: Path, tmp_path: Path, env_extra: dict, name: str) -> dict[str, np.ndarray]:
    here = str(Path(__file__).resolve().parent)
    out = tmp_path / f"{name}.npz"
    env = {k: v for k, v in os.environ.items() if k != "TFM_CUDA_MMQ_TILES_MAX_COLS"}
    r = subprocess.run([sys.executable, "-c", _DECODE_SCRIPT, here, str(model), str(out)], env={**env, **env_extra},
                       capture_output=True, text=True)
    assert r.returncode == 0, f"decode with {env_extra} failed:\n{r.stderr[-3000:]}"
    with np.load(out) as z:
        return dict(z)


@pytest.mark.gpu
@pytest.mark.parametrize("ftype", ["q8_0", "q4_0"])
def test_mmq_one_block_per_tile_agrees_with_stream_k(tmp_path, ftype):
    model = _quantized_target(tmp_path, ftype)
    stream_k = _decode(model, tmp_path, {}, "stream_k")
    tiles = _decode(model, tmp_path, {"TFM_CUDA_MMQ_TILES_MAX_COLS": "64"}, "tiles")
    for n in (1, 8):  # at most 8 columns: MMVQ either way, the switch is not consulted
        assert np.array_equal(stream_k[f"n{n}"], tiles[f"n{n}"]), n
    for n in (9, 12, 16):
        a, b = stream_k[f"n{n}"], tiles[f"n{n}"]
        assert np.abs(a - b).max() <= 1e-3 * np.abs(a).max(), n
    # the switch took effect: with 512-1024 deep dot products stream-k cuts the few tiles of this
    # model across blocks, so its partial sums add up in another order somewhere
    assert any(not np.array_equal(stream_k[f"n{n}"], tiles[f"n{n}"]) for n in (9, 12, 16))
