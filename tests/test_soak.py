"""tfm-bench-soak (tfm_local/bench/soak.py) and Engine.state_problems, on the tiny pair: a short soak
in CI (the 20,000-token run is recorded in docs/reliability.md)."""
from __future__ import annotations

import json

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
