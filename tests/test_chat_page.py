"""The chat page at ``/`` and the live decoding statistics it shows (``x_tfm`` on streamed chunks).

The page's files are checked as served (types, the Content-Security-Policy, no address outside the
server); ``x_tfm`` on the wire; then the page itself in a real headless Chromium (Debian's package,
``make browser``), driven over its DevTools protocol (headless_chromium.py) against ``tfm-serve`` on
the tiny synthetic pair: typed messages, the send and stop buttons, answers compared with the API's
greedy answer to the same conversation, the statistics line, and the server after a stop.
"""
import json
import re
from importlib import resources
from types import SimpleNamespace

import httpx
import pytest

from headless_chromium import Browser, find_chromium
from test_server import MODEL, N_CTX, Server, models, server  # noqa: F401 (the fixtures: a tfm-serve process)
from tfm_local.decode.budget import PassCosts
from tfm_local.decode.stats import GenerationStats
from tfm_local.server.page import CSP, FILES
from tfm_local.server.report import live_stats, plain_step_s

X_TFM_KEYS = {"tau", "tokens_per_s", "plain_tokens_per_s", "speedup", "completion_tokens"}
STATS_LINE = re.compile(r"^τ (\d+\.\d\d) (\d+\.\d) tok/s (\d+\.\d\d)× plain$")


def static_text(name: str) -> str:
    return resources.files("tfm_local.server").joinpath("static", name).read_text()


# -- the page's files, without a server ----------------------------------------------------------
def test_page_names_no_other_origin():
    """No absolute or protocol-relative address in the page's files: it loads and calls its own origin only."""
    for name in ("index.html", "chat.css", "chat.js"):
        text = static_text(name)
        assert not re.search(r"(?i)\b(https?|wss?|ftp):", text), name
        assert not re.search(r"""(?i)(src|href|action)\s*=\s*["']?\s*//""", text), name
        assert not re.search(r"""(?i)url\(\s*["']?\s*(//|[a-z]+:)(?!data:)""", text), name
        assert "@import" not in text, name
    refs = re.findall(r"""(?:src|href)="([^"]*)\"""", static_text("index.html"))
    assert sorted(refs) == ["data:,", "static/chat.css", "static/chat.js"]
    calls = re.findall(r"""fetch\(\s*["'`]([^"'`]*)""", static_text("chat.js"))
    assert sorted(calls) == ["health", "v1/chat/completions"]


def test_model_output_is_never_html():
    """The script sets text only: no innerHTML, outerHTML, insertAdjacentHTML, document.write or eval."""
    js = static_text("chat.js")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink


def test_live_stats_from_generation_stats():
    st = GenerationStats(n_prompt=5, n_generated=1, t_prefill=0.5, t_total=0.5)
    assert live_stats(st, 0.01, False) == {"tau": None, "tokens_per_s": None, "plain_tokens_per_s": 100.0,
                                           "speedup": None, "completion_tokens": 1}  # no verify pass yet
    # 4 steps emit 12 tokens in 0.2 s of decode time, 0.15 s of it in the steps' phases
    st.n_steps, st.n_step_tokens, st.n_generated, st.t_total = 4, 12, 13, 0.7
    st.t_phases.update(drafter=0.05, verify=0.1)
    x = live_stats(st, 0.01, False)
    assert x["tau"] == 3.0 and x["tokens_per_s"] == pytest.approx(60.0) and x["completion_tokens"] == 13
    assert x["plain_tokens_per_s"] == 100.0 and x["speedup"] == pytest.approx(0.8)  # 80 step tok/s over 100
    assert live_stats(st, None, False)["speedup"] is None and live_stats(st, None, False)["plain_tokens_per_s"] is None
    plain = live_stats(st, None, True)  # a server that never drafts: plain decoding's rate is its own
    assert plain["speedup"] == 1.0 and plain["plain_tokens_per_s"] == pytest.approx(80.0)


