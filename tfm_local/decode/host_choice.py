"""The target's token choice on the host with a request's penalties, grammar and log-probability records.

``HostChooser`` is ``sampling.TokenChooser`` (the argmax, or the seeded draw of the processed
distribution) applied to the penalised logit row (``penalties``) with the tokens outside the request's
grammar removed (``grammar``), recording each choice's log-probabilities (``logprobs``, of the penalised
row: the target's distribution, not the grammar's). The engine uses it instead of a choice in the
target's graph whenever a generation has penalties, a grammar or asks for log-probabilities: they need
the full row on the host.

Under a grammar, greedy takes the argmax of the allowed tokens (the row's argmax when the grammar allows
it, without masking the row), and a sampled choice is a draw among the tokens the request's filters keep
and the grammar allows, in proportion to their processed probabilities (``constrained_draw``; when the
grammar allows none of them, a draw from the masked row). Checking the few kept tokens one by one costs
microseconds where masking the 152k-token row costs 12-30 ms on the 2-core CPU (docs/structured-outputs.md).

Losslessness under speculation: the acceptance walk (accept.py) calls the chooser once per emitted
token, in order, walking the accepted path of the verified tree from its root. So when a node's row is
processed, the penalty state and the grammar hold exactly the tokens before that node's position — the
generated tokens of the earlier steps and the node's accepted ancestors — which is the state plain
decoding has at that position: the penalised, constrained distribution, and the draw keyed by the
position, are plain decoding's. ``cut`` drops the drafted nodes the grammar rejects before verification.
"""
from __future__ import annotations

import numpy as np

from .grammar import Grammar
from .logprobs import TokenLogprob, check_top_logprobs, token_logprob
from .penalties import Penalties
from .sampling import SamplingParams, TokenChooser, draw_key, gumbel_noise, kept_set, sample_row


class HostChooser:
    """``(logits [n_vocab] float32, position) -> token``, like ``TokenChooser``, with penalties and records.

    Args:
        sp: the sampling settings (penalties and grammar included). prompt_ids: the prompt's token ids (the
            repeat penalty's window starts in them). top_logprobs: None = no records; 0..20 = a
            ``TokenLogprob`` per choice in ``records`` with that many alternatives. model: the target
            (``llama.model.Model``), needed for ``sp.grammar`` (its vocabulary).
    Raises ValueError for ``top_logprobs`` outside 0..20, ``grammar.GrammarError`` for a grammar llama.cpp
    cannot parse.

    Call it once per emitted token, in the order emitted (each call's token is pushed into the penalty
    state). ``seed`` is the draws' seed (``TokenChooser.seed``).
    """

    def __init__(self, sp: SamplingParams, prompt_ids, top_logprobs: int | None = None, model=None):
        self.base = TokenChooser(sp)
        self.sp, self.seed = sp, self.base.seed
        self.penalties = Penalties(sp, prompt_ids) if sp.penalised else None
        self.top_logprobs = None if top_logprobs is None else check_top_logprobs(top_logprobs)
        self.records: list[TokenLogprob] = []
        self.grammar: Grammar | None = None
        if sp.grammar is not None:
            if model is None:
                raise ValueError("a grammar needs the target's model (its vocabulary)")
            self.grammar = Grammar(model, sp.grammar)

    def __call__(self, logits: np.ndarray, position: int) -> int:
        x = self.penalties.apply(logits) if self.penalties is not None else logits
        g = self.grammar
        if g is None:
            t = self.base(x, position)
        elif self.sp.greedy:  # the row's argmax when allowed (then the constrained argmax), else the mask's
            t = int(np.argmax(x))
            t = t if g.allows(t) else int(np.argmax(g.mask(x)))
        else:
            t = constrained_draw(x, self.sp, draw_key(self.seed, position), g)
        if self.top_logprobs is not None:
            self.records.append(token_logprob(x, t, self.top_logprobs))
        if self.penalties is not None:
            self.penalties.push(t)
        if g is not None:
            g.accept(t)
        return t

    def cut(self, tree):
        """``tree`` (``tree.Tree``) without the drafted nodes the grammar rejects (``Grammar.cut``; the tree
        itself without a grammar)."""
        return tree if self.grammar is None else self.grammar.cut(tree)

    def close(self) -> None:
        """Free the grammar's state (also done when the chooser is collected)."""
        if self.grammar is not None:
            self.grammar.close()


#: the most kept tokens checked one by one against the grammar before the whole row is masked instead
CHECKED = 256


def constrained_draw(x: np.ndarray, sp: SamplingParams, key: int, grammar: Grammar) -> int:
    """A sampled token under ``grammar`` from one logit row ``x`` ``[n_vocab]`` float32 (penalised) and the
    draw's 64-bit ``key``: the request's filters keep their tokens of ``x`` (``kept_set``), and the draw is
    the Gumbel-max of ``sample_row`` among those the grammar allows, i.e. a draw in proportion to their
    processed probabilities; when it allows none of them, the draw of ``sample_row`` over the grammar-masked
    row (the filters applied to the allowed tokens alone). The ``CHECKED`` best-scoring kept tokens are
    checked one by one in the order of their scores (the first allowed one is the draw); only when none is
    allowed is the row masked."""
    keep = kept_set(x, sp)
    ids = np.flatnonzero(keep)
    if ids.size:
        m = np.float64(x[ids].max())
        score = (x[ids].astype(np.float64) - m) / np.float64(np.float32(sp.temperature)) + gumbel_noise(key, ids)
        top = np.flatnonzero(score >= np.partition(score, -CHECKED)[-CHECKED]) if ids.size > CHECKED \
            else np.arange(ids.size)
        for j in top[np.lexsort((ids[top], -score[top]))]:  # descending score, ties by the lowest id (sample_row's)
            if grammar.allows(int(ids[j])):
                return int(ids[j])  # every token outside ``top`` scores lower
        if top.size < ids.size:
            allowed = grammar.mask(x)[ids] > -np.inf
            if allowed.any():
                best = np.flatnonzero(allowed)
                return int(ids[best[np.lexsort((ids[best], -score[best]))[0]]])
    return sample_row(grammar.mask(x), sp, key)[0]
