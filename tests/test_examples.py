"""The scripts in examples/ run as a user runs them, on tiny synthetic models (real processes).

Each example is pointed at a tiny random qwen2 target (``tfm_local.testing.synth``) with the cache
(``$TFM_CACHE``) in a temporary folder, so nothing is downloaded: the Python API with the drafter
chosen by ``auto`` (a random one for this target), the openai client against a real ``tfm-serve``,
the conversion of a tiny random z-lab checkpoint, and the training pipeline at its tiny size.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny target deep enough for the trainer's default 5 feature layers (as tfm-train smoke's)."""
    from tfm_local.testing.synth import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("examples") / "target.gguf", n_layer=6, n_embd=64,
                             n_head=4, n_head_kv=2, n_ff=128, seed=11)


@pytest.fixture
def env(tmp_path):
    """The environment of a user's shell: the console scripts (tfm-chat, ...) of this Python on PATH,
    the cache under tmp_path."""
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
            "TFM_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}


def run(cmd, env, timeout=240, **extra_env):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env={**env, **extra_env})


def stats_line(stderr: str) -> str:
    """tfm-chat's stats line: ``[τ=… tok/s N tokens (…)]``."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[τ=") and "tok/s" in ln]
    assert lines, stderr
    return lines[-1]


def test_python_api(target, env, tmp_path):
    r = run([sys.executable, EXAMPLES / "python_api.py", "--target", target, "--max-tokens", MAX_TOKENS,
             "--prompt", "hello"], env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].strip(), r.stdout  # the streamed greedy answer
    summaries = [ln for ln in out if ln.startswith("stats: τ=")]
    assert len(summaries) == 2 and all(f" {MAX_TOKENS} tokens" in s and "tok/s" in s for s in summaries), r.stdout
    assert any(ln.startswith("tau (tokens per target pass): ") for ln in out)
    assert any(ln.startswith("decode speed: ") and "tokens/s" in ln for ln in out)
    sampled = out[out.index("sampled (temperature 0.8, seed 42):") + 1]
    assert sampled.strip()
    # --drafter defaults to auto: this target has no trained drafter, so a random one was made in the cache
    assert list((tmp_path / "cache" / "drafters").glob("random-*.gguf"))
    # plain decoding (--drafter none) gives the same greedy answer: the drafter only speeds it up
    plain = run([sys.executable, EXAMPLES / "python_api.py", "--target", target, "--max-tokens", MAX_TOKENS,
                 "--prompt", "hello", "--drafter", "none"], env)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[0] == out[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(target, env, tmp_path):
    """``tfm-serve`` on the tiny target on a free loopback port: yields its /v1 URL, then stops it."""
    yield from serve(target, env, tmp_path)


@pytest.fixture
def tools_server(env, tmp_path):
    """``tfm-serve`` (as ``server``) on a tiny target whose chat template renders tools as Qwen2.5's does."""
    from tfm_local.testing.synth import write_tiny_target

    from test_tool_calls import QWEN_STYLE_TEMPLATE

    target = write_tiny_target(tmp_path / "tools.gguf", n_layer=2, chat_template=QWEN_STYLE_TEMPLATE)
    yield from serve(target, env, tmp_path, n_ctx=2048)  # the tools fill a tiny vocabulary's context


def serve(target, env, tmp_path, n_ctx: int = 512):
    """The ``server`` fixtures' body: start tfm-serve on ``target``, yield its /v1 URL, stop it."""
    import httpx

    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target),
                             "--drafter", "random", "--n-ctx", str(n_ctx), "--port", str(port),
                             "--model-name", "tiny", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up: " + (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        yield url + "/v1"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "server.log").read_text()


def test_openai_client(server, env):
    pytest.importorskip("openai")
    r = run([sys.executable, EXAMPLES / "openai_client.py", "--base-url", server, "--max-tokens", MAX_TOKENS,
             "--prompt", "hello"], env)  # no --model: the first model the server lists
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].strip(), r.stdout  # the plain completion's text
    assert "finish_reason: length" in out
    usage = next(ln for ln in out if ln.startswith("usage: prompt_tokens="))
    assert f"completion_tokens={MAX_TOKENS} " in usage
    tfm = next(ln for ln in out if ln.startswith("usage.tfm: tau "))
    assert json.loads(tfm.split("; ", 1)[1])["verify_passes"] >= 1
    i = out.index("streamed (temperature 0.7, seed 1):")
    assert out[i + 1].strip() and out[i + 2] == f"usage: completion_tokens={MAX_TOKENS}", r.stdout
    # logprobs: a line per token of the answer with its log-probability and three alternatives
    tokens = [ln for ln in out[out.index("logprobs:"):] if ln.startswith("token ")]
    assert 1 <= len(tokens) <= MAX_TOKENS, r.stdout
    for ln in tokens:
        m = re.search(r": logprob (-?[0-9.]+) \(p ([0-9.]+)\); top 3: (.*)$", ln)
        assert m and float(m.group(1)) <= 0 and 0 <= float(m.group(2)) <= 1, ln
        assert len(re.findall(r" -?[0-9]+\.[0-9]{3}(?:, |$)", m.group(3))) == 3, ln  # three alternatives
    assert any(ln.startswith("with penalties: ") for ln in out)
    offsets = next(ln for ln in out if ln.startswith("text_offset (from the start of the prompt):"))
    assert offsets.split(": ", 1)[1].startswith(f"[{len('def reverse(s):')},"), offsets


