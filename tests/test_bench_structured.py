"""tfm-bench structured's pieces on stand-in data: what counts as a valid answer, the per-kind summary,
the tool requests, and its grammars compiling on a tiny target (the run itself needs the real pair:
docs/structured-outputs.md)."""
import pytest

from tfm_local.bench.structured import SCHEMAS, TOOLS, summarise, task_grammar, tool_tasks, valid
from tfm_local.decode.grammar import Grammar
from tfm_local.testing.synth import write_tiny_target

JSON_TASK = dict(kind="json_schema", schema=SCHEMAS["gsm8k"])
TOOL_TASK = tool_tasks(1)[0]


@pytest.mark.parametrize("text,ok", [('{"answer": 3, "unit": "cm", "confident": true}', True),
                                     ('{"answer": 3, "unit": "cm"}', False), ("[1, 2]", False),
                                     ('{"answer": 3, "unit": "cm", "confident": true', False)])
def test_a_json_answer_is_valid_with_exactly_the_schemas_fields(text, ok):
    assert valid(JSON_TASK, text) == ok


@pytest.mark.parametrize("text,ok", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>', True),
    ('<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call>', False),
    ('Sure. <tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>', False),
    ("It is sunny.", False)])
def test_a_tool_answer_is_valid_as_one_call_of_a_listed_tool(text, ok):
    assert valid(TOOL_TASK, text) == ok


def test_summary_sums_tokens_and_decode_time_per_kind_and_sampling():
    def run(n, t, tau, finish="stop"):
        return dict(n=n, t_decode=t, tau=tau, finish=finish)

    rows = [dict(kind="json_schema", sampling="greedy", equal=True, valid=True, plain=run(11, 1.0, 1.0),
                 spec=run(11, 0.5, 2.5)),
            dict(kind="json_schema", sampling="greedy", equal=False, valid=False, plain=run(21, 3.0, 1.0, "length"),
                 spec=run(21, 1.5, 2.0)),
            dict(kind="tool_call", sampling="greedy", equal=True, valid=True, plain=run(5, 1.0, 1.0),
                 spec=run(5, 1.0, 1.0))]
    a, b = summarise(rows)
    assert (a["kind"], a["n"], a["equal"], a["valid"], a["finished"]) == ("json_schema", 2, 1, 1, 1)
    assert a["plain_tok_s"] == pytest.approx(30 / 4) and a["spec_tok_s"] == pytest.approx(30 / 2)
    assert a["speedup"] == pytest.approx(2.0) and a["tau"] == pytest.approx(30 / (10 / 2.5 + 20 / 2.0))
    assert (b["kind"], b["speedup"]) == ("tool_call", 1.0)


def test_the_tasks_grammars_compile(tmp_path):
    from tfm_local.llama.model import Model

    m = Model(write_tiny_target(tmp_path / "t.gguf"), n_gpu_layers=0)
    try:
        for task in (JSON_TASK, TOOL_TASK):
            Grammar(m, task_grammar(task)).close()
        assert {t["function"]["name"] for t in TOOLS} == {"get_weather", "search_code", "calculate"}
        assert len(tool_tasks(7)) == 7 and len({t["messages"][0]["content"] for t in tool_tasks(7)}) == 7
    finally:
        m.close()
