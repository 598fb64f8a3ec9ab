"""Emphasis: train more often on the responses to chosen prompts (e.g. writing and role-play).

A drafter distilled from ShareGPT sees mostly questions and code; MT-Bench's first turns are half
writing and role-play, where its acceptance is lowest. An emphasis file names prompts of one prompt
order (the ranks a corpus's ``prompt_index`` holds) whose training sequences ``fit`` repeats
``times`` times per epoch (``--emphasis`` / ``--emphasis-times``). Held-out sequences are split off
before and are never repeated, so the held-out proxy stays comparable with runs without emphasis.

File (``.npz``): ``ranks`` int32 ``[n]`` (sorted, distinct), ``order`` uint8 (UTF-8 JSON: the prompt
order, as ``fit.prompt_order`` computes it from a corpus manifest), ``rule`` uint8 (UTF-8 text: how
the ranks were chosen).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from ..files.atomic import atomic_output
from .errors import CorruptArtifactError, TrainError

# a keyword test for asking to write prose or to play a part (lower-cased last user message)
WRITING = re.compile(
    r"\b(write|compose|draft)\b.{0,40}\b(story|stories|poem|poems|essay|letter|email|e-mail|speech|"
    r"blog|article|song|lyrics|narrative|paragraph|introduction|chapter|scene|dialogue|tweet|"
    r"advertisement|cover letter|bio)\b"
    r"|\b(act as|pretend (to be|you are|you're)|role[- ]?play|you are (a|an|my) \w+|imagine you are|"
    r"in the style of|write (like|about)|story|stories|novel|fiction|fairy tale|once upon a time|poem|haiku|"
    r"sonnet|limerick)\b",
    re.S)
# ... unless it is about code (a prompt asking for a script, a function or a developer's help)
CODE = re.compile(r"\b(code|python|javascript|typescript|sql|bash|html|css|regex|api|json|react|django|docker|"
                  r"developer|function|(python|bash|shell|powershell|google app) script)\b")


# the kinds of prompt the held-out walk reports (``walk.walk_tau``), first match wins: role-play, code,
# math, writing; "other" for the rest
ROLEPLAY = re.compile(r"\b(act as|pretend (to be|you are|you're)|role[- ]?play|you are (a|an|my) \w+|imagine you are|"
                      r"in the style of)\b")
MATH = re.compile(r"\b(math|solve|equation|calculate|compute the|integral|derivative|probability|algebra|"
                  r"geometry|how many|how much|percent|sum of|prove)\b|\d+\s*[-+*/^×÷]\s*\d+")
KINDS = ("roleplay", "code", "math", "writing", "other")


def prompt_kind(prompt: str | list[dict]) -> str:
    """The kind of a prompt by its last user message (lower-cased): one of ``KINDS``."""
    t = last_user_text(prompt).casefold()
    if ROLEPLAY.search(t):
        return "roleplay"
    if CODE.search(t):
        return "code"
    if MATH.search(t):
        return "math"
    return "writing" if WRITING.search(t) else "other"


def save_kinds(path: str | os.PathLike, ranks: np.ndarray, kinds: list[str], order: str) -> Path:
    """Write a kinds file atomically: ``ranks`` int32, ``kind`` uint8 (index into ``KINDS``), ``order``
    (the prompt order, as an emphasis file's); returns its path."""
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ranks=np.asarray(ranks, dtype=np.int32), kind=np.array([KINDS.index(k) for k in kinds], np.uint8),
                     order=np.frombuffer(order.encode(), np.uint8))
    return Path(path)


def load_kinds(path: str | os.PathLike) -> tuple[str, dict[int, str]]:
    """(prompt order JSON, {rank: kind}) of a kinds file.

    Raises:
        FileNotFoundError: no such file. CorruptArtifactError: not a kinds file.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"kinds file not found: {path}")
    try:
        with np.load(path) as z:
            ranks, kind, order = z["ranks"], z["kind"], bytes(z["order"]).decode()
        json.loads(order)
        return order, {int(r): KINDS[int(k)] for r, k in zip(ranks, kind, strict=True)}
    except Exception as e:
        raise CorruptArtifactError(f"{path} is not a kinds file (tfm-train kinds): {type(e).__name__}: {e}") from e


def last_user_text(prompt: str | list[dict]) -> str:
    """The text of a prompt's last user message (a first turn is the prompt itself; "" without one)."""
    if isinstance(prompt, str):
        return prompt
    return next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")


