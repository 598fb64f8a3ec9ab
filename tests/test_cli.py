"""tfm-chat and tfm-bench as a user runs them (real processes, tiny synthetic GGUFs)."""
import json
import os
import subprocess
import sys

import pytest

from tfm_local.bench.provenance import problems


@pytest.fixture(scope="module")
def pair(tiny_pair):
    """The shared tiny (target, drafter) pair (conftest.tiny_pair)."""
    return tiny_pair


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("extra", [[], ["--no-draft"], ["--tree", "ddtree", "--budget", "12"]])
def test_chat_one_prompt(pair, extra):
    target, drafter = pair
    r = run("tfm_local.cli.chat", "--target", str(target), "--drafter", str(drafter), "--prompt", "hello",
            "--max-tokens", "12", *extra)
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stderr and "τ=" in r.stderr and " 12 tokens" in r.stderr


def test_chat_outputs_agree_across_modes(pair):
    target, drafter = pair
    outs = {run("tfm_local.cli.chat", "--target", str(target), "--drafter", str(drafter), "--prompt", "abc",
                "--max-tokens", "16", "--no-stats", *extra).stdout
            for extra in ([], ["--no-draft"], ["--tree", "ddtree"])}
    assert len(outs) == 1


@pytest.mark.parametrize("args,msg", [
    (["--target", "/no/such/file.gguf"], "not"),
    (["--temperature", "-1"], "temperature"),
    (["--budget", "-3"], "budget"),
])
def test_chat_bad_input_is_a_clear_error(pair, args, msg):
    target, drafter = pair
    base = ["--target", str(target), "--drafter", str(drafter), "--prompt", "x", "--max-tokens", "4"]
    r = run("tfm_local.cli.chat", *base, *args)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and msg in r.stderr.lower() and "Traceback" not in r.stderr


def test_bench_writes_table_and_json(pair, tmp_path):
    target, drafter = pair
    out = tmp_path / "b.json"
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "-n", "2", "--max-tokens", "8", "--modes", "plain,chain", "--no-plot", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "chain" in r.stdout and "plain" in r.stdout
    doc = json.loads(out.read_text())
    assert {row["mode"] for row in doc["summary"]} == {"plain", "chain"}
    plain = [x["output_ids"] for x in doc["runs"] if x["mode"] == "plain"]
    chain = [x["output_ids"] for x in doc["runs"] if x["mode"] == "chain"]
    assert plain == chain


def test_bench_samples_with_one_seed_per_prompt(pair, tmp_path):
    """--temperature > 0: every mode of a prompt draws with the same seed, so on the CPU (bitwise-equal
    logits on these tiny models) the chain and DDTree emit exactly plain decoding's sampled tokens; the
    near-tie check, which is about argmax picks, is not run."""
    target, drafter = pair
    out = tmp_path / "s.json"
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "-n", "2", "--max-tokens", "12", "--modes", "plain,chain,ddtree@4", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "5", "--no-plot", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["sampling"] == {"temperature": 0.9, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "seed": 5,
                               "frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0,
                               "repeat_last_n": 64, "grammar": None}
    runs = doc["runs"]
    assert all(x["sampled"] for x in runs)
    by = {(x["prompt_id"], x["mode"]): x["output_ids"] for x in runs}
    for pid in {x["prompt_id"] for x in runs}:
        assert by[(pid, "chain")] == by[(pid, "plain")] == by[(pid, "ddtree@4")]
    summary = {row["mode"]: row for row in doc["summary"]}
    assert summary["chain"]["mismatches"] == 0 and summary["chain"]["not_near_ties"] is None
    greedy = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
                 "-n", "2", "--max-tokens", "12", "--modes", "plain", "--no-plot", "--json", str(tmp_path / "g.json"))
    g = json.loads((tmp_path / "g.json").read_text())
    assert g["sampling"] is None and not any(x["sampled"] for x in g["runs"])
    assert [x["output_ids"] for x in g["runs"]] != [by[(x["prompt_id"], "plain")] for x in g["runs"]]
    assert greedy.returncode == 0


