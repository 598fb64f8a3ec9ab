"""tfm-serve as a client sees it: a real server process on loopback, the official ``openai`` client, httpx.

The server runs ``python -m tfm_local.cli.serve`` on tiny synthetic GGUFs (a
random qwen2 target with a ChatML template, tfm_local/testing/synth.py, and a random
DFlash drafter). Answers at temperature 0 are compared with an Engine run in
this process on the same files: the HTTP layer must not change a token.
"""
import json
import signal
import socket
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")


from tfm_local.engine import Engine  # noqa: E402
from tfm_local.server.schemas import MAX_TOKENS  # noqa: E402

MODEL = "tiny"
N_CTX = 2048  # long enough that a full-context answer outlasts a client's disconnect
RSS_GROWTH_BOUND_MB = 50
CHAT_PROMPTS = ["hello", "the quick brown fox", "def hello(): return 42", "a small model for a small test"]


@pytest.fixture(scope="module")
def models(tiny_pair):
    """The shared tiny (target, drafter) pair (conftest.tiny_pair)."""
    return tiny_pair


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A tfm-serve subprocess on a free loopback port; ``stop()`` ends it."""

    def __init__(self, models, log_path, *extra):
        target, drafter = models
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--drafter", str(drafter),
             "--n-ctx", str(N_CTX), "--port", str(self.port), "--model-name", MODEL, "--log-level", "warning",
             *extra], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited: {self.log_text()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server did not come up: {self.log_text()}")

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def wait_idle(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["busy"]:
                return h
            time.sleep(0.05)
        raise AssertionError("server still busy")

    def stop(self) -> int:
        """SIGTERM (or SIGKILL after 15 s); the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    s = Server(models, tmp_path_factory.mktemp("log") / "server.log")
    yield s
    assert s.stop() == 0, s.log_text()
    assert "Traceback" not in s.log_text(), s.log_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engine(models):
    target, drafter = models
    e = Engine(target, drafter, n_ctx=N_CTX)
    yield e
    e.close()


def chat_msgs(text: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def post(server, path: str, **kw) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kw)


# -- basics ------------------------------------------------------------------------------
def test_health_and_models(server, client):
    assert server.health()["status"] == "ok"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_chat_matches_engine(client, engine):
    texts = []
    for p in CHAT_PROMPTS:
        r = client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_tokens=24, temperature=0)
        want = engine.generate(chat_msgs(p), max_tokens=24, temperature=0)
        choice = r.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == want
        assert choice.finish_reason == engine.stats.finish_reason
        assert r.usage.prompt_tokens == len(engine.prompt_tokens(chat_msgs(p)))
        assert r.usage.completion_tokens == engine.stats.n_generated
        texts.append(want)
    assert any(texts), "every reference answer is empty: the comparison would prove nothing"


def test_completion_matches_engine_and_usage(client, engine):
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=40, temperature=0)
    want = engine.generate("hello world", max_tokens=40, temperature=0)
    assert want and r.choices[0].text == want
    assert r.choices[0].finish_reason == engine.stats.finish_reason == "length"
    u = r.usage
    assert u.prompt_tokens == len(engine.prompt_tokens("hello world"))
    assert u.completion_tokens == 40 and u.total_tokens == u.prompt_tokens + 40
    tfm = u.model_extra["tfm"]
    assert {"tau", "tokens_per_s", "prefill_s", "draft_s", "verify_s", "budget", "tree"} <= set(tfm)
    assert tfm["budget"] == "auto" and tfm["tau"] >= 1.0 and tfm["tokens_per_s"] > 0


@pytest.fixture(scope="module")
def fixed_client(models, tmp_path_factory):
    """A server with a fixed budget of 3: every generation captures its prompt's features for the drafter.
    (Under the automatic budget a generation that decodes plainly from its first step captures none, and
    the next one that drafts keeps of the target's cache only what the drafter holds features of: how
    much is cached then depends on the budget's measured costs, not only on the prompts.)"""
    s = Server(models, tmp_path_factory.mktemp("fixed") / "server.log", "--budget", "3")
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert s.stop() == 0, s.log_text()