def keyword_ranks(prompts: list, ranks: np.ndarray, rule: re.Pattern = WRITING,
                  unless: re.Pattern | None = CODE) -> np.ndarray:
    """int32 ``[k]``: the ``ranks`` (indices into ``prompts``) whose last user message (lower-cased)
    matches ``rule`` and not ``unless``.

    Raises:
        TrainError: a rank outside ``prompts``.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    if ranks.size and (ranks.min() < 0 or ranks.max() >= len(prompts)):
        raise TrainError(f"prompt ranks reach {int(ranks.max())}, past the {len(prompts)} prompts of the selection")
    texts = {int(r): last_user_text(prompts[r]).casefold() for r in ranks}
    hit = [r for r, t in texts.items() if rule.search(t) and not (unless and unless.search(t))]
    return np.array(sorted(set(hit)), dtype=np.int32)


def save_emphasis(path: str | os.PathLike, ranks: np.ndarray, order: str, rule: str) -> Path:
    """Write an emphasis file atomically (see the module doc); returns its path.

    Raises:
        TrainError: a negative rank.
    """
    ranks = np.unique(np.asarray(ranks, dtype=np.int32))
    if ranks.size and ranks[0] < 0:
        raise TrainError(f"prompt ranks must be >= 0, got {int(ranks[0])}")
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ranks=ranks, order=np.frombuffer(order.encode(), np.uint8),
                     rule=np.frombuffer(rule.encode(), np.uint8))
    return Path(path)


def load_emphasis(path: str | os.PathLike) -> tuple[str, set[int]]:
    """(prompt order JSON, set of ranks) of an emphasis file.

    Raises:
        FileNotFoundError: no such file.
        CorruptArtifactError: not an emphasis file (missing arrays, bad JSON, negative ranks).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"emphasis file not found: {path}")
    try:
        with np.load(path) as z:  # an .npy loads as an array, without the context manager: refused below
            ranks, order = z["ranks"], bytes(z["order"]).decode()
        json.loads(order)
    except Exception as e:  # a truncated zip, an empty file, an .npy, missing arrays, bad JSON
        raise CorruptArtifactError(f"{path} is not an emphasis file (tfm-train emphasis): "
                                   f"{type(e).__name__}: {e}") from e
    if ranks.ndim != 1 or not np.issubdtype(ranks.dtype, np.integer) or (ranks.size and ranks.min() < 0):
        raise CorruptArtifactError(f"{path}: ranks must be a 1-D array of non-negative integers")
    return order, {int(r) for r in ranks}


def emphasise(seqs: list, path: str | os.PathLike | None, times: int) -> tuple[list, int]:
    """(``seqs`` plus ``times - 1`` more copies of each sequence whose (``prompt_order``,
    ``prompt_index``) the emphasis file names, number of sequences emphasised).

    Raises:
        TrainError: ``times`` < 1, or no sequence of the file's prompt order (a file for other corpora).
        CorruptArtifactError / FileNotFoundError: as ``load_emphasis``.
    """
    if times < 1:
        raise TrainError(f"emphasis times must be >= 1, got {times}")
    if path is None:
        return seqs, 0
    order, ranks = load_emphasis(path)  # checked even with times 1
    if not any(s.prompt_order == order for s in seqs):
        raise TrainError(f"{path} names prompts of another prompt order than the corpora's: "
                         "build it from the prompt file the corpora were generated from")
    chosen = [s for s in seqs if s.prompt_order == order and s.prompt_index in ranks]
    return seqs + chosen * (times - 1), len(chosen)