def test_bench_runs_several_samplings_side_by_side(pair, tmp_path):
    """--samplings: every mode under each setting, per prompt; speed-ups over plain with the same setting
    and over plain greedy; sampled speculative runs equal plain's with the same setting."""
    target, drafter = pair
    out = tmp_path / "m.json"
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "-n", "2", "--max-tokens", "10", "--modes", "plain,ddtree@4", "--samplings",
            "greedy;t=0.7,top_p=0.95;t=1", "--seed", "3", "--no-plot", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "plain t0.7 p0.95" in r.stdout and "x greedy" in r.stdout
    doc = json.loads(out.read_text())
    assert [s["label"] for s in doc["samplings"]] == ["greedy", "t0.7 p0.95", "t1"]
    rows = {(row["mode"], row["sampling"]): row for row in doc["summary"]}
    assert len(rows) == 6 and rows[("plain", "greedy")]["vs_greedy"] == 1.0
    assert rows[("ddtree@4", "t1")]["speedup"] > 0 and rows[("plain", "t1")]["speedup"] == 1.0
    by = {(x["prompt_id"], x["mode"], x["sampling"]): x["output_ids"] for x in doc["runs"]}
    for pid in {x["prompt_id"] for x in doc["runs"]}:
        for s in ("t0.7 p0.95", "t1"):
            assert by[(pid, "ddtree@4", s)] == by[(pid, "plain", s)]
    bad = run("tfm_local.bench.tfm_bench", "--target", str(target), "--sets", "gsm8k", "--no-draft", "--modes",
              "plain", "--samplings", "t=0.7,top_q=1", "--no-plot", "--json", str(tmp_path / "x.json"))
    assert bad.returncode == 2 and "top_q" in bad.stderr and "Traceback" not in bad.stderr


def test_an_interrupted_bench_keeps_its_finished_sets(pair, tmp_path, monkeypatch):
    """After each prompt set but the last the JSON is written (atomically), marked incomplete: a run
    stopped in its second set keeps the first one's rows and runs."""
    from tfm_local.bench import tfm_bench as bench

    target, drafter = pair
    real, calls = bench.run_checked, []

    def stop_in_the_second_set(engine, prompt, mode, max_tokens, sp=None):
        calls.append(prompt.id)
        if len(calls) > 2:  # gsm8k: one prompt in two modes; then the first humaneval run
            raise KeyboardInterrupt
        return real(engine, prompt, mode, max_tokens, sp)

    monkeypatch.setattr(bench, "run_checked", stop_in_the_second_set)
    out = tmp_path / "b.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k,humaneval", "-n", "1",
                    "--max-tokens", "4", "--modes", "plain,chain", "--warmup-tokens", "0", "--no-plot",
                    "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["sets_done"] == ["gsm8k"] and len(calls) == 3
    assert [(r["set"], r["mode"]) for r in doc["summary"]] == [("gsm8k", "plain"), ("gsm8k", "chain")]
    assert {r["set"] for r in doc["runs"]} == {"gsm8k"} and not (tmp_path / "b.json.part").exists()


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text,want", [
    ("plain", [("plain", "chain", 0)]),
    ("chain,auto", [("chain", "chain", None), ("auto", "chain", "auto")]),
    ("chain@8, ddtree@16,wide@4,ddtree@auto", [("chain@8", "chain", 8), ("ddtree@16", "ddtree", 16),
                                               ("wide@4", "wide", 4), ("ddtree@auto", "ddtree", "auto")]),
    ("lattice@8,lattice@auto", [("lattice@8", "lattice", 8), ("lattice@auto", "lattice", "auto")]),
])
def test_bench_parse_modes(text, want):
    from tfm_local.bench.tfm_bench import parse_modes

    assert [tuple(m) for m in parse_modes(text)] == want


@pytest.mark.parametrize("text", ["", "fast", "ddtree", "ddtree@0", "ddtree@-2", "ddtree@x", "tree@4",
                                  "plain,plain"])
def test_bench_parse_modes_rejects(text):
    from tfm_local.bench.tfm_bench import parse_modes

    with pytest.raises(ValueError):
        parse_modes(text)


@pytest.mark.parametrize("args,msg", [
    (["--modes", "plain,ddtree@zero"], "unknown mode"),
    (["--budget", "4"], "--modes"),
    (["--no-draft", "--modes", "plain,chain"], "need a drafter"),
    (["--modes", "plain,chain,lattice@4"], "mode lattice@4: tree=\"lattice\" needs a DFlash2 drafter"),
    (["--modes", "plain,dartree@4"], "mode dartree@4: tree=\"dartree\" needs"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
])
def test_bench_bad_input_is_a_clear_error(pair, tmp_path, args, msg):
    target, drafter = pair
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "-n", "1", "--max-tokens", "4", "--json", str(tmp_path / "b.json"), *args)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and msg in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b.json").exists()


