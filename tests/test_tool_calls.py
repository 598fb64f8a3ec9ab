"""Tool calls: the parser of ``<tool_call>`` blocks (pure Python), the tools rendered by a chat template
that takes them, and /v1/chat/completions with ``tools`` in this process (FastAPI's TestClient on the
app of a tiny synthetic target whose template is Qwen2.5-shaped).

The tiny random model never writes a tool call of its own, so the answers that must hold calls are
scripted: the Engine runs the real request (template, prefill, one token, statistics) and its text is
then replaced by a given one, which the server parses as it would the model's.
"""
import itertools
import json

import httpx
import pytest

from tfm_local.server.messages import template_renders_tools, template_takes_tools
from tfm_local.server.tool_calls import ToolCall, ToolCallStream, parse_tool_calls, stream_deltas
from tfm_local.testing.vocab import CHATML_TEMPLATE

from test_server import TOOL_TEMPLATE, assert_error  # noqa: E402

MODEL = "tiny"

#: A template shaped as Qwen2.5's: a system turn listing the tools in a <tools> block and how to call
#: them, assistant calls as <tool_call> blocks, tool results as <tool_response> blocks in a user turn.
QWEN_STYLE_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are an assistant.{% endif %}"
    "{{ '\\n\\n# Tools\\n\\nFunctions you may call:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nCall one as <tool_call>\\n{\"name\": <name>, \"arguments\": <object>}\\n</tool_call>"
    "<|im_end|>\\n' }}"
    "{% elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' or (m.role == 'system' and not loop.first)"
    " or (m.role == 'assistant' and not m.tool_calls) %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant{% if m.content %}{{ '\\n' + m.content }}{% endif %}"
    "{% for c in m.tool_calls %}{{ '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather <in °C> for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
#: How Qwen2.5-Coder-1.5B-Instruct answered "What's the weather in Paris right now?" with TOOLS rendered.
FENCED_CALL = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
NAMES = frozenset({"get_weather", "get_time", "f"})


def counter_ids():
    """Call ids id0, id1, ... (the parser's ``new_id``)."""
    n = itertools.count()
    return lambda: f"id{next(n)}"