def test_repeated_requests_report_cached_tokens(fixed_client, engine):
    """The prompt cache across requests (one slot): a repeated request keeps all its prompt tokens but the
    last, a follow-up turn at least the earlier prompt, another conversation only the tokens it shares
    with the cached one; ``usage.prompt_tokens_details.cached_tokens`` says so, streamed or not, chat and
    completions, and the answers are the engine's."""
    client = fixed_client
    msgs = chat_msgs(CHAT_PROMPTS[3])
    ids = engine.prompt_tokens(msgs)
    want = engine.generate(msgs, max_tokens=12, temperature=0)
    for _ in range(2):
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
        assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(ids) and r.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    follow = msgs + [{"role": "assistant", "content": want}, {"role": "user", "content": "and then?"}]
    r = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == engine.generate(follow, max_tokens=8, temperature=0)
    assert len(ids) - 1 <= r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
    other = [{"role": "system", "content": "answer at length"}, {"role": "user", "content": "why"}]
    shared = next(i for i, (a, b) in enumerate(zip(engine.prompt_tokens(follow), engine.prompt_tokens(other)))
                  if a != b)
    assert shared < len(ids) - 1  # another conversation: it parts from the cached one within the prompt
    r = client.chat.completions.create(model=MODEL, messages=other, max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == shared
    n = len(engine.prompt_tokens("hello world"))
    for stream in (False, True):
        for _ in range(2):
            r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=6, temperature=0,
                                          stream=stream, **({"stream_options": {"include_usage": True}}
                                                            if stream else {}))
            usage = list(r)[-1].usage if stream else r.usage
        assert usage.prompt_tokens == n and usage.prompt_tokens_details.cached_tokens == n - 1


def test_no_prompt_cache_flag(models, tmp_path):
    """tfm-serve --no-prompt-cache: a repeated request is prefilled whole (0 cached tokens)."""
    s = Server(models, tmp_path / "nocache.log", "--no-prompt-cache")
    try:
        body = {"model": MODEL, "prompt": "hello world", "max_tokens": 4, "temperature": 0}
        for _ in range(2):
            r = post(s, "/v1/completions", json=body)
            assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    finally:
        assert s.stop() == 0, s.log_text()


def test_completion_default_max_tokens_is_16(client):
    r = client.completions.create(model=MODEL, prompt="hello", temperature=0)
    assert r.usage.completion_tokens == 16


def test_chat_streaming_equals_non_streaming(client):
    for p in CHAT_PROMPTS[:2]:
        full = client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_completion_tokens=30,
                                              temperature=0)
        chunks = list(client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_completion_tokens=30,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == full.choices[0].message.content
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [full.choices[0].finish_reason]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert all(c.usage is None for c in chunks[:-1])


def test_completion_streaming_raw_sse(server, client):
    """The wire format: ``data: {json}`` events, a finish chunk, ``data: [DONE]`` last; no usage unless asked."""
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("usage" not in e for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    full = client.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=0)
    assert "".join(e["choices"][0]["text"] for e in events) == full.choices[0].text


def test_stop_strings(client, engine):
    full = engine.generate("hello world", max_tokens=40, temperature=0)
    assert len(full) > 8
    stop = full[4:6]
    want = full[:full.index(stop)]
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=40, temperature=0, stop=stop)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=40, temperature=0,
                                  stop=["\x00never", stop], stream=True)
    parts = list(r)
    assert "".join(c.choices[0].text for c in parts) == want
    assert parts[-1].choices[0].finish_reason == "stop"