@pytest.fixture(scope="module")
def bench_run(pair, tmp_path_factory):
    """One bench run over four modes: (process result, JSON path, PNG path)."""
    target, drafter = pair
    out = tmp_path_factory.mktemp("bench") / "modes.json"
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "--modes", "plain,chain,ddtree@4,auto", "-n", "1", "--max-tokens", "8", "--json", str(out))
    return r, out, out.with_suffix(".png")


def test_bench_modes_table(bench_run):
    r, _, _ = bench_run
    assert r.returncode == 0, r.stderr
    main, phases = r.stdout.split("\n\n")
    lines = main.splitlines()
    assert lines[0].split() == ["set", "mode", "budget", "prompts", "tokens", "tau", "tok/s", "speedup",
                                "e2e", "x", "greedy", "mismatches", "(not", "ties)"]
    rows = {ln.split()[1]: ln.split() for ln in lines[1:]}
    assert set(rows) == {"plain", "chain", "ddtree@4", "auto"}
    assert rows["plain"][-4:] == ["1.00x", "1.00x", "1.00x", "-"]
    assert rows["ddtree@4"][2] == "4" and rows["auto"][2] == "auto"
    assert all(rows[m][-2:] == ["0", "(0)"] for m in ("chain", "ddtree@4", "auto"))
    plines = phases.splitlines()
    assert plines[0].split() == ["ms", "per", "step", "drafter", "tree", "submit", "verify", "accept", "other",
                                 "total"]
    cols = plines[0].split()[3:]
    split = {ln.split()[1]: dict(zip(cols, map(float, ln.split()[2:]))) for ln in plines[1:]}
    assert set(split) == set(rows) and split["plain"]["drafter"] == split["plain"]["tree"] == 0.0
    assert split["ddtree@4"]["drafter"] > 0
    # seven values printed to 2 decimals: the sum of six rounded parts may miss the rounded total by 0.035
    for v in split.values():
        assert abs(sum(v[c] for c in cols[:-1]) - v["total"]) <= 0.0351 and v["verify"] > 0 and v["submit"] > 0, v


def test_bench_modes_json(bench_run):
    r, out, _ = bench_run
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert {"command", "argv", "date", "machine", "target", "drafter", "summary", "runs"} <= set(doc)
    assert doc["complete"] is True and "sets_done" not in doc
    assert "--modes" in doc["argv"] and "plain,chain,ddtree@4,auto" in doc["command"]
    assert isinstance(doc["machine"]["gpu"], bool) and doc["machine"]["threads"] >= 1
    assert problems(doc["provenance"], ["target", "drafter"]) == []
    summary = {row["mode"]: row for row in doc["summary"]}
    assert [row["mode"] for row in doc["summary"]] == ["plain", "chain", "ddtree@4", "auto"]
    assert summary["ddtree@4"]["tree"] == "ddtree" and summary["ddtree@4"]["budget"] == 4
    assert summary["auto"]["budget"] == "auto" and summary["auto"]["budget_max"] >= 1
    assert summary["chain"]["budget"] == summary["chain"]["budget_max"] >= 1  # clamped to block size - 1
    assert summary["plain"]["mismatches"] is None and summary["plain"]["speedup"] == 1.0
    for m in ("chain", "ddtree@4", "auto"):
        assert summary[m]["mismatches"] == 0 and summary[m]["n_generated"] == 8
        assert {"tau", "tokens_per_s", "speedup", "n_prompts"} <= set(summary[m])
        assert set(summary[m]["ms_per_step"]) == {"drafter", "tree", "submit", "verify", "accept", "other"}
    runs = {x["mode"]: x for x in doc["runs"]}
    assert all(runs[m]["output_ids"] == runs["plain"]["output_ids"] for m in runs)
    assert runs["ddtree@4"]["matches_plain"] is True and runs["ddtree@4"]["n_spec_steps"] > 0


def test_bench_writes_png(bench_run):
    r, _, png = bench_run
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bench_plot_only_redraws(bench_run, tmp_path):
    _, out, _ = bench_run
    png = tmp_path / "again.png"
    r = run("tfm_local.bench.tfm_bench", "--plot-only", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC
    r = run("tfm_local.bench.tfm_bench", "--plot-only", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    other = tmp_path / "gdn.json"
    other.write_text('{"cases": []}')
    r = run("tfm_local.bench.tfm_bench", "--plot-only", str(other))
    assert r.returncode == 2 and "is not a tfm-bench JSON" in r.stderr


def test_bench_without_matplotlib_warns(pair, tmp_path):
    target, drafter = pair
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    out = tmp_path / "b.json"
    r = run("tfm_local.bench.tfm_bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "--modes", "plain", "-n", "1", "--max-tokens", "4", "--json", str(out),
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), *sys.path])})
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["summary"] and not out.with_suffix(".png").exists()
    assert "warning: matplotlib" in r.stderr