def test_plain_step_seconds_prefers_the_whole_plain_step():
    costs = PassCosts()
    auto = SimpleNamespace(probes=SimpleNamespace(plain_s=None), costs=costs)
    engine = SimpleNamespace(auto=auto, pass_costs=costs, active_drafter=object())
    assert plain_step_s(engine) is None  # nothing measured yet
    costs.record(1, 0.02)
    assert plain_step_s(engine) == pytest.approx(0.02)  # the target's one-token pass
    auto.probes.plain_s = 0.025
    assert plain_step_s(engine) == 0.025  # the whole plain step, once the automatic budget measured one
    fixed = SimpleNamespace(auto=None, pass_costs=costs, active_drafter=object())
    assert plain_step_s(fixed) == pytest.approx(0.02)


# -- served ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(models, tmp_path_factory):
    s = Server(models, tmp_path_factory.mktemp("log") / "keyed.log", "--api-key", "sekret")
    yield s
    assert s.stop() == 0, s.log_text()
    assert "Traceback" not in s.log_text(), s.log_text()


def test_root_serves_the_page(server):
    for path, (name, media_type) in FILES.items():
        r = httpx.get(server.url + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == media_type, (path, r.headers)
        assert r.text == static_text(name)
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(server.url + "/?name=chat.js", timeout=10).text == static_text("index.html")
    assert httpx.get(server.url + "/static/index.html", timeout=10).status_code == 404  # only the listed files
    assert httpx.get(server.url + "/static/../app.py", timeout=10).status_code == 404
    assert "/" not in httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]


def test_the_page_needs_no_key(keyed):
    assert httpx.get(keyed.url + "/", timeout=10).status_code == 200
    assert httpx.get(keyed.url + "/static/chat.js", timeout=10).status_code == 200
    assert httpx.get(keyed.url + "/v1/models", timeout=10).status_code == 401


def sse_chunks(server, body: dict) -> list[dict]:
    """The JSON events of a streamed chat completion (``[DONE]`` checked and dropped)."""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def chat_body(text: str, max_tokens: int, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def api_answer(server, messages: list[dict], max_tokens: int, headers: dict | None = None) -> dict:
    """The non-streamed greedy answer: its choice and usage."""
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, headers=headers,
                   json={"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def talkative(server, max_tokens: int, headers: dict | None = None) -> tuple[str, str]:
    """A question whose greedy answer (by the API) is not empty, and that answer: the tiny random model
    ends some answers at once, and comparing an empty answer would prove little."""
    for question in ("the quick brown fox", "def hello(): return 42", "a small model for a small test", "hi"):
        want = api_answer(server, [{"role": "user", "content": question}], max_tokens,
                          headers)["choices"][0]["message"]["content"]
        if want:
            return question, want
    raise AssertionError("every candidate question has an empty answer")


def test_x_tfm_on_the_stream(server):
    """The finishing chunk always carries x_tfm; with stream_options.x_tfm_live every text chunk does, its
    counts growing; the text and the final statistics agree with the non-streamed answer's."""
    full = api_answer(server, chat_body("hello", 40)["messages"], 40)
    plain = sse_chunks(server, chat_body("hello", 40, stream=True))
    assert [("x_tfm" in c) for c in plain] == [False] * (len(plain) - 1) + [True]
    assert plain[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]

    live = sse_chunks(server, chat_body("hello", 40, stream=True, stream_options={"x_tfm_live": True,
                                                                               "include_usage": True}))
    text_chunks = [c for c in live if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(c["choices"][0]["delta"]["content"] for c in text_chunks) == full["choices"][0]["message"]["content"]
    assert text_chunks and all(set(c["x_tfm"]) == X_TFM_KEYS for c in text_chunks)
    counts = [c["x_tfm"]["completion_tokens"] for c in text_chunks]
    assert counts == sorted(counts) and counts[-1] <= full["usage"]["completion_tokens"]
    finish = next(c for c in live if c["choices"] and c["choices"][0]["finish_reason"])
    x = finish["x_tfm"]
    assert x["completion_tokens"] == full["usage"]["completion_tokens"]
    assert x["tau"] >= 1.0 and x["tokens_per_s"] > 0 and x["plain_tokens_per_s"] > 0 and x["speedup"] > 0
    # the speed-up is in step time, which the delivered rate's decode time holds and exceeds
    assert x["tokens_per_s"] <= x["speedup"] * x["plain_tokens_per_s"] * 1.01
    tfm = live[-1]["usage"]["tfm"]  # the usage chunk: the same statistics
    assert (tfm["tau"], tfm["speedup"], tfm["plain_tokens_per_s"]) == (x["tau"], x["speedup"],
                                                                       x["plain_tokens_per_s"])
    assert {"speedup", "plain_tokens_per_s"} <= set(full["usage"]["tfm"])


def test_openai_client_ignores_x_tfm(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    body = chat_body("the quick brown fox", 30)
    del body["model"]
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, stream_options={"x_tfm_live": True},
                                                 **body))
    want = api_answer(server, body["messages"], 30)["choices"][0]["message"]["content"]
    assert want and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].model_extra["x_tfm"]["tau"] >= 1.0


# -- in a browser ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium: `make browser` installs Debian's package (apt-get install chromium), "
                    "or set TFM_CHROMIUM to a Chromium binary")
    return path