def test_sampling_is_seeded(client):
    kw = dict(model=MODEL, prompt="the quick", max_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    greedy = client.completions.create(model=MODEL, prompt="the quick", max_tokens=16, temperature=0)
    nucleus0 = client.completions.create(model=MODEL, prompt="the quick", max_tokens=16, temperature=1.0, top_p=0)
    assert nucleus0.choices[0].text == greedy.choices[0].text


# -- errors ------------------------------------------------------------------------------
def assert_error(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 4}


@pytest.mark.parametrize("raw", [b"{", b"", b"[1, 2]", b"null", b'{"model": "tiny", "messages": [}', b"\xff\xfe"])
def test_malformed_json(server, raw):
    assert_error(post(server, "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}),
                 400, code="invalid_json")


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "stop": [1]}, "stop"),
    ("/v1/chat/completions", {**CHAT, "seed": "x"}, "seed"),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model"),
    ("/v1/completions", {**COMPLETION, "prompt": 5}, "prompt"),
    ("/v1/completions", {"model": MODEL}, "prompt"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_wrong_field_types(server, path, body, param):
    assert_error(post(server, path, json=body), 400, param=param)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p"])
@pytest.mark.parametrize("value", [b"NaN", b"Infinity"])
def test_non_finite_sampling_values(server, field, value):
    """Python's JSON reads NaN / Infinity: they are refused as not finite (not as out of range)."""
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (
        MODEL.encode(), field.encode(), value)
    err = assert_error(post(server, "/v1/chat/completions", content=raw,
                            headers={"Content-Type": "application/json"}), 400, param=field)
    assert "finite" in err["message"], err


NULLABLE = ["stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
            "min_p", "seed", "stop", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
            "logit_bias", "response_format", "tools", "tool_choice", "user", "metadata"]


def test_null_means_not_given(server):
    """OpenAI's API takes an explicit null for an optional field as the field left out."""
    r = post(server, "/v1/chat/completions", json={**CHAT, **dict.fromkeys(NULLABLE), "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4, r.text
    msgs = [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": None},
            {"role": "user", "content": [{"type": "text", "text": "yo"}]}]
    r = post(server, "/v1/chat/completions", json={**CHAT, "messages": msgs, "stream": None,
                                                    "stream_options": {"include_usage": None}})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
    r = post(server, "/v1/completions", json={**COMPLETION, **dict.fromkeys(NULLABLE), "max_tokens": 4})
    assert r.status_code == 200 and ran_to(r.json(), 4), r.text
    r = post(server, "/v1/completions", json={**COMPLETION, "max_tokens": None})
    assert ran_to(r.json(), 16), r.text  # the default, as when left out


def ran_to(body: dict, limit: int) -> bool:
    """A completion stopped by its token limit ``limit``, or by the end-of-generation token before it
    (sampled at the server's default temperature with a random seed, the tiny model may end early)."""
    n, why = body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]
    return (why == "length" and n == limit) or (why == "stop" and n < limit)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "model": None}, "model"),
    ("/v1/chat/completions", {**CHAT, "messages": None}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": None, "content": "x"}]}, "messages[0].role"),
    ("/v1/completions", {**COMPLETION, "prompt": None}, "prompt"),
])
def test_null_for_a_required_field(server, path, body, param):
    assert_error(post(server, path, json=body), 400, param=param)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_max_tokens(server, field, value):
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, field: value}), 400, param=field)


def prompt_leaving(engine, room: int, chat: bool) -> tuple:
    """A prompt (text, or one user message) that leaves ``room`` tokens or a few more of the context,
    and its token count."""
    words = ["hello", "world"] * N_CTX
    while True:
        text = " ".join(words)
        prompt = [{"role": "user", "content": text}] if chat else text
        n = len(engine.prompt_tokens(prompt))
        if n <= N_CTX - room:
            return prompt, n
        del words[-max(1, (n - N_CTX + room) // 2):]


@pytest.mark.parametrize("path,field", [("/v1/chat/completions", "max_tokens"),
                                        ("/v1/chat/completions", "max_completion_tokens"),
                                        ("/v1/completions", "max_tokens")])
def test_max_tokens_beyond_the_context_is_capped(server, engine, path, field):
    """As llama.cpp's server and Ollama do: the answer stops at the end of the context, finish_reason "length"."""
    chat = "chat" in path
    prompt, n_prompt = prompt_leaving(engine, 12, chat)
    room = N_CTX - n_prompt
    want = engine.generate(prompt, max_tokens=room, temperature=0)
    assert engine.stats.finish_reason == "length" and engine.stats.n_generated == room
    body = {"model": MODEL, "messages" if chat else "prompt": prompt, field: N_CTX, "temperature": 0}
    r = post(server, path, json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["message"]["content"] if chat else choice["text"]) == want
    assert choice["finish_reason"] == "length"
    usage = r.json()["usage"]
    assert usage | {"tfm": None, "prompt_tokens_details": None} == {
        "prompt_tokens": n_prompt, "completion_tokens": room, "total_tokens": N_CTX, "tfm": None,
        "prompt_tokens_details": None}
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < n_prompt


@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_absurd_max_tokens(server, path, base):
    """Over MAX_TOKENS (far beyond any context) max_tokens is a 400, whatever the context."""
    for value in (MAX_TOKENS + 1, 10 ** 30):
        assert_error(post(server, path, json={**base, "max_tokens": value}), 400, param="max_tokens")


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_the_context(server, stream):
    long = "hello world " * N_CTX
    assert_error(post(server, "/v1/completions", json={**COMPLETION, "prompt": long, "stream": stream}), 400,
                 param="prompt", code="context_length_exceeded")
    msgs = [{"role": "user", "content": long}]
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, "messages": msgs, "stream": stream}), 400,
                 param="messages", code="context_length_exceeded")


