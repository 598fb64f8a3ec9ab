"""A grammar that constrains the target's tokens: llama.cpp's GBNF matcher over the target's vocabulary.

``Grammar`` wraps llama.cpp's grammar sampler (``llama_sampler_init_grammar``: the GBNF parser and the
matcher of token pieces against the grammar's stacks; ``llama_sampler_apply`` sets the logit of every
token the grammar cannot take next to -inf, ``llama_sampler_accept`` advances it by a token; an
end-of-generation token is allowed only where the grammar is complete). The host chooser
(``host_choice.HostChooser``) masks each row with it before its choice and advances it by each emitted
token, in order, so plain and speculative decoding choose from the same constrained distribution (greedy:
the argmax of the allowed tokens; sampled: the tokens the request's filters keep, less those the grammar
rejects: ``host_choice.constrained_draw``).
``cut`` removes the draft nodes the grammar rejects before verification: fewer wasted nodes, the same
output.

JSON: ``json_grammar(None)`` is llama.cpp's grammar of any JSON value; ``json_grammar(schema)`` a JSON
schema's grammar from llama-cpp-python's port of llama.cpp's converter (``json_schema_to_gbnf``), which
ignores an integer's bounds: here an integer with a lower bound (``minimum``/``exclusiveMinimum``), an
upper one (``maximum``/``exclusiveMaximum``) or both gets a grammar of exactly its range
(``int_range_gbnf``; a side without a bound stops at 16 digits, as the converter's integers do). A
number's bounds stay unenforced.
"""
from __future__ import annotations

import ctypes
import json
import math

import llama_cpp as lc
import numpy as np

_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class GrammarError(ValueError):
    """A grammar llama.cpp cannot parse, or a JSON schema the converter cannot turn into one."""


def _digit_ranges(a: str, b: str) -> list[str]:
    """GBNF sequences matching the decimal strings from ``a`` to ``b`` (the same length, ``a <= b``)."""
    n = len(a)
    if n == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [f'"{a[0]}" {p}' for p in _digit_ranges(a[1:], b[1:])]
    out, first, last = [], int(a[0]), int(b[0])
    if a[1:] != "0" * (n - 1):  # a's first digit with a's tail and up
        out += [f'"{a[0]}" {p}' for p in _digit_ranges(a[1:], "9" * (n - 1))]
        first += 1
    tail = []
    if b[1:] != "9" * (n - 1):  # b's first digit up to b's tail
        tail = [f'"{b[0]}" {p}' for p in _digit_ranges("0" * (n - 1), b[1:])]
        last -= 1
    if first <= last:
        out.append(f"[{first}-{last}]" + " [0-9]" * (n - 1))
    return out + tail


def _natural_ranges(lo: int, hi: int) -> list[str]:
    """GBNF sequences matching the integers ``lo..hi`` (``0 <= lo <= hi``) written without leading zeros."""
    out = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10 ** n - 1)
        if a <= b:
            out += _digit_ranges(str(a), str(b))
    return out


#: the most digits of an integer on a side without a bound (the converter's own integers have at most 16)
MAX_DIGITS = 16


def int_range_gbnf(lo: int, hi: int) -> str:
    """A GBNF expression matching exactly the JSON integers ``lo..hi`` (``lo <= hi``), e.g. ``-5..12``."""
    alts = [f"({p})" for p in _natural_ranges(max(lo, 0), hi)] if hi >= 0 else []
    if lo < 0:
        alts += [f'"-" ({p})' for p in _natural_ranges(max(1, -hi), -lo)]
    return " | ".join(alts)


def _int_bounds(schema: dict) -> tuple[int, int] | None:
    """An integer schema's inclusive bounds, a side without one being the ``MAX_DIGITS``-digit limit, or
    None when it has neither."""
    def num(key):
        v = schema.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    lows = [f(v) for key, f in (("minimum", math.ceil), ("exclusiveMinimum", lambda v: math.floor(v) + 1))
            if (v := num(key)) is not None]
    highs = [f(v) for key, f in (("maximum", math.floor), ("exclusiveMaximum", lambda v: math.ceil(v) - 1))
             if (v := num(key)) is not None]
    if not lows and not highs:
        return None
    return max(lows, default=1 - 10 ** MAX_DIGITS), min(highs, default=10 ** MAX_DIGITS - 1)


