"""tfm_bench_op (op_harness.bench_op) and the GDN tree benchmark (tfm_local.bench.gdn, tfm-bench gdn), CPU, tiny
dims."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tfm_local.bench import gdn as gdn_bench
from tfm_local.testing import op_harness
from tfm_local.testing import gdn_ops as tree_ops
from tfm_local.bench import gdn_cli as bench_gdn
from tfm_local.bench.provenance import problems

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TINY = gdn_bench.Dims(heads_v=4, heads_k=2, head_dim=16, conv_channels=32, d_conv=4, layers=2)


def _tree_srcs(n: int = 24, seed: int = 0):
    rng = np.random.default_rng(seed)
    tree = gdn_bench.ddtree(n, rng)
    x = gdn_bench.make_inputs(TINY, n, rng)
    return x, tree, gdn_bench.gdn_srcs(x, tree.parents)


def _out_size(x, n: int) -> int:
    S, H, Hk = TINY.head_dim, TINY.heads_v, TINY.heads_k
    return (2 * S + 1) * H * n + S * Hk * n


def test_bench_op_times_and_leaves_results_unchanged():
    x, tree, srcs = _tree_srcs()
    before = op_harness.run_op("gdn_tree", srcs, _out_size(x, 24))
    ms = op_harness.bench_op("gdn_tree", srcs, n_warmup=1, n_iter=7)
    assert ms.shape == (7,) and ms.dtype == np.float32
    assert np.isfinite(ms).all() and (ms > 0).all()
    np.testing.assert_array_equal(op_harness.run_op("gdn_tree", srcs, _out_size(x, 24)), before)
    # every op of the benchmark can be timed (the commit's iparam = d_conv)
    conv = op_harness.bench_op("conv_commit", [x["sx"], np.array([[0, 1]], np.int32)], iparam=4, n_iter=2)
    assert conv.shape == (2,) and (conv > 0).all()


def test_bench_op_repeat_computes_the_copies():
    """A graph of 16 copies of a ~millisecond op takes several times one copy's time (the copies are
    computed, not shared), and op_time turns the two into the op's own time."""
    dims = gdn_bench.Dims(heads_v=8, heads_k=2, head_dim=64, conv_channels=32, d_conv=4, layers=1)
    rng = np.random.default_rng(1)
    tree = gdn_bench.ddtree(64, rng)
    srcs = gdn_bench.gdn_srcs(gdn_bench.make_inputs(dims, 64, rng), tree.parents)
    # minima over up to three rounds: a busy machine (a CI run beside this one) inflates single calls by
    # up to 10x, never below the work; shared copies would keep `many` near `one` in every round
    one, many = np.full(1, np.inf), np.full(1, np.inf)
    for _ in range(3):
        one = np.minimum(one, op_harness.bench_op("gdn_tree", srcs, n_warmup=1, n_iter=10, n_repeat=1).min())
        many = np.minimum(many, op_harness.bench_op("gdn_tree", srcs, n_warmup=1, n_iter=5, n_repeat=16).min())
        if many[0] > 4 * one[0]:
            break
    assert np.min(many) > 4 * np.min(one)
    assert 0 < op_harness.op_time(one.min(keepdims=True), many.min(keepdims=True), 16) < np.min(many)


def test_speedup_ratio_is_undefined_for_non_positive_times():
    assert gdn_bench._ratio(2.0, 0.5) == 4.0
    assert gdn_bench._ratio(2.0, 0.0) is None and gdn_bench._ratio(-1.0, 0.5) is None
    assert bench_gdn._x(None) == "-" and bench_gdn._x(3.456) == "3.46x"