@pytest.fixture
def page(chromium, server):
    with Browser(chromium) as b:
        b.goto(server.url + "/")
        b.wait_for("document.body.dataset.state === 'idle'")
        yield b
        assert all(u.startswith((server.url + "/", "data:")) for u in b.requests), b.requests


def fill(b: Browser, selector: str, text: str) -> None:
    """Replace the value of a field: click it, empty it, type ``text``; check the field holds it."""
    field = f"document.querySelector({json.dumps(selector)})"
    if b.js(f"!{field}.checkVisibility()"):
        b.click("#settings > summary")  # the settings are folded
    b.click(selector)
    b.js(f"{field}.value = ''")
    b.type_text(text)
    assert b.js(f"{field}.value") == text


def answers(b: Browser) -> list[str]:
    return b.js("[...document.querySelectorAll('#log .msg.assistant .content')].map(e => e.textContent)")


def ask(b: Browser, text: str, enter: bool = False) -> str:
    """Type ``text`` into the message box, send it (the Send button, or Enter), wait for the whole answer."""
    n = len(answers(b))
    b.click("#input")
    b.type_text(text)
    if enter:
        b.press_enter()
    else:
        b.click("#send")
    b.wait_for(f"document.querySelectorAll('#log .msg.assistant').length === {n + 1} "
               "&& document.body.dataset.state === 'idle'", timeout=120)
    assert b.js("document.getElementById('error').hidden"), b.js("document.getElementById('error').textContent")
    return answers(b)[-1]


def test_chat_in_a_browser(page, server):
    """Two turns typed into the page: each streamed answer equals the API's greedy answer to the same
    conversation, and the statistics line shows τ, tokens/s and the speed-up over plain as numbers."""
    b = page
    assert b.js("document.getElementById('model').textContent") == MODEL
    fill(b, "#temperature", "0")
    fill(b, "#max-tokens", "48")
    first = "<b>hello</b> & <img src=x onerror=\"window.pwned=1\">"  # shown as text, never as markup
    got = ask(b, first)
    want = api_answer(server, [{"role": "user", "content": first}], 48)["choices"][0]["message"]["content"]
    assert want and got == want
    assert b.js("document.querySelector('#log .msg.user .content').textContent") == first
    assert b.js("document.querySelectorAll('#log img, #log b').length") == 0 and b.js("window.pwned") is None

    line = " ".join(b.js("[...document.querySelectorAll('#stats span')].map(e => e.textContent)"))
    m = STATS_LINE.match(line)
    assert m, line
    tau, tps, speedup = map(float, m.groups())
    assert tau >= 1.0 and tps > 0 and speedup > 0
    assert "plain decoding" in b.js("document.getElementById('stat-speedup').title")

    second = "and then?"
    got2 = ask(b, second, enter=True)
    history = [{"role": "user", "content": first}, {"role": "assistant", "content": want},
               {"role": "user", "content": second}]
    assert got2 == api_answer(server, history, 48)["choices"][0]["message"]["content"]