def _check_satisfiable(schema: dict) -> None:
    """Raise ValueError for a schema keyword combination nothing can match (the converter would write a
    grammar that matches something else)."""
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength"), ("minProperties", "maxProperties")):
        lo, hi = schema.get(low), schema.get(high)
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            raise ValueError(f"{low} {lo} is more than {high} {hi}: nothing matches")
    if schema.get("enum") == []:
        raise ValueError("an empty enum matches nothing")
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if schema.get("additionalProperties") is False and isinstance(schema.get("required"), list):
        missing = [p for p in schema["required"] if p not in props]
        if missing:
            raise ValueError(f"required {missing[0]!r} is not among the properties and additionalProperties "
                             f"is false: nothing matches")


def _anchored(pattern: str) -> str:
    """A JSON-schema ``pattern`` (matched anywhere in the string, as ECMAScript's ``search``) as the whole-
    string form the converter takes: ``^A(p)A$``, where ``A`` (any characters but a quote, a backslash or
    a line break: the converter's ``.`` would let a raw quote end the JSON string) is left out on a side
    the pattern anchors."""
    starts = pattern.startswith("^")
    ends = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if starts else 0:len(pattern) - 1 if ends else None]
    pad = '[^"\\\\\\n\\r]*'
    return f"^{'' if starts else pad}({body}){'' if ends else pad}$"


def _converter():
    from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

    class Converter(SchemaConverter):
        """llama-cpp-python's converter, with integer bounds (``int_range_gbnf``), unanchored patterns
        (``_anchored``) and unsatisfiable keyword combinations refused (``_check_satisfiable``)."""

        def _visit_pattern(self, pattern, name):
            return super()._visit_pattern(_anchored(pattern), name)

        def visit(self, schema, name):
            if isinstance(schema, dict):
                _check_satisfiable(schema)
            bounds = _int_bounds(schema) if isinstance(schema, dict) and schema.get("type") == "integer" else None
            if bounds is None:
                return super().visit(schema, name)
            if bounds[0] > bounds[1]:
                raise ValueError(f"the integer range {bounds[0]}..{bounds[1]} is empty")
            self._add_rule("space", '" "?')
            rule = name + "-" if name in RESERVED_NAMES else name or "root"
            return self._add_rule(rule, f"({int_range_gbnf(*bounds)}) space")

    return Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_grammar(schema: dict | None, root: str = "root") -> str:
    """GBNF for a JSON object (``schema`` None: any JSON object, llama.cpp's ``json.gbnf``) or for the
    values a JSON ``schema`` (a dict) allows, its start rule named ``root`` (another name lets the rules
    be part of a larger grammar). Raises GrammarError for a schema the converter refuses."""
    from llama_cpp.llama_grammar import JSON_GBNF

    if schema is None and root == "root":
        return JSON_GBNF
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:  # llama-cpp-python's json_schema_to_gbnf, with the start rule's name given
        converter = _converter()
        converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "stdin"),
                        "" if root == "root" else root)
        return converter.format_grammar()
    except (ValueError, KeyError, TypeError, AssertionError, NotImplementedError, RecursionError) as e:
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {e}") from None


#: the deepest nesting of groups a grammar may have: llama.cpp's GBNF parser recurses once per group,
#: and a grammar nested some ten thousand groups deep overflows its stack (the process dies). A JSON
#: schema's converter nests one group per optional item or character (``maxItems``, ``maxLength``).
MAX_NESTING = 1024


def nesting_depth(gbnf: str) -> int:
    """The deepest nesting of parenthesised groups in GBNF text (literals, character classes and comments
    skipped)."""
    depth = deepest = 0
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch in "\"[":  # a literal or a character class: up to its unescaped closing character
            end = '"' if ch == '"' else "]"
            i += 1
            while i < n and gbnf[i] != end:
                i += 2 if gbnf[i] == "\\" else 1
        elif ch == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        i += 1
    return deepest