def long_conversation(engine, n_ctx: int) -> list[dict]:
    """A system prompt and whole turns adding up to more than ``n_ctx`` tokens, then a last question."""
    msgs = [{"role": "system", "content": "be brief"}]
    while len(engine.prompt_tokens(msgs)) <= n_ctx:
        i = len(msgs) // 2
        msgs += [{"role": "user", "content": f"question {i}: " + "tell me more " * 40},
                 {"role": "assistant", "content": "the answer is " * 30}]
    return msgs + [{"role": "user", "content": "and now?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_conversation_past_the_context_loses_its_oldest_turns(server, engine, stream):
    """The fewest oldest turns are left out, whole, so that the rest leaves max_tokens for the answer; the
    system prompt stays; the answer says how many messages were left out (header and usage.tfm)."""
    msgs, max_tokens = long_conversation(engine, N_CTX), 8
    k = next(k for k in range(2, len(msgs), 2)  # messages left out, one turn (user + assistant) at a time
             if len(engine.prompt_tokens(msgs[:1] + msgs[1 + k:])) + max_tokens <= N_CTX)
    want = engine.generate(msgs[:1] + msgs[1 + k:], max_tokens=max_tokens, temperature=0)
    body = {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})}
    if stream:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            events = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        usage = events[-1]["usage"]
    else:
        r = post(server, "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        text, usage = r.json()["choices"][0]["message"]["content"], r.json()["usage"]
    assert r.headers["x-tfm-dropped-messages"] == str(k) and usage["tfm"]["dropped_messages"] == k
    assert text == want and usage["prompt_tokens"] == len(engine.prompt_tokens(msgs[:1] + msgs[1 + k:]))
    short = post(server, "/v1/chat/completions", json=CHAT)
    assert "x-tfm-dropped-messages" not in short.headers and short.json()["usage"]["tfm"]["dropped_messages"] == 0


def test_a_last_turn_over_the_context_is_refused(server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "hello world " * N_CTX}]
    err = assert_error(post(server, "/v1/chat/completions", json={**CHAT, "messages": msgs}), 400,
                       param="messages", code="context_length_exceeded")
    assert "the last turn" in err["message"]


def test_no_truncate_refuses_a_conversation_past_the_context(models, engine, tmp_path):
    s = Server(models, tmp_path / "no-truncate.log", "--no-truncate")
    try:
        msgs = long_conversation(engine, N_CTX)
        err = assert_error(post(s, "/v1/chat/completions", json={**CHAT, "messages": msgs}), 400,
                           param="messages", code="context_length_exceeded")
        assert "--no-truncate" in err["message"]
        r = post(s, "/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and "x-tfm-dropped-messages" not in r.headers
    finally:
        assert s.stop() == 0, s.log_text()


def test_unknown_model(server, client):
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, "model": "gpt-4o"}), 404, param="model",
                 code="model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_empty_messages_and_bad_roles(server, client):
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, "messages": []}), 400, param="messages")
    bad = [{"role": "robot", "content": "x"}]
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, "messages": bad}), 400,
                 param="messages[0].role")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}], max_tokens=2)


@pytest.mark.parametrize("field,value", [("n", 2), ("logit_bias", {"5": 1.0}), ("best_of", 2)])
def test_unsupported_parameters_are_refused(server, field, value):
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, field: value}), 400, param=field,
                 code="unsupported_parameter")
    assert post(server, "/v1/chat/completions", json={**CHAT, "n": 1, "presence_penalty": 0.0}).status_code == 200


def test_response_format_of_an_unknown_type_is_refused(server):
    """json_object and json_schema are served (test_structured_outputs); another type is a 400."""
    assert_error(post(server, "/v1/chat/completions", json={**CHAT, "response_format": {"type": "yaml"}}), 400,
                 param="response_format.type", code="invalid_value")


