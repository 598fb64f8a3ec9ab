"""docs/profile_passes.py (the GPU profile of verify passes and drafter steps) on the CPU: a tiny target
and a random drafter; every case is timed, no CUDA kernel is recorded without a GPU, the JSON is written."""
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

import synth  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "profile_passes.py"


def test_profile_passes_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    target = synth.write_tiny_target(tmp_path / "t.gguf")
    spec = importlib.util.spec_from_file_location("profile_passes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "p.json"
    assert mod.main(["--target", str(target), "--drafter", "random", "--tokens", "1,3", "--ctx", "32",
                     "--iters", "2", "--warmup", "1", "--threads", "1", "--cpu", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split(" ", 1)[0] for r in rows] == ["target", "target", "drafter", "drafter"]
    assert [r["case"] for r in rows][2:] == ["drafter topk", "drafter step"]
    assert all(r["wall_ms"] > 0 and r["kernel_ms"] == 0 and r["kernels"] == 0 for r in rows)