def call(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(index, f"id{index}", name, arguments)


# -- the parser -------------------------------------------------------------------------------------
#: (answer, content, calls) with the function names NAMES.
PARSES = [
    (CALL_TEXT, None, [call(0, "get_weather", '{"city":"Paris"}')]),
    ("Let me look.\n" + CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", "Oslo") + "\nOne moment.",
     "Let me look.\nOne moment.",
     [call(0, "get_weather", '{"city":"Paris"}'), call(1, "get_weather", '{"city":"Oslo"}')]),
    ('<tool_call>{"name":"get_time"}</tool_call>\n\n', None, [call(0, "get_time", "{}")]),
    ('\n<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>done', "done",
     [call(0, "f", '{"x":[1,2]}')]),
    ('<tool_call>{"name": "f", "arguments": {"s": "é \\u00e9 <b>"}}</tool_call>', None,
     [call(0, "f", '{"s":"é é <b>"}')]),
    ("", None, []),
    # a malformed block between calls is text: the whitespace between it and the calls is dropped
    (CALL_TEXT + "\n<tool_call>{bad}</tool_call>\n" + CALL_TEXT, "<tool_call>{bad}</tool_call>",
     [call(0, "get_weather", '{"city":"Paris"}'), call(1, "get_weather", '{"city":"Paris"}')]),
    # fenced JSON naming one of the tools is a call
    (FENCED_CALL, None, [call(0, "get_weather", '{"city":"Paris"}')]),
    ("Sure:\n" + FENCED_CALL + "\n" + CALL_TEXT, "Sure:",
     [call(0, "get_weather", '{"city":"Paris"}'), call(1, "get_weather", '{"city":"Paris"}')]),
    ('```json\n{"n`` ```json\n{"name": "get_time"}\n```', '```json\n{"n``', [call(0, "get_time", "{}")]),
]
#: Answers that hold no call: their content is the answer as written.
NO_CALLS = [
    "plain answer, no calls  \n", "  leading and trailing  ",
    # blocks that are not calls: malformed, no name, arguments not an object, two objects, unclosed
    'a <tool_call>{"name": oops}</tool_call> b', '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "f", "arguments": "nope"}</tool_call>',
    '<tool_call>["f"]</tool_call>', '<tool_call>{"name": "f"} {"name": "g"}</tool_call>',
    'x <tool_call>{"name": "f", "arguments": {}',
    "ends with <tool_ca", "<tool <tool_cal <tool_callx", "a </tool_call> b",
    # fenced blocks that are not calls: another name, not an object, malformed, unclosed, another language
    '```json\n{"name": "other", "arguments": {}}\n```', '```json\n{"name": "get_weatherX", "arguments": {}}\n```',
    '```json\n{"name": "get_weather", oops}\n```', '```json\n{"city": "Paris"}\n```', "```json\n[1, 2]\n```\n",
    "```python\nprint(1)\n```", '```json\n{"name": "get_weather"',
    '```json\n{"nam```json\n{"name": "get_time"}\n```',
    "``` ```json ```json\n",
    # an object with a key beside name and arguments (a model summing up a result), fenced or tagged
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}, "response": "sunny"}\n```',
    '<tool_call>{"name": "f", "arguments": {}, "id": 3}</tool_call>',
]
PARSES += [(text, text, []) for text in NO_CALLS]


@pytest.mark.parametrize("text,content,calls", PARSES)
def test_parse_whole_answer(text, content, calls):
    assert parse_tool_calls(text, NAMES, counter_ids()) == (content, calls)


def test_fenced_json_is_text_without_tool_names():
    assert parse_tool_calls(FENCED_CALL) == (FENCED_CALL, [])
    assert parse_tool_calls(FENCED_CALL, frozenset({"get_time"})) == (FENCED_CALL, [])


def run_stream(pieces) -> tuple[str | None, list[ToolCall], list]:
    """(content, calls, events) of ``pieces`` fed one by one to a ToolCallStream."""
    s = ToolCallStream(NAMES, counter_ids())
    events = [e for p in pieces for e in s.feed(p)] + s.finish()
    assert all(e != "" for e in events)
    content = "".join(e for e in events if isinstance(e, str))
    return content or None, [e for e in events if isinstance(e, ToolCall)], events


@pytest.mark.parametrize("text,content,calls", PARSES)
def test_stream_split_anywhere_gives_the_whole_parse(text, content, calls):
    """Split at every character boundary (two pieces), and one character per piece: the same content
    and calls as the whole text."""
    for i in range(len(text) + 1):
        assert run_stream([text[:i], text[i:]])[:2] == (content, calls), i
    assert run_stream(list(text))[:2] == (content, calls)


def test_stream_gives_text_before_a_call_at_once_and_holds_back_only_a_possible_opening():
    s = ToolCallStream(NAMES, counter_ids())
    assert s.feed("Let me") == ["Let me"]
    assert s.feed(" look. <tool") == [" look."]  # " " and "<tool" held back
    assert s.feed('_call>{"name": "get_time"') == []  # inside the block until it closes
    assert s.feed("}</tool_call>") == [call(0, "get_time", "{}")]
    assert s.feed("\n") == [] and s.finish() == []
    s = ToolCallStream(NAMES, counter_ids())
    assert s.feed("a <tool") == ["a"] and s.feed("box>") == [" <toolbox>"]


def test_stream_holds_a_fenced_block_only_while_it_can_be_a_call():
    """Code in a fence is given out as soon as its first characters cannot begin a call."""
    s = ToolCallStream(NAMES, counter_ids())
    assert s.feed("Code:\n```") == ["Code:"]
    assert s.feed("json\n{") == []
    assert s.feed('"x": 1,') == ["\n```json", "\n{\"x\": 1,"]
    assert s.feed('\n  "name": "get_weather"}\n```') == ['\n  "name": "get_weather"}']  # "\n```" may open one
    assert s.finish() == ["\n```"]
    s = ToolCallStream(NAMES, counter_ids())
    assert s.feed('```json\n {"name": "get_') == []
    assert s.feed('time"') == [] and s.feed(', "arguments": {}}\n``') == []
    assert s.feed("`\n") == [call(0, "get_time", "{}")] and s.finish() == []