# -- tools: no function calling, tool messages through a template that renders them -------
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_HISTORY = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
#: What the chat template gets for TOOL_HISTORY: the call's arguments as an object, as Hugging Face templates expect.
TOOL_HISTORY_RENDERED = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}]
#: A ChatML template that renders tool calls and tool results (the tiny model's own template has no tool use).
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tool_choice_none_or_auto_without_tool_calls(client, engine):
    """tool_choice "none"/"auto" without tools, or tools with tool_choice "none" (ignored): a plain text answer."""
    want = engine.generate(chat_msgs("hello"), max_tokens=8, temperature=0)
    for extra in ({"tool_choice": "none"}, {"tool_choice": "auto"}, {"tools": TOOLS, "tool_choice": "none"},
                  {"functions": [TOOLS[0]["function"]], "function_call": "none"}, {"parallel_tool_calls": False}):
        r = client.chat.completions.create(model=MODEL, messages=chat_msgs("hello"), max_tokens=8, temperature=0,
                                           **extra)
        assert r.choices[0].message.content == want and r.choices[0].message.tool_calls is None, extra


@pytest.mark.parametrize("extra,param", [
    ({"tools": TOOLS}, "tools"), ({"tools": TOOLS, "tool_choice": "auto"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"functions": [TOOLS[0]["function"]]}, "functions")])
def test_function_calling_is_refused(server, extra, param):
    err = assert_error(post(server, "/v1/chat/completions", json={**CHAT, **extra}), 400, param=param,
                       code="unsupported_parameter")
    assert "function calling" in err["message"] and "tool_choice" in err["message"]


def test_tool_messages_need_a_template_that_renders_them(server):
    """The tiny model's ChatML template has no tool use: tool results and tool calls are a 400, not dropped."""
    for msgs, param in ((TOOL_HISTORY[:2], "messages[1].tool_calls"),
                        ([TOOL_HISTORY[0], TOOL_HISTORY[2]], "messages[1].role")):
        err = assert_error(post(server, "/v1/chat/completions", json={**CHAT, "messages": msgs}), 400, param=param,
                           code="unsupported_value")
        assert "chat template" in err["message"]


def test_tool_messages_through_a_template_that_renders_them(models, tmp_path):
    from tfm_local.testing.synth import write_tiny_target

    target = write_tiny_target(tmp_path / "tools.gguf", n_layer=1, chat_template=TOOL_TEMPLATE)
    s = Server((target, models[1]), tmp_path / "tools.log", "--no-draft")
    e = Engine(target, None, n_ctx=N_CTX)
    try:
        want = e.generate(TOOL_HISTORY_RENDERED, max_tokens=8, temperature=0)
        r = post(s, "/v1/chat/completions", json={"model": MODEL, "messages": TOOL_HISTORY, "max_tokens": 8,
                                                  "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(e.prompt_tokens(TOOL_HISTORY_RENDERED))
        assert r.json()["choices"][0]["message"]["content"] == want
        bad = [{"role": "user", "content": "x", "tool_calls": [CALL]}]
        assert_error(post(s, "/v1/chat/completions", json={**CHAT, "messages": bad}), 400,
                     param="messages[0].tool_calls", code="invalid_value")
    finally:
        e.close()
        s.stop()
    assert "Traceback" not in s.log_text()


def test_empty_prompt(server):
    assert_error(post(server, "/v1/completions", json={**COMPLETION, "prompt": ""}), 400, param="prompt")


def test_unknown_path_and_method(server):
    assert_error(httpx.get(server.url + "/v1/nothing", timeout=10), 404)
    assert_error(httpx.get(server.url + "/v1/chat/completions", timeout=10), 405)


def peak_rss_growth_mb(server, action) -> float:
    """How far ``action()`` raises the server's peak RSS (VmHWM, reset first), in MB."""
    with open(f"/proc/{server.proc.pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = server.rss_kb()
    action()
    with open(f"/proc/{server.proc.pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return (peak - before) / 1024


BIG = 50 << 20  # 50 MB: far over the default limit (4 MiB)


def test_oversized_body_is_refused_without_reading_it(server):
    """A 50 MB body, announced (Content-Length) or chunked: a 413 error body, and the server's peak memory
    does not grow by anything like the body's size."""
    head, tail = b'{"model": "tiny", "prompt": "', b'"}'

    def chunked():
        yield head
        for _ in range(BIG >> 20):
            yield b"a" * (1 << 20)
        yield tail

    def send_both():
        for content in (head + b"a" * BIG + tail, chunked()):
            assert_error(post(server, "/v1/completions", content=content), 413, code="request_too_large")

    growth = peak_rss_growth_mb(server, send_both)
    assert growth < 20, f"peak RSS grew by {growth:.0f} MB for a refused 50 MB body"
    assert post(server, "/v1/completions", json=COMPLETION).status_code == 200  # keeps serving


def test_server_keeps_serving_after_errors(server, client, engine):
    for raw in (b"{", b"[]"):
        post(server, "/v1/completions", content=raw)
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=10, temperature=0)
    assert r.choices[0].text == engine.generate("hello world", max_tokens=10, temperature=0)


# -- load --------------------------------------------------------------------------------
def test_200_requests_in_a_row_without_memory_growth(server, client):
    def one(i: int) -> None:
        p = CHAT_PROMPTS[i % len(CHAT_PROMPTS)]
        if i % 4 == 0:
            r = client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_tokens=6, temperature=0)
            assert r.choices[0].finish_reason in ("stop", "length")
        elif i % 4 == 1:
            r = client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0.8, seed=i)
            assert r.usage.completion_tokens == 6
        elif i % 4 == 2:
            chunks = list(client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_tokens=6,
                                                         temperature=0, stream=True))
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        else:
            chunks = list(client.completions.create(model=MODEL, prompt=p, max_tokens=6, stream=True))  # sampled
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")

    for i in range(20):  # warm-up: allocator pools, pydantic and template caches
        one(i)
    before = server.rss_kb()
    for i in range(200):
        one(i)
    growth_mb = (server.rss_kb() - before) / 1024
    print(f"server RSS {before / 1024:.1f} MB, growth over 200 requests {growth_mb:+.1f} MB")
    assert growth_mb < RSS_GROWTH_BOUND_MB, f"server RSS grew by {growth_mb:.1f} MB over 200 requests"


