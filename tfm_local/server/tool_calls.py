"""Tool calls in a model's answer → OpenAI ``tool_calls``.

Two forms of a call are read, those of Qwen2.5's chat template and of its models:

- a block ``<tool_call>`` JSON object ``</tool_call>`` (the form the template asks for, as Hermes-style
  templates do), whatever the function's name;
- a fenced block ``````json`` + newline, JSON object, ``````` (Qwen2.5-Coder answers a tools prompt so),
  only when the object's ``name`` is one of the request's tools (``names``): other fenced JSON is the
  answer's code, and stays text.

The object is ``{"name": str, "arguments": object}`` (``parse_call_body``), whitespace around it
allowed. Everything outside the blocks is the answer's ``content``, except the whitespace next to a
block that became a call (the newlines between calls): it is dropped, but for the whitespace before
text that follows calls when text came before them (``"A\\n<call>\\nB"`` has content ``"A\\nB"``). An
answer of calls only has ``content`` None.

A block whose text is not such an object (malformed JSON, no name, arguments that are not an object,
another key: a model that sums up a tool's result in a fenced block writes ``"response"`` beside them),
or one still open at the end of the answer, is not a call: its text, tags or fences included, stays in
the content, so nothing is ever invented. A closing tag or fence inside a JSON string ends the block
there (the JSON is then malformed: content).

``ToolCallStream`` parses pieces as they are generated and is the one parser: ``parse_tool_calls``
feeds it the whole text. What it gives out does not depend on where the text is split: it holds back a
tail that may begin an opening, trailing whitespace until the next text shows what it is, a
``<tool_call>`` block until it closes, and a fenced block while its text can still be the start of a
call of one of ``names`` (``{"name": "<one of them>"``), until it closes.

``forced_call_grammar`` is the GBNF of exactly one ``<tool_call>`` block whose object names one of the
request's functions and whose ``arguments`` follow that function's ``parameters`` schema: the grammar
of a forced ``tool_choice`` ("required" or a named function).
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Callable, Union

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE_OPEN, FENCE_CLOSE = "```json\n", "```"


def forced_call_grammar(tools: list[dict], name: str | None, special_tags: bool = False) -> str:
    """GBNF of one tool call as Qwen2.5's template writes it and ``parse_tool_calls`` reads it:
    ``<tool_call>`` newline, ``{"name": NAME, "arguments": {...}}``, newline, ``</tool_call>``, nothing
    around it; the arguments follow the function's ``parameters`` JSON schema (any JSON object without
    one).

    Args:
        tools: the request's tools, OpenAI's shape (``{"type": "function", "function": {"name", ...}}``).
        name: the function to call; None: any one of ``tools``.
        special_tags: write the tags as GBNF token references (``<tool_call>``), which match only the
            vocabulary's single token of that text (Qwen2.5's added tokens); parsing such a grammar fails
            with a vocabulary that has no such token. False: text literals, which match any spelling of
            the tags, the single token included.
    Raises ValueError when ``name`` is not among ``tools``, ``decode.grammar.GrammarError`` (a
    ValueError) when a ``parameters`` schema cannot be turned into a grammar.
    """
    from ..decode.grammar import json_grammar

    functions = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not functions:
        raise ValueError(f"no tool named {name!r} among the tools" if name else "no tools to call")
    objects = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                 "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
    call = json_grammar(objects[0] if len(objects) == 1 else {"anyOf": objects}, root="call")
    tags = (OPEN, CLOSE) if special_tags else (json.dumps(OPEN), json.dumps(CLOSE))
    return f'root ::= {tags[0]} "\\n" call "\\n" {tags[1]}\n' + call


def new_call_id() -> str:
    """A fresh tool-call id, ``call_`` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made.

    Attributes:
        index: the call's place among the answer's calls (0, 1, ...).
        id: the call's id (``call_...``), which the client's tool result names as ``tool_call_id``.
        name: the function's name, as the model wrote it (not checked against the request's tools).
        arguments: the arguments as JSON text of an object (compact separators, non-ASCII kept).
    """

    index: int
    id: str
    name: str
    arguments: str

    def message_entry(self) -> dict:
        """The call as an entry of a chat message's ``tool_calls`` (OpenAI's shape)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def stream_deltas(self) -> list[dict]:
        """The call as two streamed ``delta`` objects (OpenAI's shape): the first opens it (index, id,
        type, name, empty arguments), the second adds its arguments text."""
        return [{"tool_calls": [{"index": self.index, "id": self.id, "type": "function",
                                 "function": {"name": self.name, "arguments": ""}}]},
                {"tool_calls": [{"index": self.index, "function": {"arguments": self.arguments}}]}]


#: What the parser gives out, in order: content text (never empty) or a call.
Event = Union[str, ToolCall]


def parse_call_body(body: str, index: int, new_id: Callable[[], str] = new_call_id) -> ToolCall | None:
    """The call that a block's inner text ``body`` holds, as call ``index`` with the id ``new_id()``
    makes (called only for a call); None when ``body`` is not a JSON object with a non-empty string
    ``name``, ``arguments`` an object (absent: ``{}``; a string holding a JSON object is accepted
    too) and no other key. Never raises."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if set(obj) - {"name", "arguments"}:  # other keys: not a call but, say, a summary of one's result
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(index, new_id(), obj["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":")))


def _open_prefix_len(text: str, openings: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``openings``."""
    for n in range(min(len(text), max(map(len, openings)) - 1), 0, -1):
        if any(o.startswith(text[-n:]) for o in openings):
            return n
    return 0


