"""tfm_local.bench.profile_passes (the GPU profile of verify passes and drafter steps) on the CPU: a tiny target
and a random drafter; every case is timed, no CUDA kernel is recorded without a GPU, the JSON is written."""
import json

import pytest

pytest.importorskip("torch")

from tfm_local.testing import synth  # noqa: E402

from tfm_local.bench import profile_passes  # noqa: E402
from tfm_local.bench.provenance import problems  # noqa: E402


def test_profile_passes_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    target = synth.write_tiny_target(tmp_path / "t.gguf")
    out = tmp_path / "p.json"
    assert profile_passes.main(["--target", str(target), "--drafter", "random", "--tokens", "1,3", "--ctx", "32",
                     "--iters", "2", "--warmup", "1", "--threads", "1", "--cpu", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert problems(doc["provenance"], ["target", "drafter"]) == []
    assert [r["case"].split(" ", 1)[0] for r in rows] == ["target", "target", "drafter", "drafter"]
    assert [r["case"] for r in rows][2:] == ["drafter topk", "drafter step"]
    assert all(r["wall_ms"] > 0 and r["kernel_ms"] == 0 and r["kernels"] == 0 for r in rows)


def test_kernel_table_leaves_out_the_case_annotation():
    """On a GPU the profiler puts a case's own record_function range on the CUDA timeline as well (a user
    annotation, first seen on the H200): it must not count as a kernel. CUPTI events cannot exist on this
    CPU-only machine, so the events are stand-ins with the profiler's attributes."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    def ev(name, dev, a, b):
        return NS(name=name, device_type=dev, time_range=NS(start=a, end=b, elapsed_us=lambda: b - a))
    events = [ev("case", DeviceType.CPU, 0, 1000), ev("case", DeviceType.CUDA, 10, 1990),
              ev("gemm", DeviceType.CUDA, 100, 400), ev("norm", DeviceType.CUDA, 500, 600),
              ev("late", DeviceType.CUDA, 1500, 1600)]
    (row,) = profile_passes.kernel_table(NS(events=lambda: events), ["case"], iters=1)
    assert row["kernels"] == 2 and row["kernel_ms"] == pytest.approx(0.4)
    assert [name for name, _ in row["top"]] == ["gemm", "norm"] and row["busy"] == pytest.approx(0.4)
