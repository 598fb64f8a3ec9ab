"""Integration: structured outputs on the real default target (Qwen2.5-Coder-1.5B-Instruct) with the
default Engine (its drafter on, speculation through the grammar), through the server's app.

Qwen2.5's vocabulary has ``<tool_call>`` and ``</tool_call>`` as tokens of their own, so a forced call's
grammar names them as GBNF tokens (``Service.special_tags``): the model writes its call as it was trained
to, and the server parses it into ``tool_calls``.
"""
import json

import pytest

from tfm_local.server.tool_calls import forced_call_grammar

pytestmark = pytest.mark.integration
MODEL = "qwen"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "student": {"type": "boolean"}},
          "required": ["name", "age", "student"], "additionalProperties": False}


@pytest.fixture(scope="module")
def http():
    from fastapi.testclient import TestClient

    from tfm_local.engine import Engine
    from tfm_local.server.app import create_app

    engine = Engine(n_ctx=2048)  # the default target and drafter, speculative decoding on
    assert engine.drafter is not None
    with TestClient(create_app(engine, MODEL)) as c:
        c.engine = engine
        yield c


def chat(http, messages, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 80,
                                                "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_the_tags_are_qwens_own_tokens(http):
    assert http.app.state.service.special_tags
    assert [len(http.engine.tok.encode(t, add_special=False)) for t in ("<tool_call>", "</tool_call>")] == [1, 1]
    assert forced_call_grammar([WEATHER], None, special_tags=True).startswith("root ::= <tool_call> ")


def test_a_forced_call_parses_with_valid_arguments(http):
    msgs = [{"role": "user", "content": "Is it warm in Lisbon today? Answer in celsius."}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        c = chat(http, msgs, tools=[WEATHER, TIME], tool_choice=choice)
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        assert c["message"]["content"] is None
        if choice == "required" and call["function"]["name"] == "get_time":
            assert json.loads(call["function"]["arguments"]) == {}
            continue
        assert call["function"]["name"] == "get_weather"
        args = json.loads(call["function"]["arguments"])
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
        assert "lisbon" in args["city"].lower()


def test_a_json_schema_answer_parses_and_matches(http):
    msgs = [{"role": "user", "content": "Make up a person: a name, an age and whether they are a student."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    c = chat(http, msgs, response_format=fmt, max_tokens=60)
    assert c["finish_reason"] == "stop", c
    obj = json.loads(c["message"]["content"])
    assert set(obj) == {"name", "age", "student"} and isinstance(obj["name"], str) and len(obj["name"]) <= 40
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 150 and isinstance(obj["student"], bool)