def test_stream_deltas_have_openais_shape():
    events = ["Checking.", call(0, "get_weather", '{"city":"Paris"}'), call(1, "get_time", "{}")]
    assert stream_deltas(events) == [
        {"content": "Checking."},
        {"tool_calls": [{"index": 0, "id": "id0", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "id1", "type": "function",
                         "function": {"name": "get_time", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}]


def test_default_ids_are_fresh():
    _, calls = parse_tool_calls(CALL_TEXT + FENCED_CALL, NAMES)
    assert [c.id[:5] for c in calls] == ["call_", "call_"] and calls[0].id != calls[1].id
    assert calls[0].message_entry() == {"id": calls[0].id, "type": "function",
                                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


# -- templates ----------------------------------------------------------------------------------------
def test_which_templates_take_tools():
    assert template_takes_tools(QWEN_STYLE_TEMPLATE) and template_renders_tools(QWEN_STYLE_TEMPLATE)
    assert not template_takes_tools(CHATML_TEMPLATE)
    assert not template_takes_tools(TOOL_TEMPLATE) and template_renders_tools(TOOL_TEMPLATE)  # tool use, no tools
    assert not template_takes_tools(None) and not template_takes_tools("{% if tools %}")  # unparsable
    assert not template_takes_tools("{% set tools = [] %}{{ tools }}")  # its own variable, not the request's


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from tfm_local.testing.synth import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("tools") / "qwen-style.gguf", n_layer=1,
                             chat_template=QWEN_STYLE_TEMPLATE)


@pytest.fixture(scope="module")
def engine(target):
    from tfm_local.engine import Engine

    e = Engine(target, None, n_ctx=1024, n_threads=1)
    yield e
    e.close()


def test_tools_are_rendered_as_the_template_writes_them(engine):
    """Each tool is written as JSON in its own key order with non-ASCII text and '<' as they are (the
    template's ``tojson``), in the system turn; without tools the template's other branch renders."""
    from tfm_local.llama.tokenizer import render_chat

    text = render_chat(engine.target.model, engine.tok, QUESTION, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou are an assistant.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n" + json.dumps(TIME) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(engine.target.model, engine.tok, QUESTION) == (
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert len(engine.prompt_tokens(QUESTION, TOOLS)) > len(engine.prompt_tokens(QUESTION)) + 50
    with pytest.raises(ValueError):
        engine.prompt_tokens("raw text", TOOLS)


# -- the endpoint, in this process ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def http(engine):
    from fastapi.testclient import TestClient

    from tfm_local.server.app import create_app

    with TestClient(create_app(engine, MODEL)) as c:  # leaving it closes the engine (the app's shutdown)
        yield c


def chat(http, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "max_tokens": 8,
                                                   "temperature": 0, **body})


def stream_chunks(http, **body) -> list[dict]:
    """The JSON chunks of a streamed chat answer (the last event must be [DONE])."""
    with http.stream("POST", "/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "max_tokens": 8,
                                                            "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.fixture
def scripted(engine, monkeypatch):
    """``set(text)``: the Engine's next answers are ``text``, in pieces of up to 3 characters, after it
    ran the request for real (prompt rendered with the tools, one token generated, statistics);
    ``seen`` holds each generation's (prompt, tools)."""
    real = engine.generate
    seen = []
    answer = {}

    def generate(prompt, max_tokens, stream, tools=None, **kw):
        seen.append((prompt, tools))
        list(real(prompt, max_tokens=1, stream=True, tools=tools, **kw))
        engine.stats.finish_reason = "stop"
        text = answer["text"]
        return (text[i:i + 3] for i in range(0, len(text), 3))  # a generator, as the Engine's (closed after)

    monkeypatch.setattr(engine, "generate", generate)

    class Script:
        def set(self, text):
            answer["text"] = text

    s = Script()
    s.seen = seen
    return s


def test_tools_reach_the_prompt_and_a_real_answer_comes_back(http, engine):
    """No script: the tiny model's own answer, its prompt rendered with the tools (the token count the
    Engine gives for messages plus tools, not for the messages alone); tool_choice "none" leaves them out."""
    want = engine.generate(QUESTION, max_tokens=8, temperature=0, tools=TOOLS)
    r = chat(http, tools=TOOLS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(engine.prompt_tokens(QUESTION, TOOLS))
    content, calls = parse_tool_calls(want, frozenset({"get_weather", "get_time"}))
    assert body["choices"][0]["message"]["content"] == content and not calls
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    r = chat(http, tools=TOOLS, tool_choice="none")
    assert r.json()["usage"]["prompt_tokens"] == len(engine.prompt_tokens(QUESTION))
    assert r.json()["choices"][0]["message"]["content"] == engine.generate(QUESTION, max_tokens=8, temperature=0)


@pytest.mark.parametrize("form", [CALL_TEXT, FENCED_CALL], ids=["tags", "fenced"])
def test_a_call_in_the_answer_becomes_tool_calls(http, scripted, form):
    scripted.set("I will check.\n" + form)
    r = chat(http, tools=TOOLS, tool_choice="auto")
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert scripted.seen[-1] == (QUESTION, TOOLS)
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "I will check."
    [c] = msg["tool_calls"]
    assert c["id"].startswith("call_") and len(c["id"]) > 10
    assert c == {"id": c["id"], "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def test_calls_only_have_null_content(http, scripted):
    scripted.set(CALL_TEXT + "\n" + CALL_TEXT.replace("get_weather", "get_time").replace('{"city": "Paris"}', "{}"))
    msg = chat(http, tools=TOOLS).json()["choices"][0]["message"]
    assert msg["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        ("get_weather", '{"city":"Paris"}'), ("get_time", "{}")]
    assert len({c["id"] for c in msg["tool_calls"]}) == 2


def test_malformed_call_is_content(http, scripted):
    text = 'Hmm <tool_call>{"name": "get_weather", "arguments": {city: Paris}}</tool_call>'
    scripted.set(text)
    choice = chat(http, tools=TOOLS).json()["choices"][0]
    assert choice["message"]["content"] == text and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_without_tools_a_call_shaped_answer_is_plain_text(http, scripted):
    scripted.set("x " + CALL_TEXT)
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        choice = chat(http, **extra).json()["choices"][0]
        assert choice["message"]["content"] == "x " + CALL_TEXT and choice["finish_reason"] == "stop", extra
        assert scripted.seen[-1][1] is None


def test_streamed_calls(http, scripted):
    """Content deltas, then each call as an opening delta (index, id, type, name) and an arguments
    delta; the last chunk's finish_reason is "tool_calls"; the same message as without streaming."""
    text = "Checking.\n" + CALL_TEXT + "\n" + FENCED_CALL.replace("Paris", "Oslo")
    scripted.set(text)
    chunks = stream_chunks(http, tools=TOOLS)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["index"], "id" in c, c["function"]) for c in calls] == [
        (0, True, {"name": "get_weather", "arguments": ""}), (0, False, {"arguments": '{"city":"Paris"}'}),
        (1, True, {"name": "get_weather", "arguments": ""}), (1, False, {"arguments": '{"city":"Oslo"}'})]
    assert calls[0]["type"] == "function" and calls[0]["id"] != calls[2]["id"]
    first_call = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert all("tool_calls" not in d for d in deltas[:first_call])
    assert all("content" not in d for d in deltas[first_call:])
    msg = chat(http, tools=TOOLS).json()["choices"][0]["message"]
    assert msg["content"] == "Checking."
    assert [c["function"] for c in msg["tool_calls"]] == [{"name": "get_weather", **calls[i + 1]["function"]}
                                                          for i in (0, 2)]


def test_streamed_answer_accumulates_in_the_openai_client(http, scripted):
    """The official client's stream helper rebuilds the message from the deltas."""
    openai = pytest.importorskip("openai")
    scripted.set("Sure. " + CALL_TEXT)
    client = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="unused", http_client=http, max_retries=0)
    with client.chat.completions.stream(model=MODEL, messages=QUESTION, max_tokens=8, tools=TOOLS) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    msg = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and msg.content == "Sure."
    assert [(c.type, c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("function", "get_weather", '{"city":"Paris"}')]


def test_malformed_call_streams_as_content(http, scripted):
    text = "<tool_call>{oops}</tool_call> and <tool_ca"
    scripted.set(text)
    chunks = stream_chunks(http, tools=TOOLS)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == text
    assert not any("tool_calls" in d for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_full_tool_loop(http, scripted, engine):
    """Tools → a call → the client sends the assistant's call and the tool's result → the final answer;
    the second prompt holds the call as the template writes it and the result."""
    from tfm_local.llama.tokenizer import render_chat

    scripted.set(CALL_TEXT)
    first = chat(http, tools=TOOLS).json()["choices"][0]["message"]
    [c] = first["tool_calls"]
    messages = QUESTION + [first, {"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"}]
    scripted.set("It is sunny in Paris, 21 C.")
    r = chat(http, tools=TOOLS, messages=messages)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "It is sunny in Paris, 21 C." and choice["finish_reason"] == "stop"
    prompt, tools = scripted.seen[-1]
    assert tools == TOOLS
    rendered = render_chat(engine.target.model, engine.tok, prompt, tools=tools)
    assert rendered.endswith(
        "<|im_start|>assistant\n" + CALL_TEXT + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert r.json()["usage"]["prompt_tokens"] == len(engine.prompt_tokens(prompt, tools))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_choice_is_rendered_but_not_enforced(http, scripted, choice):
    """Until the grammar forces a call, "required" or a named function render the tools and return the
    answer as written: here text without any call."""
    scripted.set("No call today.")
    choice_ = chat(http, tools=TOOLS, tool_choice=choice).json()["choices"][0]
    assert scripted.seen[-1] == (QUESTION, TOOLS)
    assert choice_["message"]["content"] == "No call today." and choice_["finish_reason"] == "stop"


@pytest.mark.parametrize("body,param,code", [
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "invalid_value"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
      "tool_choice": "required"}, "tools[0].function", "invalid_value"),
])
def test_bad_tool_requests(http, body, param, code):
    assert_error(chat(http, **body), 400, param=param, code=code)
