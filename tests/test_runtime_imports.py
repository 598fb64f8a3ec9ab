"""The runtime stays apart from the converter, the trainer, the benchmarks and the test helpers.

``tfm_local``, ``tfm_local.engine`` and ``tfm_local.server.app`` imported, then generations with the
default engine and with a Weaver's TfM tree on the tiny synthetic pair (``conftest.tiny_pair``), in a
fresh process: none of those packages, nor torch or matplotlib, is loaded by then (test_layout.py checks
the imports alone).
"""
import json
import subprocess
import sys

import pytest

APART = ("tfm_convert", "tfm_local.train", "tfm_local.bench", "tfm_local.testing", "torch", "matplotlib")

CHILD = """
import json, sys
import tfm_local, tfm_local.engine, tfm_local.server.app
from tfm_local.engine import Engine

target, drafter, weaver = sys.argv[1:4]
with Engine(target, drafter, n_ctx=256, n_threads=1) as e:
    out = e.generate("Hello", max_tokens=8)
with Engine(target, drafter, n_ctx=256, n_threads=1, tree="tfm", weaver=weaver, budget=8) as e:
    out_tfm = e.generate("Hello", max_tokens=8)
print(json.dumps({"modules": sorted(sys.modules), "texts": [out, out_tfm]}))
"""


@pytest.fixture(scope="module")
def tiny_weaver(tiny_pair, tmp_path_factory):
    """A fresh (untrained) Weaver GGUF that fits the tiny pair, written here so that the child only loads it."""
    torch = pytest.importorskip("torch")
    from tfm_convert.weaver_gguf import write_weaver_gguf
    from tfm_local.files.drafters import file_key
    from tfm_local.files.gguf_meta import read_gguf_meta
    from tfm_local.train.weaver import Weaver, WeaverConfig

    target, drafter = tiny_pair
    kv = {k: v.value for k, v in read_gguf_meta(target).kv.items()}
    dkv = {k: v.value for k, v in read_gguf_meta(drafter).kv.items()}
    n_embd, n_vocab = int(kv["qwen2.embedding_length"]), len(kv["tokenizer.ggml.tokens"])
    config = WeaverConfig(target_hidden=n_embd, drafter_hidden=int(dkv["dflash.embedding_length"]),
                          depth=int(dkv["dflash.block_size"]) - 1, top_k=8, width=32, heads=2, ffn=64, rank=16)
    torch.manual_seed(0)
    w = Weaver(config)
    codes = torch.randn(n_vocab, config.rank).numpy()
    identity = {"target_sha256": "0" * 64, "target_name": target.name, "drafter_sha256": "0" * 64,
                "target_key": file_key(target)}
    return write_weaver_gguf(tmp_path_factory.mktemp("weaver") / "weaver.gguf", config.to_dict(), w.state_dict(),
                             codes, identity, "f32")


def test_the_runtime_loads_no_converter_trainer_bench_testing_torch_or_matplotlib(tiny_pair, tiny_weaver):
    target, drafter = tiny_pair
    r = subprocess.run([sys.executable, "-c", CHILD, str(target), str(drafter), str(tiny_weaver)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(isinstance(t, str) for t in got["texts"])
    loaded = [m for m in got["modules"] if any(m == p or m.startswith(p + ".") for p in APART)]
    assert loaded == [], loaded
