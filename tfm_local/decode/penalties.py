"""Repetition penalties on the target's logits: OpenAI's frequency and presence penalties over the
tokens generated so far, and llama.cpp's repeat penalty over a window of recent tokens.

For a logit ``x`` of token ``j`` (float32, llama.cpp's penalty sampler's arithmetic and order):

* repeat penalty ``r`` when ``j`` is among the last ``repeat_last_n`` tokens of prompt and output:
  ``x / r`` for ``x > 0``, ``x * r`` otherwise;
* then ``x - c_j * frequency_penalty - (c_j > 0) * presence_penalty`` with ``c_j`` the number of times
  ``j`` was generated so far (OpenAI's definition; the prompt does not count).

The penalised logits replace the raw ones everywhere after: the filters (top-k, top-p, min-p), the
temperature, the greedy argmax and the log-probabilities (``logprobs``).
"""
from __future__ import annotations

from collections import Counter, deque

import numpy as np


class Penalties:
    """The penalty state of one generation: counts of the generated tokens and the repeat window.

    Args:
        sp: a ``sampling.SamplingParams`` (its penalty fields).
        prompt_ids: the prompt's token ids; the repeat window starts with their last ``repeat_last_n``.
    """

    def __init__(self, sp, prompt_ids):
        self.frequency = np.float32(sp.frequency_penalty)
        self.presence = np.float32(sp.presence_penalty)
        self.repeat = np.float32(sp.repeat_penalty)
        n = int(sp.repeat_last_n)
        self._window_on = self.repeat != 1 and n != 0
        start = list(prompt_ids)[-n:] if n > 0 else list(prompt_ids)
        self._window = deque(start if self._window_on else (), maxlen=n if n > 0 else None)
        self._in_window = Counter(self._window)
        self.counts: Counter = Counter()  # generated token id -> times

    def push(self, token: int) -> None:
        """Record an emitted token (it is generated, and enters the repeat window)."""
        token = int(token)
        self.counts[token] += 1
        if not self._window_on:
            return
        if self._window.maxlen is not None and len(self._window) == self._window.maxlen:
            old = self._window[0]
            self._in_window[old] -= 1
            if not self._in_window[old]:
                del self._in_window[old]
        self._window.append(token)
        self._in_window[token] += 1

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The penalised copy of one logit row ``[n_vocab]`` (float32; ``logits`` is not changed)."""
        x = np.array(logits, dtype=np.float32)
        if self._window_on and self._in_window:
            ids = np.fromiter(self._in_window, dtype=np.int64, count=len(self._in_window))
            v = x[ids]
            x[ids] = np.where(v > 0, v / self.repeat, v * self.repeat)
        if self.counts and (self.frequency != 0 or self.presence != 0):
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            c = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            x[ids] -= c * self.frequency + self.presence
        return x
