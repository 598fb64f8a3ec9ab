"""Structured outputs on the server: ``response_format`` (json_object, json_schema), the ``grammar``
extension and forced tool calls (``tool_choice`` "required" or a named function), constrained by the
decode loop's grammar (docs/structured-outputs.md).

The app runs in this process (FastAPI's TestClient) on a tiny random target whose template is
Qwen2.5-shaped (test_tool_calls). Its vocabulary has no ``<tool_call>`` token, so a forced call's tags
are text literals here; tests/test_real_target_structured.py covers Qwen2.5's own tokens. The schemas
are ones a random model finishes quickly: enums, booleans, bounded integers, no free strings.
"""
import json

import pytest

from tfm_local.decode.grammar import GrammarError
from tfm_local.server.tool_calls import forced_call_grammar, parse_tool_calls

from test_server import assert_error  # noqa: E402
from test_tool_calls import MODEL, QUESTION, QWEN_STYLE_TEMPLATE  # noqa: E402

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["color", "ok", "n"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True}}
CHOICE = 'root ::= "[" answer "]"\nanswer ::= "yes" | "no"'
PAINT = {"type": "function", "function": {"name": "paint", "description": "Paint the wall", "parameters": {
    "type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "gloss": {"type": "boolean"}},
    "required": ["color", "gloss"], "additionalProperties": False}}}
COUNT = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["n"], "additionalProperties": False}}}
TOOLS = [PAINT, COUNT]
NAMED = {"type": "function", "function": {"name": "paint"}}


def check_schema(obj) -> None:
    assert set(obj) == {"color", "ok", "n"}
    assert obj["color"] in ("red", "green", "blue") and isinstance(obj["ok"], bool)
    assert isinstance(obj["n"], int) and not isinstance(obj["n"], bool) and 0 <= obj["n"] <= 99


def check_arguments(name: str, arguments: str) -> None:
    args = json.loads(arguments)
    if name == "paint":
        assert set(args) == {"color", "gloss"} and args["color"] in ("red", "green", "blue")
        assert isinstance(args["gloss"], bool)
    else:
        assert name == "count" and set(args) == {"n"} and args["n"] in range(1, 10)


def in_choice_language(s: str) -> bool:
    return s in ("[yes]", "[no]")


# -- the forced call's grammar ---------------------------------------------------------------------
def test_forced_call_grammar_shape():
    g = forced_call_grammar(TOOLS, "paint")
    assert g.startswith('root ::= "<tool_call>" "\\n" call "\\n" "</tool_call>"\n')
    assert '"\\"paint\\""' in g and "count" not in g
    both = forced_call_grammar(TOOLS, None)
    assert '"\\"paint\\""' in both and '"\\"count\\""' in both and "call ::= call-0 | call-1" in both
    assert forced_call_grammar(TOOLS, "count", special_tags=True).startswith(
        'root ::= <tool_call> "\\n" call "\\n" </tool_call>\n')
    assert "object" in forced_call_grammar([{"type": "function", "function": {"name": "f"}}], None)
    with pytest.raises(ValueError, match="no tool named 'nope'"):
        forced_call_grammar(TOOLS, "nope")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(GrammarError):
        forced_call_grammar([bad], "f")


# -- the endpoints ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from fastapi.testclient import TestClient

    from tfm_local.engine import Engine
    from tfm_local.server.app import create_app
    from tfm_local.testing.synth import write_tiny_target

    target = write_tiny_target(tmp_path_factory.mktemp("structured") / "qwen-style.gguf", n_layer=1,
                               chat_template=QWEN_STYLE_TEMPLATE)
    with TestClient(create_app(Engine(target, None, n_ctx=1024, n_threads=1), MODEL)) as c:
        yield c


def chat(http, **body):
    return http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "max_tokens": 120,
                                                   "temperature": 0, **body})


def complete(http, **body):
    return http.post("/v1/completions", json={"model": MODEL, "prompt": "Answer:", "max_tokens": 120,
                                              "temperature": 0, **body})


def stream_chunks(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={"model": MODEL, "max_tokens": 120, "temperature": 0, "stream": True,
                                         **body}) as r:
        assert r.status_code == 200, r.read()
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def answer(r) -> tuple[str, str]:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"], choice["finish_reason"]


def test_json_schema_answer_matches_the_schema_streamed_or_not(http):
    for sampling in ({}, {"temperature": 0.9, "seed": 3}):
        text, finish = answer(chat(http, response_format=JSON_SCHEMA, **sampling))
        assert finish == "stop", text
        check_schema(json.loads(text))
        chunks = stream_chunks(http, "/v1/chat/completions", {"messages": QUESTION, "response_format": JSON_SCHEMA,
                                                              **sampling})
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_json_object_answer_is_a_json_object(http):
    text, finish = answer(chat(http, response_format={"type": "json_object"}, max_tokens=400))
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)


