"""tfm-bench pass (tfm_local/bench/passes.py, passes_cli.py) on a tiny synthetic target."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tfm_local.bench import passes as pb
from tfm_local.bench import passes_cli as bench_pass
from tfm_local.llama.model import gpu_available
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_qwen35, write_tiny_target
from tfm_local.bench.provenance import problems

N_PROMPT = 40


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("pass") / "t.gguf", n_layer=3, seed=3)


def test_cli_end_to_end(target_path, tmp_path, capsys):
    out = tmp_path / "r.json"
    bench_pass.main(["--target", str(target_path), "--ctx", str(N_PROMPT), "--tokens", "1,4", "--iters", "2",
                     "--warmup", "1", "--threads", "2", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert {"command", "argv", "date", "device", "device_name", "target", "ctx", "threads", "iters", "warmup",
            "feature_layers", "skipped", "cases"} <= set(doc)
    assert doc["device"] == ("gpu" if gpu_available() else "cpu")
    assert doc["target"]["bytes"] == target_path.stat().st_size and doc["target"]["n_layer"] == 3
    assert (doc["ctx"], doc["threads"], doc["iters"], doc["warmup"]) == (N_PROMPT, 2, 2, 1)
    assert doc["feature_layers"] == [1, 2]  # spread over a 3-layer target, as a DFlash drafter's
    assert problems(doc["provenance"], ["target"]) == []  # where it ran, the target's SHA-256
    ran = [v for v in pb.VARIANTS if v not in doc["skipped"]]
    assert set(ran) >= {"logits", "sample", "logits+argmax_host", "features", "last_row"}
    assert [(c["tokens"], c["variant"]) for c in doc["cases"]] == [(n, v) for n in (1, 4) for v in ran]
    for c in doc["cases"]:
        assert c["median_ms"] > 0 and c["min_ms"] > 0 and c["min_ms"] <= c["median_ms"]
        assert c["ms_per_token"] == pytest.approx(c["median_ms"] / c["tokens"])
        assert c["remove"]["median_ms"] > 0
        assert ("submit" in c) == (c["variant"] == "last_row")
    table = capsys.readouterr().out
    assert "logits+argmax_host" in table and "median" in table


def test_cache_is_left_as_after_the_prompt(target_path):
    """After every variant's passes the next token's logits equal those of a fresh prefilled context;
    a pass left in the cache is caught (check_cache) and changes them."""
    rng = np.random.default_rng(1)
    prompt = [int(x) for x in rng.integers(0, 320, N_PROMPT)]
    t = Target(target_path, n_ctx=128, n_batch=64, n_threads=2)
    fresh = Target(target_path, n_ctx=128, n_batch=64, n_threads=2)
    try:
        bench = pb.PassBench(t, prompt, [1, 2])
        cases, skipped = pb.run(bench, [3], list(pb.VARIANTS), 0, 1, rng)
        assert len(cases) + len(skipped) == len(pb.VARIANTS)
        assert t.n_past == N_PROMPT and t.ctx.pos_max() == N_PROMPT - 1
        fresh.prefill(prompt)
        want = fresh.verify([7]).logits.copy()
        got = t.verify([7]).logits.copy()
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        t.commit([0])  # leave the token in the cache, as a pass that was not removed
        with pytest.raises(RuntimeError, match="not removed"):
            bench.check_cache()
        leaked = t.verify([7]).logits.copy()
        assert np.abs(leaked - want).max() > 1e-2 * np.abs(want).max()
    finally:
        t.close()
        fresh.close()


def test_recurrent_target_is_refused(tmp_path):
    t = Target(write_tiny_qwen35(tmp_path / "h.gguf"), n_ctx=64, n_threads=2)
    try:
        with pytest.raises(ValueError, match="cannot drop"):
            pb.PassBench(t, [1, 2, 3], [])
    finally:
        t.close()


def test_drafter_variants_end_to_end_and_cache_left_as_found(target_path, tmp_path):
    """--drafter times every drafter variant and a step per --draft-depths depth (those beyond the block
    left out), each also in plain tokens (its median over the 1-token pass's); DraftBench leaves the
    drafter's cache at the prompt, so a draft after the benchmark equals a draft on a fresh drafter given
    the same prompt features."""
    from tfm_convert.pipeline import init_random
    from tfm_local.bench import drafts as db
    from tfm_local.decode.draft import DFlashDrafter

    dpath, _ = init_random(target_path, tmp_path / "d.gguf", layers=1, seed=5)
    out = tmp_path / "r.json"
    bench_pass.main(["--target", str(target_path), "--drafter", str(dpath), "--ctx", str(N_PROMPT),
                     "--tokens", "1", "--variants", "logits", "--iters", "2", "--warmup", "1", "--threads", "2",
                     "--draft-depths", "1,3,999", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert [c["variant"] for c in doc["drafter_cases"]] == list(db.DRAFT_VARIANTS) + ["step@1", "step@3"]
    plain = doc["cases"][0]["median_ms"]
    assert all(c["plain_tokens"] == pytest.approx(c["median_ms"] / plain) for c in doc["drafter_cases"])
    assert problems(doc["provenance"], ["target", "drafter"]) == []
    assert all(0 < c["min_ms"] <= c["median_ms"] for c in doc["drafter_cases"])

    prompt = list(range(3, 3 + N_PROMPT))
    t = Target(target_path, n_ctx=128, n_batch=64, n_threads=2)
    fresh, used = DFlashDrafter(dpath, t, n_threads=2), DFlashDrafter(dpath, t, n_threads=2)
    try:
        t.prefill(prompt, lambda s, n: [d.inject(t.features(slice(0, n), n), s) for d in (fresh, used)])
        bench = db.DraftBench(used, len(used.layers) * t.model.n_embd, np.random.default_rng(0))
        db.run_drafter(bench, list(db.DRAFT_VARIANTS) + ["step@2"], 1, 1)
        for bad, why in (("step@0", "positive integer"), ("step@x", "positive integer"), ("nope", "unknown"),
                         (f"step@{used.block_size}", "outside 1..")):
            with pytest.raises(ValueError, match=why):
                bench.time(bad, 0, 1)
        assert used.n_injected == fresh.n_injected == N_PROMPT
        want = fresh.top_k(prompt[-1], N_PROMPT, 6, 4)
        got = used.top_k(prompt[-1], N_PROMPT, 6, 4)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], atol=1e-5)
    finally:
        fresh.close()
        used.close()
        t.close()


@pytest.mark.parametrize("bad", ["missing.gguf", "not-gguf.txt"])
def test_bad_drafter_is_a_clear_error(target_path, tmp_path, capsys, bad):
    """--drafter that is missing or not a GGUF exits with status 2 and a message, before any timing."""
    (tmp_path / "not-gguf.txt").write_text("hello")
    with pytest.raises(SystemExit) as e:
        bench_pass.main(["--target", str(target_path), "--drafter", str(tmp_path / bad), "--ctx", "8",
                         "--tokens", "1", "--iters", "1", "--warmup", "0"])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert "drafter:" in err.err and "Traceback" not in err.err and "median" not in err.out
