"""tfm-serve's log-probabilities and penalties as a client sees them: the official ``openai`` client
and raw JSON against a server process on the tiny synthetic pair (test_server's fixtures).

Values are checked against a numpy log-softmax of the target's logits from an Engine in this process
(its target decoding the answer one token at a time, test_logprobs.reference_rows), and the answers
against that Engine's.
"""
import json

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from test_server import (CHAT, COMPLETION, MODEL, Server, assert_error, chat_msgs, client, engine,  # noqa: E402,F401
                         models, post, server)
from test_logprobs import TOL, log_softmax, reference_rows  # noqa: E402
from test_tree_verify import REL_TOL  # noqa: E402


@pytest.fixture(scope="module")
def plain_client(models, tmp_path_factory):
    """A client of a second server on the same pair decoding plainly (``--budget 0``)."""
    s = Server(models, tmp_path_factory.mktemp("log") / "plain.log", "--budget", "0")
    try:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    finally:
        assert s.stop() == 0, s.log_text()


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_chat_top_logprobs_are_the_targets_log_softmax(request, engine, speculative):
    """The bar: top_logprobs=3 gives three alternatives per token whose values match the target's
    log-softmax within 1e-3 (plain decoding, against the same one-token passes); the token strings join
    to the answer. The default server (the automatic budget, speculating when it pays) reads rows of
    batched passes: within what their rounding may move a log-softmax (test_logprobs.assert_same_records)."""
    client = request.getfixturevalue("client" if speculative else "plain_client")
    for p in ("hello", "the quick brown fox"):
        r = client.chat.completions.create(model=MODEL, messages=chat_msgs(p), max_tokens=16, temperature=0,
                                           logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        text = r.choices[0].message.content
        assert text == engine.generate(chat_msgs(p), max_tokens=16, logprobs=3)
        assert len(content) == len(engine.logprobs) > 0
        assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == text
        ids = [rec.token for rec in engine.logprobs]  # the same greedy tokens, by id
        rows = reference_rows(engine.target, engine.prompt_tokens(chat_msgs(p)), ids)
        for i, (e, rec) in enumerate(zip(content, engine.logprobs)):
            assert bytes(e.bytes) == engine.tok.piece(rec.token)
            assert e.token == bytes(e.bytes).decode("utf-8", "backslashreplace")
            ls = log_softmax(rows[i])
            tol = 2 * REL_TOL * np.abs(rows[i]).max() if speculative else TOL
            assert abs(e.logprob - ls[rec.token]) < tol
            assert len(e.top_logprobs) == 3
            assert np.allclose([a.logprob for a in e.top_logprobs], np.sort(ls)[::-1][:3], atol=tol)
            assert [bytes(a.bytes) for a in e.top_logprobs] == [engine.tok.piece(t) for t, _ in rec.top]
            assert all(abs(a.logprob - ls[t]) < tol for a, (t, _) in zip(e.top_logprobs, rec.top))


def test_chat_logprobs_off_and_without_alternatives(client):
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs("hello"), max_tokens=6, temperature=0)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs("hello"), max_tokens=6, temperature=0,
                                       logprobs=True)
    content = r.choices[0].logprobs.content
    assert content and all(e.top_logprobs == [] and e.logprob <= 0 for e in content)


def test_chat_streamed_logprobs_equal_non_streamed(client):
    kw = dict(model=MODEL, messages=chat_msgs("a small model"), max_tokens=20, temperature=0, logprobs=True,
              top_logprobs=2)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    want = full.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in want]
    assert np.allclose([e.logprob for e in streamed], [e.logprob for e in want], atol=1e-6)
    assert [[a.token for a in e.top_logprobs] for e in streamed] == [[a.token for a in e.top_logprobs] for e in want]
    assert all(c.choices[0].logprobs is not None for c in chunks if c.choices and c.choices[0].delta.content)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert b"".join(bytes(e.bytes) for e in streamed).decode("utf-8", "replace") == text


def test_completion_legacy_logprobs(server, client, engine):
    prompt = "hello world"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logprobs=4)
    lp = r.choices[0].logprobs
    text = r.choices[0].text
    assert text == engine.generate(prompt, max_tokens=16, logprobs=4)
    n = len(engine.logprobs)
    assert n and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.text_offset[0] == len(prompt)  # counted from the start of the prompt, as OpenAI's
    assert [o - len(prompt) for o in lp.text_offset] == [rec.text_offset for rec in engine.logprobs]
    assert np.allclose(lp.token_logprobs, [rec.logprob for rec in engine.logprobs], atol=1e-6)
    for tok, lpv, top, rec in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, engine.logprobs):
        assert 4 <= len(top) <= 5 and top[tok] == lpv  # the alternatives and the emitted token
        assert max(top.values()) == pytest.approx(rec.top[0][1], abs=1e-6)
    # streamed: the same records, chunk by chunk
    events = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 4,
                            "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    parts = [e["choices"][0]["logprobs"] for e in events]
    assert [t for p in parts for t in p["tokens"]] == lp.tokens
    assert [o for p in parts for o in p["text_offset"]] == lp.text_offset


def test_penalties_accepted_and_applied(client, engine):
    """OpenAI's penalties and llama.cpp's repeat_penalty (an extension field) change the answer as
    they change the Engine's; the answers equal the Engine's."""
    prompt = "the quick brown fox"
    base = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    for kw, extra in ((dict(frequency_penalty=1.5, presence_penalty=0.5), {}),
                      ({}, dict(repeat_penalty=1.5, repeat_last_n=32))):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body=extra,
                                      **kw)
        want = engine.generate(prompt, max_tokens=24, **kw, **extra)
        assert r.choices[0].text == want and want != base
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs(prompt), max_tokens=24, temperature=0,
                                       frequency_penalty=2.0, logprobs=True)
    assert r.choices[0].message.content == engine.generate(chat_msgs(prompt), max_tokens=24, frequency_penalty=2.0)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": -2.1}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": "high"}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "repeat_penalty": 0}, "repeat_penalty"),
    ("/v1/chat/completions", {**CHAT, "repeat_last_n": -2}, "repeat_last_n"),
    ("/v1/completions", {**COMPLETION, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "logprobs": True}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "logprobs": -1}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": -3}, "frequency_penalty"),
])
def test_bad_logprobs_and_penalties(server, path, body, param):
    for stream in (False, True):
        assert_error(post(server, path, json={**body, "stream": stream}), 400, param=param)


def test_limits_are_accepted(server):
    r = post(server, "/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 20,
                                                   "frequency_penalty": -2, "presence_penalty": 2})
    assert r.status_code == 200, r.text
    assert all(len(e["top_logprobs"]) == 20 for e in r.json()["choices"][0]["logprobs"]["content"])
    r = post(server, "/v1/completions", json={**COMPLETION, "logprobs": 0, "repeat_penalty": 1.2, "repeat_last_n": -1})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert all(len(top) == 1 and top == {t: v} for t, v, top in zip(lp["tokens"], lp["token_logprobs"],
                                                                    lp["top_logprobs"]))
