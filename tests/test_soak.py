"""tfm-bench soak (tfm_local/bench/soak.py) and Engine.state_problems, on the tiny pair: a short soak
in CI (the 20,000-token run is recorded in docs/reliability.md)."""
from __future__ import annotations

import json

import pytest

from tfm_local.bench.provenance import problems


def test_state_problems_sees_a_cache_out_of_step(tiny_pair):
    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine

    target, drafter = tiny_pair
    with Engine(target, drafter, n_ctx=256, budget=4) as e:
        ids = e.prompt_tokens("hello there")
        list(e.generate_ids(ids, 20, SamplingParams()))
        assert e.state_problems() == []
        e.target.ctx.truncate(e.target.n_past - 3)  # the cache lost tokens the engine counts as committed
        assert any("target" in p for p in e.state_problems())
        e.target.ctx.clear()
        e.target.n_past = 0
        assert any("drafter" in p for p in e.state_problems())  # its rows now run past the target's


def test_state_problems_sees_a_hole_mid_sequence(tiny_pair):
    """Positions missing in the middle of a cache (its last position and length in tokens unchanged) are
    a problem in the target's and in the drafter's cache; pos_max alone did not show them. So is a
    drafter cache emptied behind its counters (only rows past its injected ones were looked for)."""
    import llama_cpp as lc

    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine

    target, drafter = tiny_pair
    with Engine(target, drafter, n_ctx=256, budget=4) as e:
        list(e.generate_ids(e.prompt_tokens("hello there"), 20, SamplingParams()))
        assert e.state_problems() == [] and e.target.n_past > 12 and e.drafter.ctx.pos_max() > 8
        lc.llama_memory_seq_rm(e.drafter.ctx.mem, 0, 3, 5)  # drafter rows 3 and 4
        assert e.state_problems() == [
            f"drafter: cache holds {e.drafter.ctx.pos_max() - 1} cells for positions 0 .. "
            f"{e.drafter.ctx.pos_max()}: 2 missing (a hole mid-sequence)"]
        last = e.target.n_past - 1
        lc.llama_memory_seq_rm(e.target.ctx.mem, 0, 5, 8)  # target positions 5, 6 and 7
        assert e.target.ctx.pos_max() == last
        assert any(p.startswith("target:") and "3 missing" in p for p in e.state_problems())
        d_end = e.drafter._d_end
        e.drafter.ctx.clear()  # the drafter's cache emptied behind its counters
        assert f"drafter: cache holds positions up to -1, short of its {d_end} injected rows" in e.state_problems()


@pytest.mark.parametrize("arch", ["gemma3", "qwen35"])
def test_a_hole_shows_in_a_sliding_window_or_hybrid_cache(tmp_path, arch):
    """The cell count comes from the full-attention cache of an iSWA memory (gemma3, a 4-token window
    here) and from the attention part of a hybrid one (qwen35): a whole cache reads clean, a hole does not."""
    import llama_cpp as lc

    from tfm_local.decode.verify import Target
    from tfm_local.testing.synth import write_tiny_target

    t = Target(write_tiny_target(tmp_path / f"{arch}.gguf", arch=arch), n_ctx=64, n_threads=1, n_gpu_layers=0)
    try:
        t.prefill(list(range(1, 21)))
        assert t.ctx.pos_max() == 19 and t.ctx.n_cells() == 20 and t.ctx.hole_problems("target") == []
        lc.llama_memory_seq_rm(t.ctx.mem, 0, 9, 10)
        assert t.ctx.hole_problems("target") == [
            "target: cache holds 19 cells for positions 0 .. 19: 1 missing (a hole mid-sequence)"]
    finally:
        t.close()


def test_a_short_soak_keeps_caches_consistent_and_memory_flat(tiny_pair, tmp_path):
    from tfm_local.bench.soak import main

    target, drafter = tiny_pair
    out = tmp_path / "soak.json"
    rc = main(["--target", str(target), "--drafter", str(drafter), "--modes", "auto,ddtree@8", "--tokens", "500",
               "--max-tokens", "64", "--sets", "humaneval", "--threads", "1", "--warmup-tokens", "100",
               "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["ok"], doc
    assert problems(doc["provenance"], ["target", "drafter"]) == []
    assert [(r["mode"], r["sampling"]) for r in doc["runs"]] == [("auto", "t=0.8"), ("ddtree@8", "t=0.8"),
                                                                 ("auto", "greedy"), ("ddtree@8", "greedy")]
    assert all(r["tokens"] == 500 and r["requests"] >= 8 and not r["problems"] for r in doc["runs"])
    # the warm-up ran every mode and sampling first; growth counts from its end, the same base for all
    assert [(r["mode"], r["tokens"]) for r in doc["warmup"]] == [("auto", 100), ("ddtree@8", 100)] * 2
    assert len({r["rss_after_warmup_mb"] for r in doc["runs"]}) == 1


def test_a_request_that_fails_is_a_problem_in_the_report(tiny_pair, tmp_path):
    """A request that raises (here: prompts longer than a 64-token context) is reported as a problem,
    the run goes on (it stops after three in a row) and the JSON is written; exit status 1."""
    from tfm_local.bench.soak import main

    target, drafter = tiny_pair
    out = tmp_path / "soak.json"
    rc = main(["--target", str(target), "--drafter", str(drafter), "--modes", "auto", "--tokens", "200",
               "--max-tokens", "64", "--sets", "mtbench", "--threads", "1", "--warmup-tokens", "0",
               "--n-ctx", "64", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1 and not doc["ok"]
    assert any("raised ContextOverflowError" in p for r in doc["runs"] for p in r["problems"]), doc["runs"]
