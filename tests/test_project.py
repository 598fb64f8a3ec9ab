"""tfm-bench project (tfm_local/bench/project.py): projected speed-ups from one bench's step costs and
another's τ."""
from __future__ import annotations

import json

import pytest

from tfm_local.bench.provenance import problems


def _row(set_, label, budget, tau, phases, speedup=1.0, sampling="greedy"):
    return dict(set=set_, label=label, mode=label, sampling=sampling, budget=budget, budget_max=budget,
                tau=tau, speedup=speedup, ms_per_step=phases)


def _bench(path, rows, gpu=True):
    path.write_text(json.dumps(dict(target="t.gguf", drafter="d.gguf", date="2026-12-03",
                                    machine=dict(gpu=gpu, threads=4), summary=rows)))
    return str(path)


def test_projection_joins_costs_and_tau(tmp_path, capsys):
    from tfm_local.bench.project import main, project

    costs = _bench(tmp_path / "twin.json", [
        _row("a", "plain", 0, 1.0, {"submit": 0.5, "verify": 3.0}),
        _row("a", "ddtree@16", 16, 1.0, {"drafter": 2.0, "submit": 1.0, "verify": 4.0}),
        _row("c", "plain", 0, 1.0, {"verify": 4.5}),
        _row("c", "ddtree@16", 16, 1.0, {"verify": 9.0}),
        _row("a", "ddtree@auto", "auto", 1.0, {"verify": 1.0}),          # not a fixed budget: unused
    ])
    tau = _bench(tmp_path / "real.json", [
        _row("a", "plain", 0, 1.0, {"verify": 1.8}),
        _row("a", "ddtree@16", 16, 4.0, {"verify": 5.0}, speedup=1.2),
        _row("b", "ddtree@16", 16, 3.0, {"verify": 5.0}, speedup=0.9),
        _row("a", "ddtree@64", 64, 5.0, {"verify": 7.0}),                # the twin did not run it: left out
        _row("a", "ddtree@16 t0.7", 16, 2.0, {"verify": 5.0}, sampling="t0.7"),
    ], gpu=False)
    got = project(json.loads(open(costs).read()), json.loads(open(tau).read()))
    assert [(r["set"], r["mode"], r["cost_set"]) for r in got] == [("a", "ddtree@16", "a"), ("b", "ddtree@16", "mean")]
    assert got[0]["projected"] == pytest.approx(4.0 * 3.5 / 7.0)
    assert got[1]["projected"] == pytest.approx(3.0 * 4.0 / 8.0)  # means over the twin's sets a and c
    assert got[0]["measured"] == 1.2
    out = tmp_path / "p.json"
    assert main(["--costs", costs, "--tau", tau, "--json", str(out)]) == 0
    cap = capsys.readouterr()
    text = cap.out
    assert "PROJECTION" in text and "twin.json" in text and "real.json" in text  # both sources named
    doc = json.loads(out.read_text())
    assert doc["rows"] == got and problems(doc["provenance"], ["costs", "tau"]) == []
    # the sources were written without provenance: said, and kept as None in the projection
    assert "cannot say where it ran" in cap.err and doc["sources"] == {"costs": None, "tau": None}
    assert project(json.loads(open(costs).read()), json.loads(open(tau).read()), "t0.7") == []


def test_projection_refuses_what_is_not_a_bench(tmp_path):
    from tfm_local.bench.project import main

    bad = tmp_path / "bad.json"
    bad.write_text("{\"rows\": []}")
    with pytest.raises(SystemExit, match="not a tfm-bench JSON"):
        main(["--costs", str(bad), "--tau", str(bad)])
    with pytest.raises(SystemExit, match="cannot read"):
        main(["--costs", str(tmp_path / "missing.json"), "--tau", str(bad)])
    only_plain = _bench(tmp_path / "plain.json", [_row("a", "plain", 0, 1.0, {"verify": 1.0})])
    assert main(["--costs", only_plain, "--tau", only_plain]) == 1