def test_text_format_is_unconstrained(http):
    plain = answer(chat(http, max_tokens=12))
    assert answer(chat(http, max_tokens=12, response_format={"type": "text"})) == plain


def test_completions_take_a_schema_and_a_grammar(http):
    text, finish = answer(complete(http, response_format=JSON_SCHEMA))
    assert finish == "stop", text
    check_schema(json.loads(text))
    text, finish = answer(complete(http, grammar=CHOICE))
    assert finish == "stop" and in_choice_language(text), text
    chunks = stream_chunks(http, "/v1/completions", {"prompt": "Answer:", "grammar": CHOICE})
    assert "".join(c["choices"][0]["text"] for c in chunks) == text


def test_chat_takes_a_grammar(http):
    text, finish = answer(chat(http, grammar=CHOICE))
    assert finish == "stop" and in_choice_language(text), text


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format.json_schema.schema"),
    ({"grammar": 'root ::= "a" | ('}, "grammar"),
    ({"grammar": "root ::= undefined-rule"}, "grammar"),
    ({"grammar": 'start ::= "a"'}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format.json_schema.name"),
    ({"grammar": CHOICE, "response_format": {"type": "json_object"}}, "grammar"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"grammar": ""}, "grammar")])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_schema_or_grammar_is_one_clear_400(http, body, param, stream, path):
    base = {"messages": QUESTION} if "chat" in path else {"prompt": "Answer:"}
    r = http.post(path, json={"model": MODEL, "max_tokens": 8, "stream": stream, **base, **body})
    assert_error(r, 400, param=param,
                 code="missing_required_parameter" if param.endswith(".name") else "invalid_value")
    assert answer(chat(http, max_tokens=4))  # still serving


# -- forced tool calls -----------------------------------------------------------------------------
def calls_of(r) -> list[dict]:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    return choice["message"]["tool_calls"]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 5}], ids=["greedy", "seeded"])
def test_a_named_tool_choice_forces_that_call(http, sampling):
    (call,) = calls_of(chat(http, tools=TOOLS, tool_choice=NAMED, **sampling))
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "paint"
    check_arguments("paint", call["function"]["arguments"])
    (call,) = calls_of(chat(http, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "count"}},
                            **sampling))
    assert call["function"]["name"] == "count"
    check_arguments("count", call["function"]["arguments"])


def test_required_forces_a_call_of_one_of_the_tools(http):
    names = set()
    for seed in range(4):
        (call,) = calls_of(chat(http, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed))
        check_arguments(call["function"]["name"], call["function"]["arguments"])
        names.add(call["function"]["name"])
    assert names <= {"paint", "count"}


def test_a_forced_call_streamed(http):
    whole = calls_of(chat(http, tools=TOOLS, tool_choice=NAMED))
    chunks = stream_chunks(http, "/v1/chat/completions", {"messages": QUESTION, "tools": TOOLS, "tool_choice": NAMED})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any(d.get("content") for d in deltas)
    parts = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert parts[0]["function"]["name"] == "paint" and parts[0]["index"] == 0
    assert "".join(p["function"]["arguments"] for p in parts) == whole[0]["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_forced_call_wins_over_response_format_and_refuses_a_grammar(http):
    (call,) = calls_of(chat(http, tools=TOOLS, tool_choice=NAMED, response_format=JSON_SCHEMA))
    check_arguments("paint", call["function"]["arguments"])
    assert_error(chat(http, tools=TOOLS, tool_choice="required", grammar=CHOICE), 400, param="grammar",
                 code="invalid_value")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "nonsense"}}}}}
    assert_error(chat(http, tools=[bad], tool_choice="required", stream=True), 400, param="tools",
                 code="invalid_value")


def test_auto_is_not_forced(http):
    r = chat(http, tools=TOOLS, tool_choice="auto", max_tokens=12)
    text, _ = answer(r)
    assert parse_tool_calls(text or "", frozenset({"paint", "count"}))[1] == []


def test_the_openai_client_gets_a_forced_call_and_a_schema_answer(http):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="unused", http_client=http, max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=NAMED,
                                       max_tokens=120, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "paint"
    check_arguments("paint", call.function.arguments)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, response_format=JSON_SCHEMA,
                                       max_tokens=120, temperature=0)
    check_schema(json.loads(r.choices[0].message.content))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                       extra_body={"grammar": 'root ::= "a" | ('})
