"""lab/gpu/divergence.py on tiny synthetic models: its generation equals the engine's, its tree rows and
path rows are the target's, a wrong row mapping shows, and a short run writes its JSON and tables.

On the CPU the tiny F32 targets' batched and one-row kernels agree (tests/test_tree_verify.py), so every
speculative run equals plain decoding and every pass-spread row is within the suite's tolerance; on a
GPU build only the shapes of the results are checked.
"""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tfm_local.decode.sampling import SamplingParams
from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available

from test_drafter_topk import paths  # noqa: F401  (fixture: the tiny qwen2 target + random drafter)

SCRIPT = Path(__file__).resolve().parents[1] / "lab" / "gpu" / "divergence.py"
#: tests/test_tree_verify.py's CPU tolerance, relative to the largest |logit|
REL_TOL = 2e-3


def load_script():
    spec = importlib.util.spec_from_file_location("lab_divergence", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


div = load_script()


@pytest.fixture(scope="module")
def engine(paths):
    e = Engine(paths[0], paths[1], n_ctx=512, budget=None, tree="ddtree", n_threads=1, greedy_argmax="host")
    yield e
    e.close()


def prompt(engine):
    return engine.prompt_tokens([{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}])


def test_row_diff():
    ref = np.array([0.0, 5.0, 4.8, 1.0, -2.0])
    same = div.row_diff(ref, ref)
    assert same["max_abs"] == 0 and same["gap_shift"] == 0 and not same["flip"] and same["flip_gap"] is None
    assert same["gap12"] == pytest.approx(0.2)
    d = div.row_diff(ref + np.array([0.1, 0.0, 0.3, 0.0, 0.0]), ref)
    assert d["flip"] and d["flip_gap"] == pytest.approx(0.2) and d["max_abs"] == pytest.approx(0.3)
    assert d["gap12_change"] == pytest.approx(-0.3) and d["gap_shift"] == d["gap_shift_near"] == pytest.approx(0.3)
    assert div.row_diff(ref + 7.0, ref)["gap_shift"] < 1e-12  # a common offset moves no gap


def test_greedy_run_is_the_engines_generation(engine):
    ids = prompt(engine)
    for tree, budget in (("chain", 0), ("ddtree", 6)):
        engine.set_draft(tree, budget)
        want = list(engine.generate_ids(ids, 20, SamplingParams()))
        seen = []
        got, meta = div.greedy_run(engine, ids, 20, lambda j, row, info: seen.append((j, info)))
        assert got == want and not meta["timed_out"]
        assert [j for j, _ in seen] == sorted(j for j, _ in seen) and seen[0] == (0, None)
        assert len({j for j, _ in seen}) == len(got)  # one row per emitted token (the walk reads each once)
        assert all((i["depth"] == 0) == (i["node"] == 0) for _, i in seen[1:])
        assert max(i["n_nodes"] for _, i in seen[1:]) == budget + 1 and meta["steps"] <= len(got) - 1
    assert "verify" not in vars(engine.target)  # the wrapper is gone


def test_tree_rows_equal_path_rows(engine):
    ids = prompt(engine)
    t = engine.target
    t.prefill(ids)
    n0 = t.n_past
    rng = np.random.default_rng(0)
    tree = div.make_tree("synthetic", 24, 17, [], list(ids), rng, engine, n0)
    nodes = np.arange(len(tree))
    a = div.tree_rows(t, tree.tokens, tree.parents, nodes)
    b = div.path_rows(t, tree.tokens, tree.parents, nodes)
    assert t.n_past == n0 and sorted(a) == sorted(b) == list(range(len(tree)))
    for i in nodes:
        d = div.row_diff(a[i], b[i])
        assert d["rel"] < (1.5e-2 if gpu_available() else REL_TOL)
    # the path rows are decoding the path from scratch: the deepest node's row after a fresh prefill
    deep = int(np.argmax(tree.depth))
    path = [int(tree.tokens[k]) for k in tree.path(deep)]
    fresh = np.array(t.prefill(ids + path))
    assert div.row_diff(b[deep], fresh)["rel"] < (1.5e-2 if gpu_available() else REL_TOL)


def test_spread_finds_a_wrong_row_mapping(engine, monkeypatch):
    """The spread sees a tree pass whose rows are mapped to the wrong nodes (the bug it looks for)."""
    ids = prompt(engine)
    rng = np.random.default_rng(1)
    ok = div.spread_position(engine, ids, 33, [40, 41, 42], [1, 8, 16], ["ddtree", "chain", "synthetic"], rng)
    assert {(r["source"], r["n"]) for r in ok} == {(s, n) for s in ("ddtree", "chain", "synthetic") for n in (1, 8, 16)}
    assert all(r["max_abs"] == 0 for r in ok if r["n"] == 1)
    if not gpu_available():
        assert max(r["rel"] for r in ok) < REL_TOL and not any(r["flip"] for r in ok)
    real = type(engine.target).verify

    def shuffled(self, tokens, parents=None, depth=None, **kw):
        v = real(self, tokens, parents, depth, **kw)
        if len(tokens) > 1:
            v.logits = np.asarray(v.logits)[::-1].copy()
        return v

    monkeypatch.setattr(type(engine.target), "verify", shuffled)
    bad = div.spread_position(engine, ids, 33, [40, 41, 42], [8], ["synthetic"], rng)
    assert max(r["rel"] for r in bad) > 0.05
    s = div.summarize_spread(ok + bad)
    assert {r["source"] for r in s} == {"ddtree", "chain", "synthetic"}


def test_census_prompt(engine):
    ids = prompt(engine)
    r = div.census_prompt(engine, ids, 24, [4, 12])
    ref = r["plain"]["ids"]
    engine.set_draft("chain", 0)
    assert ref == list(engine.generate_ids(ids, 24, SamplingParams()))
    for b in (4, 12):
        m = r["modes"][f"ddtree@{b}"]
        assert m["tau"] >= 1 and all(row[1] <= b + 1 for row in m["drift"])
        if not gpu_available():
            assert m["compared"] == len(ref) - 1 and m["divergence"] is None
            assert max(row[3] for row in m["drift"]) < 0.05
    s = div.summarize_census([dict(r, set="x", prompt_id="y")], [4, 12])
    assert [x["mode"] for x in s] == ["ddtree@4", "ddtree@12"]
    assert gpu_available() or s[0]["divergences"] == s[1]["divergences"] == 0


def test_census_records_a_divergence(engine, monkeypatch):
    """A tree pass whose logits move (here: a token plain decoding never emits pushed up in every row of
    a pass of more than one node) is reported at its first divergence with both rows' gaps, the
    prefill's classification (not a near-tie) and the replay (the tree pass flips again, the 1-token
    path decoding does not)."""
    ids = prompt(engine)
    engine.set_draft("chain", 0)
    ref = list(engine.generate_ids(ids, 24, SamplingParams()))
    tok = next(t for t in range(100, 300) if t not in ref)
    real = type(engine.target).verify

    def bumped(self, tokens, parents=None, depth=None, **kw):
        v = real(self, tokens, parents, depth, **kw)
        if len(tokens) > 1:
            rows = np.array(v.logits)
            rows[:, tok] = rows.max(axis=1) + 3.0
            v.logits = rows
        return v

    monkeypatch.setattr(type(engine.target), "verify", bumped)
    r = div.census_prompt(engine, ids, 24, [6])
    d = r["modes"]["ddtree@6"]["divergence"]
    assert d is not None and d["index"] == 1 and d["spec_token"] == tok and d["plain_token"] == ref[1]
    assert d["n_nodes"] == 7 and d["depth"] == 0 and d["tree"]["gap"] >= 3.0 and d["one_token"]["gap"] > 0
    assert d["flip"] == pytest.approx(d["tree"]["gap"] + d["one_token"]["gap"]) and not d["prefill"]["near_tie"]
    assert d["replay"]["tree"]["argmax"] == tok  # the replayed tree pass goes through the same bump
    assert d["replay"]["one_token"]["argmax"] == ref[1]
    assert r["modes"]["ddtree@6"]["compared"] == 1


def test_main_writes_json_and_stops_at_the_time_limit(paths, tmp_path, capsys):
    models = paths
    out = tmp_path / "div.json"
    doc = div.main(["--out", str(out), "--target", str(models[0]), "--drafter", str(models[1]), "--sets",
                    "gsm8k,humaneval", "--prompts", "1", "--tokens", "12", "--budgets", "4,8", "--sizes", "1,8",
                    "--sources", "ddtree,chain", "--positions", "1", "--threads", "1", "--cpu", "--time-limit", "600"])
    saved = json.loads(out.read_text())
    assert saved["complete"] and saved["backend"] == "cpu" and len(saved["census"]) == 2
    assert [s["mode"] for s in saved["census_summary"]] == ["ddtree@4", "ddtree@8"]
    assert {(s["source"], s["n"]) for s in saved["spread_summary"]} == {(s, n) for s in ("ddtree", "chain") for n in (1, 8)}
    assert saved["spread_summary"] == doc["spread_summary"]
    text = capsys.readouterr().out
    assert "pass spread" in text and "census" in text
    div.main(["--out", str(out), "--target", str(models[0]), "--drafter", str(models[1]), "--sets", "gsm8k",
              "--prompts", "2", "--tokens", "12", "--cpu", "--threads", "1", "--time-limit", "0"])
    cut = json.loads(out.read_text())
    assert not cut["complete"] and cut["census"] == [] and cut["spread"] == []
