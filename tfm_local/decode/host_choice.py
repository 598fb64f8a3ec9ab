"""The target's token choice on the host with a request's penalties and log-probability records.

``HostChooser`` is ``sampling.TokenChooser`` (the argmax, or the seeded draw of the processed
distribution) applied to the penalised logit row (``penalties``), recording each choice's
log-probabilities (``logprobs``). The engine uses it instead of a choice in the target's graph whenever a
generation has penalties or asks for log-probabilities: both need the full row on the host.

Losslessness under speculation: the acceptance walk (accept.py) calls the chooser once per emitted
token, in order, walking the accepted path of the verified tree from its root. So when a node's row is
processed, the penalty state holds exactly the tokens before that node's position — the generated
tokens of the earlier steps and the node's accepted ancestors — which is the state plain decoding has
at that position: the penalised distribution, and the draw keyed by the position, are plain decoding's.
"""
from __future__ import annotations

import numpy as np

from .logprobs import TokenLogprob, check_top_logprobs, token_logprob
from .penalties import Penalties
from .sampling import SamplingParams, TokenChooser


class HostChooser:
    """``(logits [n_vocab] float32, position) -> token``, like ``TokenChooser``, with penalties and records.

    Args:
        sp: the sampling settings (penalties included). prompt_ids: the prompt's token ids (the repeat
            penalty's window starts in them). top_logprobs: None = no records; 0..20 = a
            ``TokenLogprob`` per choice in ``records`` with that many alternatives.
    Raises ValueError for ``top_logprobs`` outside 0..20.

    Call it once per emitted token, in the order emitted (each call's token is pushed into the penalty
    state). ``seed`` is the draws' seed (``TokenChooser.seed``).
    """

    def __init__(self, sp: SamplingParams, prompt_ids, top_logprobs: int | None = None):
        self.base = TokenChooser(sp)
        self.sp, self.seed = sp, self.base.seed
        self.penalties = Penalties(sp, prompt_ids) if sp.penalised else None
        self.top_logprobs = None if top_logprobs is None else check_top_logprobs(top_logprobs)
        self.records: list[TokenLogprob] = []

    def __call__(self, logits: np.ndarray, position: int) -> int:
        x = self.penalties.apply(logits) if self.penalties is not None else logits
        t = self.base(x, position)
        if self.top_logprobs is not None:
            self.records.append(token_logprob(x, t, self.top_logprobs))
        if self.penalties is not None:
            self.penalties.push(t)
        return t
