"""tfm-chat and tfm-bench as a user runs them (real processes, tiny synthetic GGUFs)."""
import json
import subprocess
import sys

import pytest

from synth import write_tiny_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("cli")
    target = write_tiny_target(d / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, d / "d.gguf", seed=4)
    return target, drafter


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
    r = run("tfm_local.cli.bench", "--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k",
            "-n", "2", "--max-tokens", "8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "chain" in r.stdout and "plain" in r.stdout
    doc = json.loads(out.read_text())
    assert {row["mode"] for row in doc["summary"]} == {"plain", "chain"}
    plain = [x["output_ids"] for x in doc["runs"] if x["mode"] == "plain"]
    chain = [x["output_ids"] for x in doc["runs"] if x["mode"] == "chain"]
    assert plain == chain
