"""Per-generation statistics: acceptance length τ, speed and the time split."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class GenerationStats:
    """Counters and timings of one generation (times in seconds).

    tau: mean tokens emitted per target verification pass, bonus token
    included (1.0 for plain decoding). tokens_per_s: generated tokens over
    the decode time (prefill excluded).
    """

    n_prompt: int = 0
    n_generated: int = 0
    n_steps: int = 0           # target verification passes after the prefill
    n_step_tokens: int = 0     # tokens emitted by those passes
    n_drafted: int = 0         # draft tokens submitted for verification
    n_spec_steps: int = 0      # passes that verified a draft (the others were plain decoding steps)
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0
    finish_reason: str = ""

    @property
    def tau(self) -> float:
        return self.n_step_tokens / self.n_steps if self.n_steps else 0.0

    @property
    def t_decode(self) -> float:
        return max(self.t_total - self.t_prefill, 1e-9)

    @property
    def t_other(self) -> float:
        return max(self.t_decode - self.t_draft - self.t_verify, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.t_decode if self.n_generated else 0.0

    def summary(self) -> str:
        """One line for a terminal: τ, tok/s and the time split."""
        return (f"τ={self.tau:.2f}  {self.tokens_per_s:.1f} tok/s  {self.n_generated} tokens  "
                f"(prefill {self.t_prefill:.2f}s, draft {self.t_draft:.2f}s, verify {self.t_verify:.2f}s, "
                f"other {self.t_other:.2f}s)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, tokens_per_s=self.tokens_per_s, t_decode=self.t_decode, t_other=self.t_other)
        return d
