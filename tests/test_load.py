"""tfm-bench load (tfm_local/bench/load.py) on the tiny pair: a short run in CI (the 10-minute run is
recorded in docs/reliability.md)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from tfm_local.bench.provenance import problems


def test_the_server_under_short_load(tiny_pair, tmp_path):
    from tfm_local.bench.load import main

    target, drafter = tiny_pair
    out = tmp_path / "load.json"
    rc = main(["--target", str(target), "--drafter", str(drafter), "--n-ctx", "512", "--threads", "1",
               "--clients", "8", "--seconds", "12", "--max-tokens", "16", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["ok"], doc
    assert doc["requests"] >= 40 and set(doc["by_kind"]) >= {"greedy", "malformed", "dropped"}
    assert not doc["server_errors"] and doc["n_failures"] == 0 and doc["server_exit"] == 0
    assert problems(doc["provenance"], ["target", "drafter"]) == []


def test_a_greedy_answer_that_differs_is_a_failure(tiny_pair):
    from tfm_local.bench.load import PROMPTS, run_load, start_server

    target, drafter = tiny_pair
    args = SimpleNamespace(target=target, drafter=drafter, n_ctx=512, threads=1, startup=120)
    proc, url = start_server(args)
    try:
        wrong = {p: "not what the model says" for p in PROMPTS}
        st = run_load(url, 2, 3, 8, wrong, 0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert any("differs" in f for f in st["failures"])


def test_a_load_of_nothing_is_refused():
    """--clients 0 (found by the review) would have passed with no request made."""
    import pytest

    from tfm_local.bench.load import main

    for args in (["--clients", "0"], ["--seconds", "0"]):
        with pytest.raises(SystemExit) as e:
            main(["--url", "http://127.0.0.1:9", *args])
        assert e.value.code == 2