def test_op_time_is_the_difference_per_extra_copy():
    assert op_harness.op_time(np.array([1.0, 1.2, 1.1]), np.array([5.1, 5.0, 5.2]), 5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n_repeat"):
        op_harness.op_time(np.ones(2), np.ones(2), 1)


@pytest.mark.parametrize("kwargs,match", [
    ({"n_iter": 0}, "n_iter"), ({"n_warmup": -1}, "n_warmup"), ({"device": "tpu"}, "device"),
    ({"n_repeat": 0}, "n_repeat"), ({"n_repeat": op_harness.BENCH_MAX_REPEAT + 1}, "n_repeat"),
])
def test_bench_op_rejects_bad_arguments(kwargs, match):
    _, _, srcs = _tree_srcs(8)
    with pytest.raises(ValueError, match=match):
        op_harness.bench_op("gdn_tree", srcs, **kwargs)


def test_bench_op_rejects_bad_ops_and_sources():
    _, _, srcs = _tree_srcs(8)
    with pytest.raises(ValueError, match="op must be"):
        op_harness.bench_op("gdn_trie", srcs)
    with pytest.raises(ValueError, match="failed"):  # one source short: the C side refuses
        op_harness.bench_op("gdn_tree", srcs[:-1])
    with pytest.raises(ValueError, match="float32/int32"):
        op_harness.bench_op("gdn_tree", [s.astype(np.float64) for s in srcs])


def test_ddtree_cases_are_trees_within_depth():
    for n in (1, 16, 64):
        tree = gdn_bench.ddtree(n, np.random.default_rng(n))
        paths = gdn_bench.leaf_paths(tree)
        assert len(tree) == n and max(map(len, paths)) <= gdn_bench.MAX_DEPTH
        assert sorted({i for p in paths for i in p}) == list(range(n))  # the leaves' paths cover the tree
        assert all(tree.parents[p[0]] == -1 for p in paths)


def test_check_case_detects_wrong_work(monkeypatch):
    """The check compares real outputs: when the tree op runs another tree than the per-branch paths
    (the last node re-rooted), the check fails and run_case does not time the case."""
    x, tree, _ = _tree_srcs(16, seed=3)
    assert gdn_bench.check_case(x, tree, TINY, "cpu", 2)["correct"]
    paths = gdn_bench.leaf_paths(tree)
    assert tree.parents[paths[-1][-1]] >= 0
    bad = tree.parents.copy()
    bad[paths[-1][-1]] = -1
    monkeypatch.setattr(gdn_bench, "leaf_paths", lambda t: paths)
    res = gdn_bench.check_case(x, gdn_bench.Tree(bad, tree.tokens, tree.depth, tree.logp), TINY, "cpu", 2)
    assert not res["correct"] and res["errors"]["gdn_o_grouped"] > res["bounds"]["gdn_o_grouped"]
    monkeypatch.setattr(gdn_bench, "ddtree", lambda n, rng: gdn_bench.Tree(bad, tree.tokens, tree.depth, tree.logp))
    case = gdn_bench.run_case(16, TINY, np.random.default_rng(0), n_iter=2)
    assert not case["check"]["correct"] and "times" not in case


def test_cli_end_to_end_writes_json(tmp_path, capsys):
    out = tmp_path / "gdn.json"
    bench_gdn.main(["--device", "cpu", "--nodes", "8,24", "--heads-v", "4", "--heads-k", "2", "--head-dim", "16",
                    "--conv-channels", "32", "--iters", "3", "--warmup", "1", "--threads", "2",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert {"command", "date", "device", "dims", "method", "cases", "bar", "iters"} <= set(doc)
    assert doc["device"] == "cpu" and doc["dims"]["heads_v"] == 4 and doc["bar"] is None
    assert problems(doc["provenance"]) == []  # where it ran: commit, CPU, llama.cpp build
    assert [c["nodes"] for c in doc["cases"]] == [8, 24]
    for c in doc["cases"]:
        assert c["check"]["correct"] is True
        assert sum(c["groups"].values()) == c["leaves"] and c["depth"] <= 16
        for op in ("gdn", "conv"):
            for kind in ("tree", "branch", "padded"):
                t = c["times"][op][kind]
                assert 0 < t["min_ms"] <= t["median_ms"]
        assert c["times"]["commit"]["gdn"]["median_ms"] > 0
    assert "speedup" in capsys.readouterr().out


def test_cli_repeat_reports_op_times(tmp_path, capsys):
    out = tmp_path / "gdn.json"
    bench_gdn.main(["--device", "cpu", "--nodes", "24", "--heads-v", "4", "--heads-k", "2", "--head-dim", "16",
                    "--conv-channels", "32", "--iters", "3", "--warmup", "1", "--threads", "2", "--repeat", "3",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["repeat"] == 3 and not (tmp_path / "gdn.json.part").exists()
    (case,) = doc["cases"]
    for op in ("gdn", "conv"):
        for kind in ("tree", "branch", "padded"):
            assert np.isfinite(case["times"][op][kind]["op_ms"])
    # microsecond ops timed 3 times on a shared CPU: an op time by differences may come out <= 0,
    # its ratio is then None (JSON null, "-" in the table)
    branch, tree = case["times"]["gdn"]["branch"]["op_ms"], case["times"]["gdn"]["tree"]["op_ms"]
    want = branch / tree if branch > 0 and tree > 0 else None
    assert case["speedup"]["gdn_op"] == (pytest.approx(want) if want else None)
    assert {"gdn_op", "gdn_padded_op", "conv_op", "conv_padded_op"} <= set(case["speedup"])
    assert "op's own ms" in capsys.readouterr().out


def test_median_of_rounds_is_element_wise():
    rounds = [{"gdn": {"tree": {"median_ms": m, "op_ms": o}}, "x": None if o < 0 else 1.0}
              for m, o in ((3.0, 1.0), (1.0, 5.0), (2.0, -1.0))]
    got = gdn_bench.median_of_rounds(rounds)
    assert got["gdn"]["tree"] == {"median_ms": 2.0, "op_ms": 1.0} and got["x"] is None
    assert gdn_bench.median_of_rounds([{"a": 1.0}, {"a": 4.0}]) == {"a": 2.5}
    with pytest.raises(ValueError):
        gdn_bench.median_of_rounds([])


def test_cli_rounds_time_every_op_each_round(tmp_path, monkeypatch):
    calls = []
    real = gdn_bench.time_case

    def counted(*args, **kwargs):
        calls.append(args[1].parents.size)
        return real(*args, **kwargs)

    monkeypatch.setattr(gdn_bench, "time_case", counted)
    out = tmp_path / "gdn.json"
    bench_gdn.main(["--device", "cpu", "--nodes", "8,24", "--heads-v", "4", "--heads-k", "2", "--head-dim", "16",
                    "--conv-channels", "32", "--iters", "2", "--warmup", "1", "--threads", "2", "--rounds", "3",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert calls == [8, 8, 8, 24, 24, 24] and doc["rounds"] == 3 and "--rounds" in doc["method"]
    for c in doc["cases"]:
        t = c["times"]["gdn"]["branch"]
        assert 0 < t["min_ms"] and c["speedup"]["gdn"] == pytest.approx(t["median_ms"] / c["times"]["gdn"]["tree"]["median_ms"])
    with pytest.raises(SystemExit):
        bench_gdn.parse_args(["--rounds", "0"])


def test_cli_rejects_bad_options():
    with pytest.raises(SystemExit):
        bench_gdn.parse_args(["--nodes", "16,x"])
    with pytest.raises(SystemExit):
        bench_gdn.parse_args(["--repeat", str(op_harness.BENCH_MAX_REPEAT + 1)])
    with pytest.raises(SystemExit):
        bench_gdn.parse_args(["--heads-v", "5", "--heads-k", "2"])
    with pytest.raises(SystemExit):  # llama.cpp's short conv needs a kernel of 2 or more (it aborts otherwise)
        bench_gdn.parse_args(["--d-conv", "1"])


@pytest.mark.parametrize("where", ["missing/x.json", "."])
def test_cli_refuses_an_unwritable_json_before_timing(tmp_path, monkeypatch, capsys, where):
    def never(*a, **k):
        raise AssertionError("the benchmark ran before the --json path was checked")

    monkeypatch.setattr(gdn_bench, "run_case", never)
    with pytest.raises(SystemExit) as e:
        bench_gdn.main(["--nodes", "8", "--json", str(tmp_path / where)])
    assert e.value.code == 2 and "cannot write --json" in capsys.readouterr().err


def test_bar_result():
    case = {"nodes": 128, "speedup": {"gdn": 7.5}}
    assert bench_gdn.bar_result([case])["met"] is True
    assert bench_gdn.bar_result([{**case, "speedup": {"gdn": 6.9}}])["met"] is False
    assert bench_gdn.bar_result([{"nodes": 64, "speedup": {"gdn": 9.0}}]) is None
    with_op = bench_gdn.bar_result([{**case, "speedup": {"gdn": 6.0, "gdn_op": 8.0}}])
    assert with_op["met"] is False and with_op["speedup_op"] == 8.0  # the bar is judged per call


def test_tolerances_are_shared_with_the_op_tests():
    assert set(tree_ops.ERR_F32_BY_DEVICE) == {"cpu", "gpu"}
    assert tree_ops.rel_err(np.ones(3), np.ones(3) + 1e-3) == pytest.approx(1e-3 / (1 + 1e-3))


def _tree_file(path, rows) -> str:
    np.savez(path, parents=np.asarray(rows, np.int32), set=np.array(["humaneval"] * len(rows)))
    return str(path)


CHAIN = [-1, 0, 1, 2, 3, 4, 5, 6]   # one leaf, 8 per-branch tokens
STAR = [-1, 0, 0, 0, 0, 0, 0, 0]    # 7 leaves, 14 tokens
MIXED = [-1, 0, 1, 1, 0, 4, 5, 5]   # 4 leaves, 3 + 3 + 4 + 4 = 14 tokens


def test_tree_from_parents_rejects_what_is_not_a_tree_in_order():
    t = gdn_bench.tree_from_parents(MIXED)
    assert list(t.depth) == [0, 1, 2, 2, 1, 2, 3, 3] and list(t.tokens) == list(range(8))
    for bad in ([0, 0], [-1, 1], [-1, 0, -1], [-1, 0, 3, 1], [], [-1, 0, 0.5, 1], [[-1, 0]]):
        with pytest.raises(ValueError, match="not a tree"):
            gdn_bench.tree_from_parents(bad)


def test_load_trees_spreads_the_picks_over_per_branch_cost(tmp_path):
    f = _tree_file(tmp_path / "t.npz", [STAR, CHAIN, MIXED, CHAIN, STAR])
    cost = lambda t: sum(map(len, gdn_bench.leaf_paths(t)))  # noqa: E731
    two = gdn_bench.load_trees(f, 2)
    assert [(i, cost(t)) for i, _, t in two] == [(1, 8), (4, 14)] and list(two[0][2].parents) == CHAIN
    assert [cost(t) for _, _, t in gdn_bench.load_trees(f, 3)] == [8, 14, 14]
    assert [cost(t) for _, _, t in gdn_bench.load_trees(f, 1)] == [14]  # the median, not the cheapest
    assert len(gdn_bench.load_trees(f, 50)) == 5  # never more than the file holds
    assert {s for s, in [(s,) for _, s, _ in two]} == {"humaneval"}


def test_load_trees_explains_a_bad_file(tmp_path):
    np.savez(tmp_path / "nokey.npz", trees=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="no 'parents' array"):
        gdn_bench.load_trees(str(tmp_path / "nokey.npz"), 2)
    with pytest.raises(ValueError, match=r"\[n_trees, N\]"):
        gdn_bench.load_trees(_tree_file(tmp_path / "flat.npz", CHAIN), 2)
    with pytest.raises(ValueError, match="tree 1: not a tree"):
        gdn_bench.load_trees(_tree_file(tmp_path / "bad.npz", [CHAIN, [-1, 0, 5, 1, 1, 1, 1, 1]]), 2)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not an .npz archive"):
        gdn_bench.load_trees(str(tmp_path / "junk.npz"), 2)
    (tmp_path / "zip.npz").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ValueError, match="not an .npz archive"):
        gdn_bench.load_trees(str(tmp_path / "zip.npz"), 2)
    np.save(tmp_path / "one.npy", np.asarray([CHAIN]))
    with pytest.raises(ValueError, match="a single array"):
        gdn_bench.load_trees(str(tmp_path / "one.npy"), 2)
    with pytest.raises(OSError):
        gdn_bench.load_trees(str(tmp_path / "missing.npz"), 2)


def test_cli_times_the_trees_of_a_file(tmp_path, capsys):
    f, out = _tree_file(tmp_path / "t.npz", [STAR, CHAIN, MIXED]), tmp_path / "gdn.json"
    bench_gdn.main(["--device", "cpu", "--trees", f, "--tree-count", "2", "--heads-v", "4", "--heads-k", "2",
                    "--head-dim", "16", "--conv-channels", "32", "--iters", "2", "--warmup", "1", "--threads", "2",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["trees"] == f and len(doc["trees_sha256"]) == 64
    # cheapest (CHAIN, row 1) and dearest (MIXED, row 2: the last of the ties)
    assert [(c["nodes"], c["leaves"], c["tree_index"], c["tree_set"]) for c in doc["cases"]] == \
        [(8, 1, 1, "humaneval"), (8, 4, 2, "humaneval")]
    assert all(c["check"]["correct"] and c["times"]["gdn"]["tree"]["median_ms"] > 0 for c in doc["cases"])


def test_cli_refuses_a_bad_tree_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench_gdn.main(["--device", "cpu", "--trees", str(tmp_path / "missing.npz")])
    assert e.value.code == 2 and "--trees:" in capsys.readouterr().err


def test_bar_result_takes_the_median_over_trees():
    cases = [{"nodes": 128, "speedup": {"gdn": g, "gdn_op": o}} for g, o in ((6.0, 5.0), (7.5, None), (8.0, 7.0))]
    bar = bench_gdn.bar_result(cases + [{"nodes": 128, "check": {"correct": False}}])
    assert bar["speedup"] == 7.5 and bar["met"] is True and bar["n_trees"] == 3 and bar["speedup_op"] == 6.0
