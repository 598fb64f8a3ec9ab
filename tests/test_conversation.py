"""tfm_local.conversation: the oldest turns of a long conversation are left out, whole; the system prompt stays."""
import pytest

from tfm_local.conversation import (ConversationTooLong, answer_room, fit_conversation, split_turns)
from tfm_local.decode.verify import ContextOverflowError


def msg(role: str, n: int) -> dict:
    """A message whose content is ``n`` characters (one token each under ``count``)."""
    return {"role": role, "content": "x" * n}


class Counter:
    """Prompt tokens of a conversation: its characters plus 3 per message and 2 for the generation prompt;
    counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, messages: list[dict]) -> int:
        self.calls += 1
        return sum(len(m["content"]) + 3 for m in messages) + 2


def conversation(n_turns: int, size: int = 20, system: bool = True) -> list[dict]:
    out = [msg("system", 10)] if system else []
    for _ in range(n_turns):
        out += [msg("user", size), msg("assistant", size)]
    return out[:-1]  # ends with the question to answer


def test_split_turns():
    sys_, u1, a1, t1, u2 = msg("system", 1), msg("user", 2), msg("assistant", 3), msg("tool", 4), msg("user", 5)
    greeting = msg("assistant", 6)
    assert split_turns([sys_, u1, a1, t1, u2]) == ([sys_], [[u1, a1, t1], [u2]])
    assert split_turns([sys_, greeting, u1, a1]) == ([sys_], [[greeting], [u1, a1]])
    assert split_turns([u1]) == ([], [[u1]])
    assert split_turns([sys_, msg("developer", 1)]) == ([sys_, msg("developer", 1)], [])


def test_a_conversation_that_fits_is_unchanged():
    conv = conversation(3)
    count = Counter()
    fitted = fit_conversation(conv, count, n_ctx=1000, reserve=100)
    assert fitted.messages == conv and fitted.messages is not conv
    assert fitted.n_dropped == 0 and fitted.n_tokens == count(conv)


@pytest.mark.parametrize("n_ctx,reserve", [(200, 50), (150, 20), (300, 100), (120, 1)])
def test_the_fewest_oldest_turns_are_left_out_whole(n_ctx, reserve):
    conv = conversation(12)
    count = Counter()
    fitted = fit_conversation(conv, count, n_ctx, reserve)
    kept = fitted.messages
    assert kept[0] == conv[0]  # the system prompt stays
    assert kept[1]["role"] == "user" and kept[1:] == conv[1 + fitted.n_dropped:]  # whole turns, oldest first
    assert fitted.n_dropped > 0 and fitted.n_dropped % 2 == 0
    assert fitted.n_tokens == count(kept) and count(kept) + reserve <= n_ctx
    one_turn_more = [conv[0]] + conv[1 + fitted.n_dropped - 2:]
    assert count(one_turn_more) + reserve > n_ctx  # the fewest: one turn more would not fit


def test_counts_the_conversation_a_logarithmic_number_of_times():
    conv = conversation(500)
    count = Counter()
    fit_conversation(conv, count, n_ctx=400, reserve=50)
    assert count.calls <= 2 + 10  # the whole, the last turn, then a binary search over 499 turns


def test_without_a_system_prompt():
    conv = conversation(6, system=False)
    fitted = fit_conversation(conv, Counter(), n_ctx=100, reserve=10)
    assert fitted.messages[0]["role"] == "user" and fitted.messages == conv[fitted.n_dropped:]


def test_the_last_turn_stays_even_without_room_for_the_whole_answer():
    """Only the system prompt and the last turn fit, with less than ``reserve`` left: they are sent (the answer
    is cut at the end of the context)."""
    conv = conversation(4, size=30)
    count = Counter()
    n_last = count([conv[0], conv[-1]])
    fitted = fit_conversation(conv, count, n_ctx=n_last + 5, reserve=50)
    assert fitted.messages == [conv[0], conv[-1]] and fitted.n_dropped == len(conv) - 2


def test_a_last_turn_over_the_context_is_refused():
    conv = conversation(4, size=30)
    count = Counter()
    n_last = count([conv[0], conv[-1]])
    with pytest.raises(ConversationTooLong) as info:
        fit_conversation(conv, count, n_ctx=n_last, reserve=10)
    assert isinstance(info.value, ContextOverflowError)
    assert (info.value.n_tokens, info.value.n_ctx, info.value.n_dropped) == (n_last, n_last, len(conv) - 2)
    assert f"{n_last} tokens" in str(info.value)
    single = [msg("user", 100)]
    with pytest.raises(ConversationTooLong, match="the prompt is 105 tokens"):
        fit_conversation(single, count, n_ctx=50, reserve=10)


def test_bad_reserve():
    with pytest.raises(ValueError, match="reserve"):
        fit_conversation(conversation(2), Counter(), n_ctx=100, reserve=0)


@pytest.mark.parametrize("n_ctx,max_tokens,want", [
    (4096, 1024, 1024),   # tfm-chat's defaults: the whole answer
    (256, 100, 100),
    (256, 1024, 128),     # at most half the context
    (4096, None, 1024),   # absent: a quarter of it
    (2, None, 1),         # at least 1
])
def test_answer_room(n_ctx, max_tokens, want):
    assert answer_room(n_ctx, max_tokens) == want
