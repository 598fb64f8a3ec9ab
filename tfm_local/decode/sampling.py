"""Logit processing and token choice shared by plain and speculative decoding.

The processed distribution follows llama.cpp's default sampler order
(``common/sampling.cpp``): top-k, then top-p and min-p on the softmax of the
raw logits, then temperature on the survivors. A draw is a Gumbel-max whose
noise is keyed by (seed, position, token id), so a token's draw does not depend
on the order or number of rows it was verified with: plain and speculative
decoding with one seed emit the same tokens wherever their logits agree.
The engine draws in the target's graph (patch 0011, ``Target.attach_sampler``);
``sample_row`` is the same draw on the host, for backends without the op and
for the tests.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np


def _real(name: str, value) -> float:
    """``value`` as a float; ValueError naming ``name`` unless it is a real number (not a bool or a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value) -> int:
    """``value`` as an int; ValueError naming ``name`` unless it is an integer (not a bool or a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is processed.

    temperature: 0 → greedy (argmax of the raw logits); > 0 → sampling (a temperature that float32
    cannot tell from 0, below ~1e-45, is greedy too). top_k: keep the k most likely tokens (0, or at
    least the vocabulary, = off). top_p: nucleus mass (1 = off). min_p: drop tokens below min_p × p_max
    (0 = off). seed: the draws' seed, any integer (taken modulo 2**64); None or -1 (llama.cpp's and
    Ollama's "random") = a random seed per generation.
    frequency_penalty / presence_penalty: OpenAI's penalties, -2..2 (0 = off), over the tokens generated so
    far; repeat_penalty (> 0, 1 = off) over the last ``repeat_last_n`` tokens of prompt and output (-1 = all
    of them, 0 = off), as llama.cpp's. They change the logits before everything above (``penalties``);
    greedy decoding takes the argmax of the penalised logits.
    grammar: GBNF text (start rule ``root``) the output must follow, or None: greedy takes the argmax of
    the tokens it allows next; sampling draws among the kept tokens it allows (``host_choice.
    constrained_draw``; ``grammar.Grammar``).
    Raises ValueError naming the field on a value of the wrong type or out of range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    grammar: str | None = None

    def __post_init__(self):
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise ValueError(f"grammar must be GBNF text, got {self.grammar!r}")
        t, p, m = _real("temperature", self.temperature), _real("top_p", self.top_p), _real("min_p", self.min_p)
        k = _integer("top_k", self.top_k)
        if self.seed is not None:
            _integer("seed", self.seed)
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= _real(name, getattr(self, name)) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        r = _real("repeat_penalty", self.repeat_penalty)
        if not (r > 0 and np.isfinite(r)):
            raise ValueError(f"repeat_penalty must be a finite number > 0, got {self.repeat_penalty}")
        if _integer("repeat_last_n", self.repeat_last_n) < -1:
            raise ValueError(f"repeat_last_n must be >= -1 (-1 = the whole context), got {self.repeat_last_n}")
        if not (t >= 0 and np.isfinite(t)):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= m <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return np.float32(self.temperature) == 0

    @property
    def penalised(self) -> bool:
        """A penalty changes the logits (``penalties.Penalties``)."""
        return (self.frequency_penalty != 0 or self.presence_penalty != 0
                or (self.repeat_penalty != 1 and self.repeat_last_n != 0))


_PHI = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def draw_key(seed: int, position: int) -> int:
    """The 64-bit key of the draw for ``position`` under ``seed`` (as tfm-ext's ``tfm_sample_key``):
    splitmix64's output function of ``seed`` XOR (that function of ``position`` + 0x9E3779B97F4A7C15)."""
    with np.errstate(over="ignore"):
        inner = _mix64(np.array([position], dtype=np.int64).astype(np.uint64) + _PHI)
        return int(_mix64(np.array([seed], dtype=np.uint64) ^ inner)[0])


def gumbel_noise(key: int, ids: np.ndarray) -> np.ndarray:
    """The Gumbel noise of tokens ``ids`` under ``key``, float64 (patch 0011's ggml_sample_tokens):
    ``-log(-log(u))``, ``u = ((h >> 12) + 0.5) * 2**-52``, ``h`` = splitmix64's output function of
    ``key + (id + 1) * 0x9E3779B97F4A7C15``."""
    with np.errstate(over="ignore"):
        h = _mix64(np.uint64(key) + (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * _PHI)
    u = ((h >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0 ** -52
    return -np.log(-np.log(u))


def kept_set(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The tokens the filters keep for one logit row ``[n_vocab]``: bool ``[n_vocab]``.

    llama.cpp's order (top-k, top-p, min-p; temperature does not change the set), as thresholds on the
    logits so that tokens tied with a boundary token are kept (exactly ggml_sample_tokens of patch
    0011): top-k keeps x >= the k-th largest; top-p, over the top-k survivors sorted by descending x,
    the shortest prefix whose mass reaches ``top_p`` × their mass, and every x >= its last value;
    min-p keeps e >= min_p with e = exp(x - max) in float32. NaN and -inf are never kept.
    """
    x = np.asarray(logits, dtype=np.float32)
    fin = x > -np.inf
    if not fin.any():
        return fin
    m = x[fin].max()
    if m == np.inf:
        return x == np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(fin, np.exp(x - m), np.float32(0)).astype(np.float32)
    keep = fin.copy()
    n_fin = int(fin.sum())
    if 0 < sp.top_k < n_fin:
        theta_k = np.partition(x[fin], -sp.top_k)[-sp.top_k]
        keep &= x >= theta_k
    if sp.top_p < 1.0:
        ids = np.flatnonzero(keep)
        order, cum, target = _nucleus_prefix(x[ids], e[ids].astype(np.float64), ids, sp.top_p)
        j = min(int(np.searchsorted(cum, target)), len(order) - 1)
        keep &= x >= x[order[j]]
    if sp.min_p > 0.0:
        keep &= e >= np.float32(sp.min_p)
    return keep


def _nucleus_prefix(x: np.ndarray, w: np.ndarray, ids: np.ndarray,
                    top_p: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The tokens ``ids`` sorted by descending logit ``x`` (ties by ascending id) as far as top-p needs,
    the cumulative weights ``w`` (float64) along them, and the mass the nucleus must reach (``top_p`` ×
    the total). The prefix holds the candidates with the 256, 2048, ... largest logits (boundary ties
    included) until their mass reaches it, else all tokens (the total is then the sorted cumulative
    sum's last value): a prefix of the full sort, since every token left out has a smaller logit.
    Sorting a 152k-token vocabulary whole took 12 ms a row on the 2-core CPU."""
    target = top_p * float(np.sum(w))
    m = min(ids.size, 256)
    while True:
        if m < ids.size:
            cut = np.partition(x, -m)[-m]
            sel = np.flatnonzero(x >= cut)
        else:
            sel = np.arange(ids.size)
        sel = sel[np.lexsort((ids[sel], -x[sel]))]
        cum = np.cumsum(w[sel])
        if sel.size == ids.size:
            return ids[sel], cum, top_p * cum[-1]
        if cum[-1] >= target:
            return ids[sel], cum, target
        m = min(ids.size, m * 8)


def target_probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The processed distribution of one logit row ``[n_vocab]``: float64 probabilities (sum 1),
    ``softmax((x - max) / temperature)`` over ``kept_set``. Greedy (temperature 0): one-hot argmax."""
    x = np.asarray(logits, dtype=np.float64)
    if sp.greedy:
        p = np.zeros(x.shape[0])
        p[int(np.argmax(logits))] = 1.0
        return p
    keep = kept_set(logits, sp)
    z = np.where(keep, (x - x[keep].max()) / sp.temperature, -np.inf)
    q = np.exp(z)
    return q / q.sum()


def sample_row(logits: np.ndarray, sp: SamplingParams, key: int) -> tuple[int, int]:
    """One draw from one logit row ``[n_vocab]`` float32 with the 64-bit ``key`` → (token, kept-set size):
    the kept token maximising ``(x - max) / temperature + gumbel_noise(key, id)`` in float64 (ties: the
    lowest id), the host twin of patch 0011's ggml_sample_tokens. Gumbel-max draws exactly from
    ``target_probs`` (Gumbel 1954; Maddison et al., NeurIPS 2014). (-1, 0) when no logit is finite."""
    x = np.asarray(logits, dtype=np.float32)
    keep = kept_set(x, sp)
    ids = np.flatnonzero(keep)
    if ids.size == 0:
        return -1, 0
    m = np.float64(x[x > -np.inf].max())
    if m == np.inf:
        score = gumbel_noise(key, ids)
    else:
        score = (x[ids].astype(np.float64) - m) / np.float64(np.float32(sp.temperature)) + gumbel_noise(key, ids)
    return int(ids[int(np.argmax(score))]), int(ids.size)


class TokenChooser:
    """Chooses the target's token for a position: argmax (greedy) or a seeded draw.

    The draw for position ``pos`` uses the key ``draw_key(seed, pos)`` (``sample_row``), so plain and
    speculative decoding with one seed draw the same token wherever their logits agree, whatever the
    tree. ``seed``: ``sp.seed`` modulo 2**64, or a random 64-bit seed when it is None or -1.
    """

    def __init__(self, sp: SamplingParams):
        self.sp = sp
        self.seed = int(sp.seed) % 2 ** 64 if sp.seed not in (None, -1) else secrets.randbits(64)

    def __call__(self, logits: np.ndarray, position: int) -> int:
        if self.sp.greedy:
            return int(np.argmax(logits))
        return sample_row(logits, self.sp, draw_key(self.seed, position))[0]
