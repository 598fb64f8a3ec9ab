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

from .atomic import atomic_output
from .errors import CorruptArtifactError, TrainError

# a keyword test for asking to write prose or to play a part (lower-cased last user message)
WRITING = re.compile(
    r"\b(write|compose|draft)\b.{0,40}\b(story|stories|poem|poems|essay|letter|email|e-mail|speech|"
    r"blog|article|song|lyrics|script|post|narrative|paragraph|review|description|introduction|"
    r"chapter|scene|dialogue|tweet|ad|advertisement|cover letter|bio|summary)\b"
    r"|\b(act as|pretend (to be|you are|you're)|role[- ]?play|you are (a|an|my) \w+|imagine you are|"
    r"in the style of|write (like|about)|story|stories|novel|fiction|fairy tale|once upon a time|poem|haiku|sonnet|limerick)\b",
    re.S)


def last_user_text(prompt: str | list[dict]) -> str:
    """The text of a prompt's last user message (a first turn is the prompt itself)."""
    if isinstance(prompt, str):
        return prompt
    return next(m["content"] for m in reversed(prompt) if m["role"] == "user")


def keyword_ranks(prompts: list, ranks: np.ndarray, rule: re.Pattern = WRITING) -> np.ndarray:
    """int32 ``[k]``: the ``ranks`` (indices into ``prompts``) whose last user message matches ``rule``.

    Raises:
        TrainError: a rank outside ``prompts``.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    if ranks.size and (ranks.min() < 0 or ranks.max() >= len(prompts)):
        raise TrainError(f"prompt ranks reach {int(ranks.max())}, past the {len(prompts)} prompts of the selection")
    hit = [int(r) for r in ranks if rule.search(last_user_text(prompts[r]).casefold())]
    return np.array(sorted(set(hit)), dtype=np.int32)


def save_emphasis(path: str | os.PathLike, ranks: np.ndarray, order: str, rule: str) -> Path:
    """Write an emphasis file atomically (see the module doc); returns its path."""
    ranks = np.unique(np.asarray(ranks, dtype=np.int32))
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
    try:
        with np.load(path) as z:
            ranks, order = z["ranks"], bytes(z["order"]).decode()
        json.loads(order)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise CorruptArtifactError(f"{path} is not an emphasis file (tfm-train emphasis): {e}") from e
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
    if path is None or times == 1:
        return seqs, 0
    order, ranks = load_emphasis(path)
    if not any(s.prompt_order == order for s in seqs):
        raise TrainError(f"{path} names prompts of another prompt order than the corpora's: "
                         "build it from the prompt file the corpora were generated from")
    chosen = [s for s in seqs if s.prompt_order == order and s.prompt_index in ranks]
    return seqs + chosen * (times - 1), len(chosen)
