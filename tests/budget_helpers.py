"""Shared doubles and simulations for the automatic budget's tests (no Engine)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tfm_local.decode.budget import CPU, GPU, BudgetPolicy, PassCosts, gain_curve
from tfm_local.decode.step import StepRecord


def policy(costs: PassCosts | None = None, gpu: bool = False, **kw) -> BudgetPolicy:
    """A ``BudgetPolicy`` on the CPU profile (``gpu``: the GPU one) with config fields ``kw`` replaced."""
    return BudgetPolicy(replace(GPU if gpu else CPU, **kw), costs=costs)

class LinearCosts(PassCosts):
    """A stated cost model c(n) = a + b·n (seconds) that ignores measurements (a test double)."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a, self.b = a, b

    def record(self, n, seconds):
        pass

    def known(self, n):
        return True

    def samples(self, n):
        return 2

    def estimate(self, n):
        out = self.a + self.b * np.asarray(n, dtype=np.float64)
        return float(out) if np.ndim(out) == 0 else out


WEAK = gain_curve(np.log(np.full(15, 0.05)) * np.arange(1, 16), 15)


def _weak_auto(**kw) -> BudgetPolicy:
    """A policy past its first probe on CPU-like costs with a weak drafter: plain decoding wins.
    Its probes follow the schedule (``skip_futile`` False unless given: they would all be futile)."""
    kw.setdefault("skip_futile", False)
    auto = policy(costs=LinearCosts(0.035, 0.06), **kw)
    auto.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    return auto


def _probe_gaps(auto: BudgetPolicy, steps: int, curve) -> tuple[list[int], int]:
    """Plain steps between the probes of ``steps`` choices (each probe observed with ``curve`` and no
    token accepted), and the plain steps that captured."""
    gaps, since, captured = [], 0, 0
    for _ in range(steps):
        b = auto.choose(15)
        since += 1
        captured += bool(auto.capture and not b)
        if b:
            gaps.append(since)
            since = 0
            auto.observe_spec(b + 1, 0.1, 0.03, curve, b, 0)
    return gaps, captured


def _record(k: int, seconds: float, auto: BudgetPolicy, switched: bool, curve=WEAK):
    from tfm_local.decode.step import StepRecord

    rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1], curve=curve if k else None,
                     probe=k > 0 and auto.probing, capture=auto.capture, switched=switched)
    rec.phases["verify"] = seconds
    return rec


def _drive(auto: BudgetPolicy, n: int, use_stretch: bool, t: float = 0.03) -> list[tuple[int, bool]]:
    """``n`` steps of plain decoding's cost ``t`` (probes 3t, no token gained) under ``auto``: each step
    chosen and observed, or, with ``use_stretch``, the steps of each ``stretch`` reported together as
    the engine does. Returns (budget, capture) per step, (0, False) for a stretch's steps."""
    got, i = [], 0
    while i < n:
        k = auto.choose(15)
        got.append((k, auto.capture))
        auto.observe(_record(k, 3 * t if k else t, auto, False))
        i += 1
        j = min(auto.stretch(), n - i) if use_stretch else 0
        if j:
            auto.observe_stretch(j, j * t, j * t)
            got += [(0, False)] * j
            i += j
    return got