def test_8_concurrent_clients(server, engine):
    """Eight clients at once: all succeed, and every answer is the one a lone request gets (no interleaving)."""
    want = {p: engine.generate(chat_msgs(p), max_tokens=16, temperature=0) for p in CHAT_PROMPTS}

    def worker(k: int) -> list[str]:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        errors = []
        for j in range(4):
            p = CHAT_PROMPTS[(k + j) % len(CHAT_PROMPTS)]
            if (k + j) % 2:
                got = c.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_tokens=16,
                                                temperature=0).choices[0].message.content
            else:
                got = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                    model=MODEL, messages=chat_msgs(p), max_tokens=16, temperature=0, stream=True))
            if got != want[p]:
                errors.append(f"client {k} request {j}: {got!r} != {want[p]!r}")
        return errors

    with ThreadPoolExecutor(8) as pool:
        errors = [e for errs in pool.map(worker, range(8)) for e in errs]
    assert not errors, errors
    assert not server.wait_idle()["busy"]


# -- clients that go away ----------------------------------------------------------------
LONG = {"model": MODEL, "prompt": "hello", "max_tokens": N_CTX - 8, "temperature": 0, "stream": True}

KILLED_CLIENT = textwrap.dedent("""
    import sys, time, httpx
    body = {body}
    with httpx.stream("POST", sys.argv[1] + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                print("started", flush=True)
                time.sleep(60)
""")


def check_serves_correctly(server, client, engine):
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs("hello"), max_tokens=20, temperature=0)
    assert r.choices[0].message.content == engine.generate(chat_msgs("hello"), max_tokens=20, temperature=0)


def test_client_killed_mid_stream(server, client, engine):
    before = server.wait_idle()["cancelled"]
    child = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT.format(body=repr(LONG)), server.url],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert server.wait_idle()["cancelled"] == before + 1
    check_serves_correctly(server, client, engine)