def test_write_json_is_atomic(tmp_path):
    """common.write_json replaces the file whole; a document that cannot be written leaves the old one."""
    from tfm_local.cli.common import write_json

    out = tmp_path / "r.json"
    write_json(out, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        write_json(out, {"a": object()})
    assert json.loads(out.read_text()) == {"a": 1} and not (tmp_path / "r.json.part").exists()
    write_json(str(out), {"b": [1, 2]})
    assert json.loads(out.read_text()) == {"b": [1, 2]}


@pytest.mark.parametrize("name", ["a" * 250 + ".json", "\u00e9" * 125 + ".json"])
def test_a_name_of_255_bytes_is_written_atomically(tmp_path, name):
    """The longest name a file system takes (255 bytes, here in ASCII and in two-byte UTF-8) is written:
    the temporary file beside it has a short name of its own (it was ``.NAME.PID.tmp``, 8 bytes or more
    past the limit: ENAMETOOLONG). Two writes of one path at once get two temporary files; a failed
    write leaves none."""
    import os

    from tfm_local.files.atomic import atomic_output, write_json, write_text

    assert len(name.encode()) == 255
    out = tmp_path / name
    write_json(out, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}
    write_text(out, "x\n", mode=0o600)
    assert out.read_text() == "x\n" and out.stat().st_mode & 0o777 == 0o600
    with atomic_output(out) as t1, atomic_output(out) as t2:
        assert t1 != t2 and t1.parent == t2.parent == tmp_path and t1.name.startswith(".")
        assert len(t1.name.encode()) <= 64 and len(t2.name) == len(t1.name)
        t1.write_text("one")
        t2.write_text("two")
    assert out.read_text() == "one"  # the outer body returned last
    with pytest.raises(ValueError), atomic_output(out) as t:
        t.write_text("half")
        raise ValueError("stopped")
    assert out.read_text() == "one" and os.listdir(tmp_path) == [name]


def test_bench_replay_counts_the_bench_chain(bench_run, pair, tmp_path):
    """tfm-bench replay on tfm-bench's own JSON, same drafter: the chain's steps and tokens of the run;
    a missing file or set is a clear error."""
    _, out, _ = bench_run
    _, drafter = pair
    rj = tmp_path / "replay.json"
    r = run("tfm_local.bench.replay_cli", "--from", str(out), "--drafter", str(drafter), "--json", str(rj))
    assert r.returncode == 0, r.stderr
    chain = [x for x in json.loads(out.read_text())["runs"] if x["mode"] == "chain"]
    got = json.loads(rj.read_text())
    assert [(x["prompt_id"], x["n_steps"], x["n_step_tokens"]) for x in got["runs"]] == \
        [(x["prompt_id"], x["n_steps"], x["n_step_tokens"]) for x in chain]
    assert got["summary"][0]["set"] == "gsm8k" and "gsm8k" in r.stdout.splitlines()[1]
    assert problems(got["provenance"], ["from", "target", "drafter"]) == []
    bad = run("tfm_local.bench.replay_cli", "--from", str(tmp_path / "none.json"), "--drafter", str(drafter))
    assert bad.returncode == 2 and "cannot use --from" in bad.stderr and "Traceback" not in bad.stderr
    bad = run("tfm_local.bench.replay_cli", "--from", str(out), "--drafter", str(drafter), "--sets", "humaneval")
    assert bad.returncode == 2 and "no recorded outputs for humaneval" in bad.stderr
    bad = run("tfm_local.bench.replay_cli", "--from", str(out), "--drafter", str(drafter), str(tmp_path / "no.gguf"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "no.gguf" in bad.stderr


def test_modes_run_in_an_order_rotated_per_prompt():
    """Every mode runs first (and right after each other mode) equally often over a set."""
    from tfm_local.bench.tfm_bench import mode_order, parse_modes

    modes = parse_modes("plain,auto,ddtree@auto")
    orders = [[m.label for m in mode_order(modes, i)] for i in range(6)]
    assert orders[0] == ["plain", "auto", "ddtree@auto"] and orders[1] == ["auto", "ddtree@auto", "plain"]
    assert all(sorted(o) == sorted(orders[0]) for o in orders)
    assert [o[0] for o in orders].count("plain") == 2 and [o[0] for o in orders].count("auto") == 2
    assert mode_order([], 3) == []