def _simulate(auto: BudgetPolicy, n_steps: int, plain_s: float, pass_s, draft_s: float, p_accept: float,
              capture_s: float = 0.0, probe_extra_s: float = 0.0, seed: int = 0, k_cap: int = 15,
              first_probe_extra_s: float | None = None, cold_pass_s: float = 0.0,
              switch_pass_s: float = 0.0, warm: tuple = ()) -> dict:
    """Drive ``auto`` through ``n_steps`` steps of a chain drafter whose every position is right with
    probability ``p_accept``, on a machine where a plain step costs ``plain_s``, a verification of n
    nodes ``pass_s(n)``, drafting ``draft_s``, a capturing plain step ``capture_s`` more and a probe
    ``probe_extra_s`` more outside its pass and drafting (a probe cycle measured 27.7 ms on the H200
    against ~5 ms from its parts; a batched injection's time is such a part), the first probe
    ``first_probe_extra_s`` (default the same: a cold first cycle is dearer), and the first pass of
    each size ``cold_pass_s`` more (a GPU loads the kernels of a new shape), and a pass whose size
    differs from either of the two passes before it ``switch_pass_s`` more (upstream ggml-cuda's one
    CUDA graph per context: the first pass of another shape runs kernel by kernel, the second captures).
    ``warm``: pass sizes whose costs are recorded twice first (the engine's warm-up at load). Returns the
    time against plain decoding's for the same tokens, the budgets chosen and the probes."""
    rng = np.random.default_rng(seed)
    for n in warm:
        for _ in range(2):
            auto.costs.record(n, plain_s if n == 1 else pass_s(n))
    last2 = [0, 0]
    curve = gain_curve(np.log(np.full(k_cap, p_accept)) * np.arange(1, k_cap + 1), k_cap)
    total = tokens = 0.0
    budgets, probes, seen = [], 0, set()
    for _ in range(n_steps):
        k = auto.choose(k_cap)
        probing = auto.probing
        extra = probe_extra_s if first_probe_extra_s is None or probes else first_probe_extra_s
        if k:
            hits = rng.random(k) < p_accept
            accepted = int(np.argmin(hits)) if not hits.all() else k
            t_verify, t_draft = pass_s(k + 1) + cold_pass_s * (k + 1 not in seen), draft_s + extra * probing
            seen.add(k + 1)
        else:
            accepted, t_verify, t_draft = 0, plain_s + capture_s * auto.capture, 0.0
        t_verify += switch_pass_s * (k + 1 != last2[0] or last2[0] != last2[1])
        last2 = [k + 1, last2[0]]
        from tfm_local.decode.step import StepRecord

        rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1] * (accepted + 1),
                         curve=(curve[:k] if probing else curve) if k else None, probe=k > 0 and probing,
                         capture=auto.capture)
        rec.phases["verify"], rec.phases["drafter"] = t_verify, t_draft
        rec.t_sync = extra * (k > 0 and probing)  # the cycle's extra: not drafting, not the pass
        auto.observe(rec)
        total += t_verify + t_draft
        tokens += accepted + 1
        budgets.append(k)
        probes += k > 0 and probing
    return dict(ratio=total / (tokens * plain_s), budgets=budgets, probes=probes, tokens=tokens)


def h200_pass(n: int) -> float:
    """The H200's default-pair verification as measured (docs/notebook/budget-history.md): a 2-node probe pass 4.0 ms, a
    17-node one 4.3, a 65-node one 7.2 (capture and per-row reads included)."""
    return float(np.interp(n, [2, 17, 65], [0.0040, 0.0043, 0.0072]))


def _simulate_generations(auto: BudgetPolicy, kinds: list[float], length: int = 200, max_tokens: int = 256,
                          seed: int = 0, plain_s: float = 0.00195, draft_s: float = 0.0018,
                          capture_s: float = 0.00035, switch_s: float = 0.0015, probe_extra_s: float = 0.003,
                          prompt_s: float = 0.004) -> dict:
    """Generations of ``length`` tokens (``max_tokens`` asked for: the end-of-generation token comes first),
    one per entry of ``kinds`` (the probability that the drafter is right at a position on that prompt),
    on H200-like costs as measured (docs/gpu.md): a plain step ``plain_s``, a capturing
    one ``capture_s`` more, a capture switch ``switch_s``, a probe ``probe_extra_s`` beyond its pass and
    drafting, a captured prompt ``prompt_s`` more in its prefill. Returns the time against plain
    decoding's for the same tokens (prefills' extra included) and the generations that speculated."""
    rng = np.random.default_rng(seed)
    from tfm_local.decode.step import StepRecord

    for n in (1, 2, 4, 8, 16):
        for _ in range(2):
            auto.costs.record(n, plain_s if n == 1 else h200_pass(n))
    total, tokens, capture, spec_gens = 0.0, 0, True, 0
    for p in kinds:
        curve = gain_curve(np.log(np.full(15, p)) * np.arange(1, 16), 15)
        cap = auto.capture_prompt(max_tokens, 15)
        total += prompt_s * cap + switch_s * (cap != capture)
        capture = cap
        auto.begin(cap)
        if cap:
            auto.observe_prompt(prompt_s)
        emitted, spec = 1, False
        while emitted < length:
            k = auto.choose(15, max_tokens - emitted)
            probing = auto.probing
            t = switch_s * (auto.capture != capture)
            capture = auto.capture
            if k:
                hits = rng.random(k) < p
                acc = min(int(np.argmin(hits)) if not hits.all() else k, length - emitted - 1)
                t_verify, t_draft = h200_pass(k + 1), draft_s + probe_extra_s * probing
                spec |= not probing
            else:
                acc, t_verify, t_draft = 0, plain_s + capture_s * capture, 0.0
            rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1] * (acc + 1), probe=k > 0 and probing,
                             curve=(curve[:k] if probing else curve) if k else None, capture=capture)
            rec.phases["verify"], rec.phases["drafter"] = t_verify + t, t_draft
            rec.t_sync = probe_extra_s * (k > 0 and probing)
            auto.observe(rec)
            total += t_verify + t_draft + t
            emitted += acc + 1
        tokens += emitted - 1
        spec_gens += spec
    return dict(ratio=total / (tokens * plain_s), spec_gens=spec_gens)