def test_model_output_rendered_as_text(page):
    """The renderer the answers go through: markup stays text, a fenced block becomes <pre><code>, and the
    text shown is the text received."""
    text = "see <img src=x onerror=\"window.pwned=1\"> here\n```python\nif a < b: print('<b>')\n```\ndone"
    got = page.js(f"(() => {{ const el = document.createElement('div'); document.body.append(el);"
                  f" renderText(el, {json.dumps(text)});"
                  " return [el.textContent, el.querySelectorAll('img, b').length,"
                  " [...el.querySelectorAll('pre > code')].map(c => c.textContent)]; })()")
    assert got == [text, 0, ["if a < b: print('<b>')\n"]]
    assert page.js("window.pwned") is None


def test_stop_in_a_browser(page, server):
    """Stop while an answer streams: the page stops reading, the server ends the generation (counted as
    cancelled, not busy after), and the next question is answered as the API answers it."""
    b = page
    question = "tell me everything"
    long = api_answer(server, [{"role": "user", "content": question}], N_CTX - 64)
    assert long["choices"][0]["finish_reason"] == "length", "the test needs an answer that runs to its limit"
    before = server.wait_idle()["cancelled"]
    fill(b, "#temperature", "0")
    fill(b, "#max-tokens", str(N_CTX - 64))
    b.click("#input")
    b.type_text(question)
    b.click("#send")
    b.wait_for("(document.querySelector('#log .msg.assistant .content') || {}).textContent", timeout=60)
    assert b.js("document.body.dataset.state") == "busy"
    b.click("#stop")
    b.wait_for("document.body.dataset.state === 'idle'", timeout=30)
    assert b.js("document.querySelector('#log .msg.assistant').classList.contains('stopped')")
    shown = answers(b)[0]
    assert shown and long["choices"][0]["message"]["content"].startswith(shown)
    assert len(shown) < len(long["choices"][0]["message"]["content"])
    health = server.wait_idle()
    assert health["cancelled"] == before + 1 and not health["busy"]

    b.click("#new-chat")
    assert answers(b) == []
    fill(b, "#max-tokens", "24")
    question, want = talkative(server, 24)
    assert ask(b, question) == want


def test_key_asked_in_a_browser(chromium, keyed):
    """On a server with --api-key the page loads without the key; a question without it shows the 401's
    message and opens the settings; with the key typed there, the answer comes."""
    with Browser(chromium) as b:
        b.goto(keyed.url + "/")
        b.wait_for("document.body.dataset.state === 'idle'")
        question, want = talkative(keyed, 16, {"Authorization": "Bearer sekret"})
        b.click("#input")
        b.type_text(question)
        b.click("#send")
        b.wait_for("!document.getElementById('error').hidden", timeout=60)
        assert "API key" in b.js("document.getElementById('error').textContent")
        assert b.js("document.getElementById('settings').open")
        assert b.js("document.getElementById('input').value") == question  # the question is given back
        assert answers(b) == []
        fill(b, "#api-key", "sekret")
        fill(b, "#temperature", "0")
        fill(b, "#max-tokens", "16")
        b.click("#send")
        b.wait_for("document.querySelectorAll('#log .msg.assistant').length === 1 "
                   "&& document.body.dataset.state === 'idle'", timeout=60)
        assert answers(b) == [want]
        assert b.js("document.getElementById('error').hidden")