def test_json_schema(server, env):
    pytest.importorskip("openai")
    r = run([sys.executable, EXAMPLES / "json_schema.py", "--base-url", server], env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert next(ln for ln in out if ln.startswith("json_schema (")).startswith("json_schema (stop): {"), r.stdout
    assert any(ln.startswith("parsed: ") for ln in out)
    assert any(ln.startswith("json_object (") for ln in out)
    assert "grammar: Answer: yes" in out or "grammar: Answer: no" in out, r.stdout
    assert any(ln.startswith("bad schema: 400 ") for ln in out), r.stdout


def test_tool_call(tools_server, env):
    pytest.importorskip("openai")
    r = run([sys.executable, EXAMPLES / "tool_call.py", "--base-url", tools_server], env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "finish_reason: tool_calls" in out, r.stdout
    call = next(ln for ln in out if ln.startswith("call: get_weather "))
    args = json.loads(call.split(" ", 2)[2])
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert any(ln.startswith("answer (") for ln in out)
    required = next(ln for ln in out if ln.startswith("required: "))
    assert required.split(" ")[1] in ("get_weather", "get_time")


def test_convert_drafter(target, env, tmp_path):
    import gguf
    from tfm_convert.pipeline import init_random

    ckpt = tmp_path / "zlab-drafter"
    init_random(target, hf_out=ckpt, layers=1, seed=5)  # a random drafter in the z-lab layout
    assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()
    out = tmp_path / "drafter.gguf"
    r = run(["bash", EXAMPLES / "convert_drafter.sh", ckpt, target, out], env, MAX_TOKENS=str(MAX_TOKENS),
            PROMPT="hello")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()  # tfm-chat's answer, decoded with the converted drafter
    assert f" {MAX_TOKENS} tokens" in stats_line(r.stderr)
    reader = gguf.GGUFReader(out)
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "dflash"
    assert any(t.tensor_type == gguf.GGMLQuantizationType.Q8_0 for t in reader.tensors)  # OUTTYPE default


def test_shell_examples_explain_their_usage(env, target, tmp_path):
    r = run(["bash", EXAMPLES / "convert_drafter.sh"], env)
    assert r.returncode == 2 and "convert_drafter.sh CHECKPOINT TARGET" in r.stderr
    r = run(["bash", EXAMPLES / "train_drafter.sh"], env)
    assert r.returncode == 2 and "train_drafter.sh TARGET [WORKDIR]" in r.stderr
    r = run(["bash", EXAMPLES / "train_drafter.sh", target, tmp_path / "w"], env, SIZE="huge")
    assert r.returncode == 2 and "SIZE must be tiny, small or full" in r.stderr and not (tmp_path / "w").exists()


def test_train_drafter(target, env, tmp_path):
    from tfm_local.files.datasets import DataNotFoundError, iter_sharegpt

    try:
        next(iter(iter_sharegpt(1)))
    except DataNotFoundError as exc:
        pytest.skip(str(exc))
    work = tmp_path / "work"
    r = run(["bash", EXAMPLES / "train_drafter.sh", target, work], env, timeout=300,
            MAX_TOKENS=str(MAX_TOKENS), PROMPT="hello")  # SIZE defaults to tiny
    assert r.returncode == 0, r.stderr[-4000:]
    assert (work / "prompts.npz").is_file() and (work / "run" / "checkpoint.pt").is_file()
    manifest = json.loads((work / "corpus" / "manifest.json").read_text())
    assert manifest["counts"]["sequences"] == 8
    log = [json.loads(ln) for ln in (work / "run" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 6 and all(math.isfinite(r["loss"]) for r in log)  # SIZE=tiny: 6 fit steps
    drafter = work / "export" / "drafter-q8_0.gguf"
    assert drafter.is_file() and f"drafter: {drafter}" in r.stderr
    assert r.stdout.strip()  # tfm-chat's answer with the trained drafter
    assert f" {MAX_TOKENS} tokens" in stats_line(r.stderr)
