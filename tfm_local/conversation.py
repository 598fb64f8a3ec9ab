"""Fitting a conversation into the context: the oldest turns are left out, the system prompt stays.

A conversation (OpenAI-style chat messages) is cut into its head, the system messages it starts
with, and its turns: each ``user`` message with the messages after it up to the next ``user``
message (the assistant's answer, tool results); messages before the first ``user`` message form a
turn of their own. ``fit_conversation`` leaves out the fewest oldest turns, whole, so that the
rendered prompt leaves ``reserve`` tokens of the context for the answer; the head and the last turn
are always kept. tfm-chat and tfm-serve use it unless told to refuse instead (``--no-truncate``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .decode.verify import ContextOverflowError

#: Roles that make up the head of a conversation (kept whatever its length).
SYSTEM_ROLES = ("system", "developer")


class ConversationTooLong(ContextOverflowError):
    """Even with every earlier turn left out, the conversation leaves no room for 1 new token.

    Attributes: n_tokens (the prompt's tokens as left), n_ctx, n_dropped (messages left out).
    """

    def __init__(self, message: str, n_tokens: int, n_ctx: int, n_dropped: int):
        super().__init__(message)
        self.n_tokens, self.n_ctx, self.n_dropped = n_tokens, n_ctx, n_dropped


@dataclass(frozen=True)
class Fitted:
    """A conversation cut to fit the context.

    Attributes:
        messages: the messages to send: the head, then the kept turns, in their order.
        n_dropped: how many messages (not turns) were left out, all from the oldest turns.
        n_tokens: prompt tokens of ``messages`` (as counted by ``fit_conversation``'s ``count``).
    """

    messages: list[dict]
    n_dropped: int
    n_tokens: int


def split_turns(messages: Sequence[dict]) -> tuple[list[dict], list[list[dict]]]:
    """``(head, turns)`` of a conversation: its leading system messages, then its turns (see the module
    doc). Every message is in exactly one of them, in order; ``turns`` is [] when only the head is."""
    messages = list(messages)
    n_head = 0
    while n_head < len(messages) and messages[n_head].get("role") in SYSTEM_ROLES:
        n_head += 1
    turns: list[list[dict]] = []
    for m in messages[n_head:]:
        if not turns or m.get("role") == "user":
            turns.append([])
        turns[-1].append(m)
    return messages[:n_head], turns


def answer_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens to keep free for the answer when fitting a conversation into ``n_ctx`` tokens:
    ``max_tokens``, or a quarter of the context when it is None, and never more than half of it
    (a longer answer is cut at the end of the context, as before), at least 1."""
    want = n_ctx // 4 if max_tokens is None else max_tokens
    return max(1, min(want, n_ctx // 2))


def fit_conversation(messages: Sequence[dict], count: Callable[[list[dict]], int], n_ctx: int,
                     reserve: int) -> Fitted:
    """Leave out the fewest oldest turns of ``messages`` so that the prompt plus ``reserve`` tokens fit
    in ``n_ctx``; the head and the last turn always stay.

    Args:
        messages: chat messages (dicts with a ``role``), the newest last.
        count: prompt tokens of a list of messages (the rendered chat template with its generation
            prompt, e.g. ``len(engine.prompt_tokens(m))``); called O(log turns) times, and must not grow
            when turns are left out.
        n_ctx: the context, in tokens.
        reserve: tokens to leave for the answer (>= 1). When even the head and the last turn leave less,
            they are returned all the same if they leave at least 1 (the answer is then cut at the end
            of the context).

    Returns:
        A ``Fitted``; ``n_dropped`` is 0 and ``messages`` a copy of the input when it fits as it is.

    Raises:
        ConversationTooLong: the head and the last turn alone leave no room for 1 new token.
        ValueError: ``reserve`` < 1.
    """
    if reserve < 1:
        raise ValueError(f"reserve must be >= 1 token, got {reserve}")
    head, turns = split_turns(messages)

    def kept(k: int) -> list[dict]:  # the conversation without its k oldest turns
        return head + [m for turn in turns[k:] for m in turn]

    n = count(kept(0))
    if n + reserve <= n_ctx or len(turns) <= 1:
        return _checked(Fitted(kept(0), 0, n), n_ctx)
    last = len(turns) - 1
    n_last = count(kept(last))
    if n_last + reserve > n_ctx:  # only the head and the last turn can stay
        return _checked(Fitted(kept(last), len(messages) - len(kept(last)), n_last), n_ctx)
    lo, hi, n_hi = 1, last, n_last  # the fewest turns to leave out is in [lo, hi]; hi fits
    while lo < hi:
        mid = (lo + hi) // 2
        n_mid = count(kept(mid))
        if n_mid + reserve <= n_ctx:
            hi, n_hi = mid, n_mid
        else:
            lo = mid + 1
    out = kept(hi)
    return Fitted(out, len(messages) - len(out), n_hi)


def _checked(fitted: Fitted, n_ctx: int) -> Fitted:
    """``fitted`` itself, or ConversationTooLong when its prompt leaves no room for 1 new token."""
    if fitted.n_tokens + 1 > n_ctx:
        what = ("the prompt is" if not fitted.n_dropped else
                "with every earlier turn left out, the system prompt and the last turn are")
        raise ConversationTooLong(
            f"{what} {fitted.n_tokens} tokens; the context holds {n_ctx} (prompt + at least 1 new token). "
            "Shorten the last message or raise the context size.", fitted.n_tokens, n_ctx, fitted.n_dropped)
    return fitted