def test_stream_closed_early(server, client, engine):
    before = server.wait_idle()["cancelled"]
    with httpx.stream("POST", server.url + "/v1/completions", json=LONG, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    assert server.wait_idle()["cancelled"] == before + 1
    check_serves_correctly(server, client, engine)


def test_a_client_gone_mid_body_leaves_no_traceback(server, client, engine):
    """A client that announces a body and leaves before sending it all: the server logs one line (no
    traceback: the module's server fixture checks its log) and answers the next request."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"model\": \"")
        time.sleep(0.3)
    time.sleep(0.3)
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs("hello"), max_tokens=4, temperature=0)
    assert r.choices[0].message.content == engine.generate(chat_msgs("hello"), max_tokens=4, temperature=0)
    assert "Traceback" not in server.log_text()


def test_non_streaming_client_timeout_cancels(server, client, engine):
    before = server.wait_idle()["cancelled"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json={**LONG, "stream": False}, timeout=0.2)
    assert server.wait_idle()["cancelled"] == before + 1
    check_serves_correctly(server, client, engine)


def test_queued_requests_survive_a_cancelled_stream_in_arrival_order(server, client, engine):
    """A stream is dropped while two requests wait behind it: both then succeed, first come first served."""
    results, order = {}, []

    def call(name, prompt):
        results[name] = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                                  temperature=0).choices[0].text
        order.append(name)

    with httpx.stream("POST", server.url + "/v1/completions", json=LONG, timeout=60) as r:
        lines = r.iter_lines()  # kept: closing this iterator would close the connection
        next(line for line in lines if line.startswith("data: "))
        threads = []
        for name, prompt in (("a", "hello"), ("b", "the quick")):
            threads.append(threading.Thread(target=call, args=(name, prompt)))
            threads[-1].start()
            time.sleep(0.15)
        assert server.health()["busy"]
    for t in threads:
        t.join(60)
    assert results == {"a": engine.generate("hello", max_tokens=12, temperature=0),
                       "b": engine.generate("the quick", max_tokens=12, temperature=0)}
    assert order == ["a", "b"]


# -- shutdown ----------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_while_streaming(models, tmp_path, sig):
    """SIGTERM or Ctrl-C while an answer streams: the generation stops at a token boundary, its stream ends
    with an error event (no [DONE]), a queued request gets a 503, and the server exits 0 without a
    traceback and without waiting out uvicorn's graceful-shutdown timeout."""
    s = Server(models, tmp_path / "shutdown.log", "--log-level", "info")
    queued = {}
    try:
        with httpx.stream("POST", s.url + "/v1/completions", json=LONG, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            waiter = threading.Thread(target=lambda: queued.update(r=post(s, "/v1/completions", json=COMPLETION)))
            waiter.start()
            deadline = time.monotonic() + 30
            while s.health()["waiting"] < 2 and time.monotonic() < deadline:  # the second one waits for the Engine
                time.sleep(0.05)
            s.proc.send_signal(sig)
            rest = [line for line in lines if line]  # httpx raises if the body is cut short
        waiter.join(30)
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()
    assert rest and all(line.startswith("data: ") for line in rest), rest[-3:]
    last = json.loads(rest[-1][6:])
    assert last["error"]["code"] == "server_shutting_down", last
    assert all("choices" in json.loads(line[6:]) for line in rest[:-1])
    assert_error(queued["r"], 503, code="server_shutting_down")
    log = s.log_text()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert "Finished server process" in log


# -- options: API key, body limit ---------------------------------------------------------
SMALL_LIMIT = 2000
KEY = {"Authorization": "Bearer sekret"}
ORIGINS = ("http://localhost:3000", "https://app.example")


@pytest.fixture(scope="module")
def keyed(models, tmp_path_factory):
    """A server started with an API key, a small body limit and two CORS origins."""
    s = Server(models, tmp_path_factory.mktemp("log") / "keyed.log", "--api-key", "sekret",
               "--max-body-bytes", str(SMALL_LIMIT), *(a for o in ORIGINS for a in ("--cors-origin", o)))
    yield s
    s.stop()
    assert "Traceback" not in s.log_text(), s.log_text()


def test_api_key(keyed):
    s = keyed
    assert httpx.get(s.url + "/health", timeout=10).status_code == 200  # probes need no key
    for auth in ("bearer sekret", "BEARER sekret", "BeArEr  sekret"):  # the scheme is case-insensitive (RFC 7235)
        r = httpx.post(s.url + "/v1/completions", json=COMPLETION, headers={"Authorization": auth}, timeout=60)
        assert r.status_code == 200, (auth, r.text)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"},
                    {"Authorization": "Basic sekret"}, {"Authorization": "Bearersekret"},
                    {"Authorization": "Bearer sekret2"}, {"Authorization": "Bearer"}, {"Authorization": "bearer"}):
        err = assert_error(httpx.post(s.url + "/v1/completions", json=COMPLETION, headers=headers, timeout=10),
                           401, code="invalid_api_key")
        assert "sekret" not in err["message"]
        assert err["message"].startswith("Missing API key" if not headers else "Incorrect API key provided")
    assert_error(httpx.post(s.url + "/v1/completions", content=b"{", timeout=10), 401)  # before the body
    assert_error(httpx.get(s.url + "/v1/models", timeout=10), 401)
    good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0, timeout=60)
    assert good.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=s.url + "/v1", api_key="guess", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_max_body_bytes(keyed):
    """--max-body-bytes: a body of the limit passes, one byte more is a 413 (announced or chunked); a request
    without the key is a 401 whatever its size."""
    url = keyed.url + "/v1/completions"

    def body(size: int) -> bytes:
        head = json.dumps({"model": MODEL, "max_tokens": 4, "prompt": ""}).encode()[:-2]  # ends with "prompt": "
        return head + b"a" * (size - len(head) - 2) + b'"}'

    assert len(body(SMALL_LIMIT)) == SMALL_LIMIT
    r = httpx.post(url, content=body(SMALL_LIMIT), headers=KEY, timeout=60)
    assert r.status_code == 200, r.text
    assert_error(httpx.post(url, content=body(SMALL_LIMIT + 1), headers=KEY, timeout=60), 413,
                 code="request_too_large")
    assert_error(httpx.post(url, content=iter([body(SMALL_LIMIT + 1)]), headers=KEY, timeout=60), 413,
                 code="request_too_large")
    assert_error(httpx.post(url, content=body(SMALL_LIMIT + 1), timeout=60), 401)