def may_open_call(text: str, names: frozenset[str]) -> bool:
    """True while ``text`` (a fenced block's text so far) can still begin a call of one of ``names``:
    it is a prefix of ``{"name": "N`` (JSON whitespace anywhere between the tokens) for some N of
    ``names``, or goes on from ``{"name": "N"`` with N one of them. Once False, False for every
    longer ``text``."""
    s = text.lstrip()
    for token in ("{", '"name"', ":", '"'):
        if len(s) < len(token):
            return token.startswith(s)
        if not s.startswith(token):
            return False
        s = s[len(token):].lstrip() if token != '"' else s[len(token):]
    end = s.find('"')
    if end < 0:
        return any(n.startswith(s) for n in names)
    return s[:end] in names


class ToolCallStream:
    """Incremental parser of one answer (the module doc states the format and the rules).

    ``feed(piece)`` returns the events that ``piece`` completes; ``finish()`` those left at the end.
    Content events of one answer joined, and its calls, are the same however the text was split.

    Args:
        names: the request's function names: a fenced block is a call only of one of them (empty: fenced
            blocks are text).
        new_id: makes each call's id (default ``new_call_id``; tests pass a counter).
    """

    def __init__(self, names: frozenset[str] = frozenset(), new_id: Callable[[], str] = new_call_id):
        self._names = frozenset(names)
        self._openings = (OPEN, FENCE_OPEN) if self._names else (OPEN,)
        self._new_id = new_id
        self._buf = ""        # not yet given out: a possible start of an opening, or an open block's text
        self._space = ""      # whitespace held back: given out only if text (not a call) follows
        self._block: tuple[str, str] | None = None  # the open block's (opening, closing)
        self._after_call = False  # the last thing given out was a call
        self._given = False       # some content was given out
        self.n_calls = 0

    def _text(self, text: str, out: list[Event]) -> None:
        """Give out ``text`` (outside any block), holding back its trailing whitespace."""
        if self._after_call:
            rest = text.lstrip()
            self._space += text[:len(text) - len(rest)]
            if not rest:
                return
            self._after_call = False
            if not self._given:
                self._space = ""
            text = rest
        body = text.rstrip()
        if body:
            out.append(self._space + body)
            self._space, self._given = "", True
        self._space += text[len(body):]

    def feed(self, piece: str) -> list[Event]:
        """The events completed by ``piece`` (a string; may be empty)."""
        self._buf += piece
        out: list[Event] = []
        while True:
            if self._block is not None:
                if not self._close_block(out):
                    return out
                continue
            found = [(i, o) for o in self._openings if (i := self._buf.find(o)) >= 0]
            if found:
                start, opening = min(found)
                self._text(self._buf[:start], out)
                self._buf = self._buf[start + len(opening):]
                self._block = (opening, CLOSE if opening == OPEN else FENCE_CLOSE)
                continue
            keep = _open_prefix_len(self._buf, self._openings)
            self._text(self._buf[:len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep:]
            return out

    def _close_block(self, out: list[Event]) -> bool:
        """Settle the open block if its text allows: a call or text once it closes; for a fenced block,
        its opening as text (its body then read again as text) once it can no longer be a call.
        False when the block needs more text."""
        opening, closing = self._block
        end = self._buf.find(closing)
        if opening == FENCE_OPEN:
            body = self._buf if end < 0 else self._buf[:end]
            if end < 0:  # a tail of backticks may be the start of the closing fence: judged once it is known
                body = body[:len(body) - _open_prefix_len(body, (closing,))]
            if not may_open_call(body, self._names):
                self._block = None
                self._text(opening, out)
                return True
        if end < 0:
            return False
        body, self._buf = self._buf[:end], self._buf[end + len(closing):]
        self._block = None
        call = parse_call_body(body, self.n_calls, self._new_id)
        if call is None or (opening == FENCE_OPEN and call.name not in self._names):
            lead = "" if self._after_call and not self._given else self._space
            out.append(lead + opening + body + closing)
            self._after_call, self._given = False, True
        else:
            out.append(call)
            self.n_calls += 1
            self._after_call = True
        self._space = ""
        return True

    def finish(self) -> list[Event]:
        """The events left at the end of the answer: an unclosed block's text, a held-back tail, and
        the trailing whitespace unless a call came right before it. The stream is then spent."""
        out: list[Event] = []
        if self._block is not None:
            lead = "" if self._after_call and not self._given else self._space
            out.append(lead + self._block[0] + self._buf)
            self._space, self._block, self._given = "", None, True
        else:
            self._text(self._buf, out)
            if self._space and not self._after_call:
                out.append(self._space)
            self._space = ""
        self._buf = ""
        return out


def parse_tool_calls(text: str, names: frozenset[str] = frozenset(),
                     new_id: Callable[[], str] = new_call_id) -> tuple[str | None, list[ToolCall]]:
    """``(content, calls)`` of a whole answer: the text outside the call blocks (None when empty) and
    the calls in order (the module doc states the rules; ``names``: the request's function names, for
    fenced calls; ``new_id`` makes the ids)."""
    stream = ToolCallStream(names, new_id)
    events = stream.feed(text) + stream.finish()
    content = "".join(e for e in events if isinstance(e, str))
    return content or None, [e for e in events if isinstance(e, ToolCall)]


def stream_deltas(events: list[Event]) -> list[dict]:
    """The streamed ``delta`` objects of ``events``, in order: ``{"content": text}`` for text, two
    ``{"tool_calls": [...]}`` deltas for each call (``ToolCall.stream_deltas``)."""
    out: list[dict] = []
    for e in events:
        out.extend([{"content": e}] if isinstance(e, str) else e.stream_deltas())
    return out
