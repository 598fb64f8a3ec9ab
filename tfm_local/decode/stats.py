"""Per-generation statistics: acceptance length τ, speed and the time split."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

#: Phases of a decode step timed by ``PhaseClock`` (seconds in ``GenerationStats.t_phases``):
#: drafter = KV injection + drafting pass(es); tree = building the draft tree (or chain) from the
#: drafter's candidates; submit = building the target's batch and the decode call (on a GPU llama.cpp
#: returns once the pass is launched, so this is host time; on the CPU the pass runs inside it);
#: verify = waiting for the target pass and reading its results (logits or argmax ids);
#: accept = the acceptance walk (host argmax / sampling of the visited rows) and the KV commit.
#: The rest of the decode time (budget choice, the generator, stop strings) is ``t_other_phases``.
PHASES = ("drafter", "tree", "submit", "verify", "accept")


class PhaseClock:
    """Splits wall time into ``PHASES``: each ``mark(phase)`` adds the time since the previous mark
    (or the clock's creation) to ``acc[phase]`` (seconds, ``time.perf_counter``). A decode step makes
    one clock (``step.run_step``); ``observe`` lets a profiler see every clock's boundaries."""

    _observer: Callable[[str | None], None] | None = None

    @classmethod
    def observe(cls, fn: Callable[[str | None], None] | None) -> None:
        """Call ``fn(None)`` when any clock is made, before it starts (the time since the last mark belongs to
        no phase: between steps), and ``fn(phase)`` after each ``mark(phase)`` charged its time; ``None``
        stops it. For profilers (a named range per phase); unset, a mark costs one test."""
        cls._observer = fn

    def __init__(self, acc: dict):
        if PhaseClock._observer is not None:
            PhaseClock._observer(None)
        self.acc, self.t = acc, time.perf_counter()

    def mark(self, phase: str) -> None:
        """Charge the time since the last mark to ``phase`` (a key of ``acc``)."""
        now = time.perf_counter()
        self.acc[phase] += now - self.t
        self.t = now
        if PhaseClock._observer is not None:
            PhaseClock._observer(phase)


@dataclass
class GenerationStats:
    """Counters and timings of one generation (times in seconds).

    tau: mean tokens emitted per target verification pass, bonus token
    included (1.0 for plain decoding). tokens_per_s: the tokens emitted by
    the decode passes over the decode time (prefill excluded, and with it the
    first token, which the prefill's logits give); 0.0 when no pass ran.
    """

    n_prompt: int = 0
    n_cached: int = 0          # prompt tokens the prompt cache kept (not prefilled: decode.prompt_cache)
    n_generated: int = 0
    n_steps: int = 0           # target verification passes after the prefill
    n_step_tokens: int = 0     # tokens emitted by those passes
    n_drafted: int = 0         # draft tokens submitted for verification
    n_spec_steps: int = 0      # passes that verified a draft (the others were plain decoding steps)
    n_probes: int = 0          # speculative passes that were the automatic budget's probes
    n_capture_steps: int = 0   # plain passes that captured the drafter's features (auto: warm-ups)
    n_switches: int = 0        # passes before which the capture was turned on or off
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0
    finish_reason: str = ""
    t_phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))  # see PHASES

    def add_step(self, rec) -> None:
        """Count one decode step (a ``step.StepRecord``): its tokens, drafts and time split."""
        self.n_steps += 1
        self.n_step_tokens += len(rec.tokens)
        self.n_drafted += rec.n_nodes - 1
        self.n_spec_steps += rec.speculative
        self.n_probes += rec.probe
        self.n_capture_steps += rec.capture and not rec.speculative
        self.n_switches += rec.switched
        self.t_draft += rec.t_draft
        self.t_verify += rec.t_verify
        for phase, seconds in rec.phases.items():
            self.t_phases[phase] += seconds

    @property
    def n_prefilled(self) -> int:
        """Prompt tokens the prefill decoded (those the prompt cache did not hold)."""
        return self.n_prompt - self.n_cached

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
    def t_other_phases(self) -> float:
        """Decode time outside ``PHASES`` (seconds)."""
        return max(self.t_decode - sum(self.t_phases.values()), 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.n_step_tokens / self.t_decode if self.n_steps else 0.0

    def summary(self) -> str:
        """One line for a terminal: τ, tok/s and the time split."""
        return (f"τ={self.tau:.2f}  {self.tokens_per_s:.1f} tok/s  {self.n_generated} tokens  "
                f"(prefill {self.t_prefill:.2f}s, draft {self.t_draft:.2f}s, verify {self.t_verify:.2f}s, "
                f"other {self.t_other:.2f}s)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(n_prefilled=self.n_prefilled, tau=self.tau, tokens_per_s=self.tokens_per_s, t_decode=self.t_decode, t_other=self.t_other,
                 t_other_phases=self.t_other_phases)
        return d