def test_cors(keyed, server):
    """--cors-origin: a browser page from a listed origin may call the API (preflight without the key, the
    allowed origin on every answer, errors included); other origins and a server without the option get
    no CORS headers."""
    url = keyed.url + "/v1/chat/completions"
    asks = {"Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"}
    for origin in ORIGINS:
        r = httpx.options(url, headers={"Origin": origin, **asks}, timeout=10)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin, r.headers
        assert {"authorization", "content-type", "x-stainless-os"} <= {
            h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        assert "POST" in r.headers["access-control-allow-methods"]
    origin = {"Origin": ORIGINS[1]}
    r = httpx.post(url, json=CHAT, headers={**KEY, **origin}, timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGINS[1]
    assert "x-tfm-dropped-messages" in r.headers["access-control-expose-headers"].lower()
    for r in (httpx.post(url, json=CHAT, headers=origin, timeout=10),  # 401
              httpx.post(url, content=b"x" * (SMALL_LIMIT + 1), headers={**KEY, **origin}, timeout=10)):  # 413
        assert r.status_code in (401, 413) and r.headers["access-control-allow-origin"] == ORIGINS[1]
    other = {"Origin": "https://evil.example"}
    assert httpx.options(url, headers={**other, **asks}, timeout=10).status_code == 400
    r = httpx.post(url, json=CHAT, headers={**KEY, **other}, timeout=60)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    plain = server.url + "/v1/chat/completions"
    assert "access-control-allow-origin" not in httpx.options(plain, headers={**origin, **asks}, timeout=10).headers
    assert "access-control-allow-origin" not in post(server, "/v1/chat/completions", json=CHAT, headers=origin).headers


def test_cli_errors(models, server):
    target, drafter = models
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--port", "70000"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--port" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--port",
                        str(server.port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--max-body-bytes",
                        "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--max-body-bytes" in r.stderr and "Traceback" not in r.stderr
    for origin in ("localhost:3000", "http://localhost:3000/", "http://x.example/app"):
        r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--cors-origin",
                            origin], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "--cors-origin" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", "/no/such.gguf"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_empty_api_key_is_refused(models):
    """``--api-key ""`` (e.g. an unset variable) must not silently serve without a key."""
    target, _ = models
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--api-key", " "],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr
    env = dict(os.environ, TFM_API_KEY="")  # an exported but empty variable: the same refusal
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--threads", "1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "TFM_API_KEY" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tfm_local.cli.serve", "--target", str(target), "--threads", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--threads" in r.stderr and ">= 1" in r.stderr