class Grammar:
    """A compiled GBNF grammar and its state after the tokens accepted so far.

    Args:
        model: the target (``llama.model.Model``): its vocabulary's pieces are matched.
        gbnf: the grammar text; ``root`` its start rule.
    Raises GrammarError when llama.cpp cannot parse it (llama.cpp logs the reason on stderr), or when its
    groups nest deeper than ``MAX_NESTING``.
    """

    def __init__(self, model, gbnf: str, root: str = "root", _ptr=None):
        self.model, self.gbnf, self.root = model, gbnf, root
        self.n_vocab = int(model.n_vocab)
        if _ptr is None:
            if not isinstance(gbnf, str) or not gbnf.strip():
                raise GrammarError("the grammar is empty")
            if (depth := nesting_depth(gbnf)) > MAX_NESTING:
                raise GrammarError(f"the grammar nests {depth} groups deep, more than the {MAX_NESTING} llama.cpp's "
                                   f"parser takes (a JSON schema's maxItems or maxLength above about "
                                   f"{MAX_NESTING} does this)")
            _ptr = lc.llama_sampler_init_grammar(model.vocab, gbnf.encode(), root.encode())
            if not _ptr:
                raise GrammarError(f"llama.cpp could not parse the grammar (start rule {root!r}): "
                                   f"{gbnf[:200]!r}")
        self.ptr = _ptr
        self._one = np.zeros(1, _DATA)
        self._all: np.ndarray | None = None  # the whole row, made at the first ``mask`` (clones rarely mask)

    def _apply(self, data: np.ndarray) -> None:
        arr = lc.llama_token_data_array(data.ctypes.data_as(lc.llama_token_data_p), data.shape[0], -1, False)
        lc.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        """Whether the grammar can take ``token`` next."""
        self._one["id"], self._one["logit"] = int(token), 0.0
        self._apply(self._one)
        return bool(self._one["logit"][0] > -np.inf)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits [n_vocab]`` float32 with every token the grammar cannot take next at -inf (a new
        array). Raises RuntimeError when it allows no token at all (a grammar that cannot go on)."""
        if self._all is None:
            self._all = np.zeros(self.n_vocab, _DATA)
            self._all["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._all["logit"] = logits
        self._apply(self._all)
        out = self._all["logit"].copy()
        if not (out > -np.inf).any():
            raise RuntimeError("the grammar allows no token here (it cannot be completed)")
        return out

    def accept(self, token: int) -> None:
        """Advance the grammar by ``token``. Raises ValueError when the grammar does not allow it (checked
        first: llama.cpp would abort the process)."""
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        lc.llama_sampler_accept(self.ptr, int(token))

    def clone(self) -> "Grammar":
        """A copy of the grammar in its current state (advanced independently)."""
        return Grammar(self.model, self.gbnf, self.root, _ptr=lc.llama_sampler_clone(self.ptr))

    def cut(self, tree):
        """``tree`` (``tree.Tree``, its root the last emitted token, already accepted) without the drafted
        nodes whose path the grammar rejects: every node kept is a token the grammar allows after its
        ancestors. A chain is cut at its first rejected token."""
        keep = np.ones(len(tree), bool)
        parent_of_some = np.zeros(len(tree), bool)
        parent_of_some[tree.parents[1:]] = True
        states: dict[int, Grammar] = {0: self}
        owned = []
        try:
            for i in range(1, len(tree)):
                p = int(tree.parents[i])
                g = states.get(p) if keep[p] else None
                if g is None or not g.allows(int(tree.tokens[i])):
                    keep[i] = False
                    continue
                if not parent_of_some[i]:
                    continue  # a leaf: its state is never asked for
                child = g.clone()
                owned.append(child)
                child.accept(int(tree.tokens[i]))
                states[i] = child
        finally:
            for g in owned:
                g.close()
        return tree if keep.all() else tree.select(keep)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self):
        self.close()
