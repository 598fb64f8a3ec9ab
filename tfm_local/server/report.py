"""What tfm-serve reports of a generation's speculative decoding: ``usage.tfm`` and the chunks' ``x_tfm``.

``x_tfm`` is an extension field of streamed chunks (OpenAI clients ignore unknown fields): the chunk
that carries ``finish_reason`` always has it, and with ``stream_options: {"x_tfm_live": true}`` every
chunk that carries text has it too, computed after that text's token was emitted. Its keys:

- ``tau``: tokens emitted per target verify pass so far, the bonus token included (1.0 = plain
  decoding); null before the first verify pass (the first token comes from the prefill).
- ``tokens_per_s``: those tokens over the decode time so far (prefill excluded), as delivered to
  the stream (the server's time between tokens included); null before the first verify pass.
- ``plain_tokens_per_s``: plain decoding's rate in decode steps on this machine, 1 / (the seconds of
  one plain decoding step as the engine measured them, ``plain_step_s``); null while not measured.
- ``speedup``: the speed-up over plain decoding, like for like in step time: this generation's
  tokens per second of decode steps (its tokens over the summed time of its steps' phases,
  ``GenerationStats.t_phases``) over ``plain_tokens_per_s``. The server's own time per token (worker
  thread, events, network) is left out of both rates: with a model whose step takes a millisecond it
  would otherwise dominate. Null when either rate is unknown.
- ``completion_tokens``: tokens generated so far (the prefill's first token included).

``usage.tfm`` (non-streamed answers, and the usage chunk of ``include_usage``) holds the same
``speedup`` and ``plain_tokens_per_s`` beside its timings.
"""
from __future__ import annotations

from ..decode.stats import GenerationStats


def plain_step_s(engine) -> float | None:
    """Seconds of one plain decoding step on this machine, as ``engine`` (a ``tfm_local.engine.Engine``)
    measured them so far, or None when it has not.

    With the automatic budget: its running mean of a whole plain step without feature capture
    (``ProbeSchedule.plain_s``: target pass, token choice and bookkeeping), once it has run such
    steps; before that, and with a fixed budget, the target's measured one-token pass
    (``PassCosts.estimate(1)``, from the automatic budget's plain steps or the warm-up), which leaves
    out the step's host work.
    """
    auto = engine.auto
    if auto is not None and auto.probes.plain_s:
        return float(auto.probes.plain_s)
    c1 = engine.pass_costs.estimate(1)
    return float(c1) if c1 else None


def live_stats(stats: GenerationStats, plain_s: float | None, plain_only: bool) -> dict:
    """The ``x_tfm`` object (module docstring) of a generation's statistics so far.

    Args:
        stats: the running (or final) GenerationStats of the generation.
        plain_s: ``plain_step_s`` of the engine (seconds), or None.
        plain_only: the engine never drafts: every step is a plain step, the speed-up is 1 and plain
            decoding's rate is this generation's own rate in decode steps.
    Returns:
        {"tau", "tokens_per_s", "plain_tokens_per_s", "speedup"}: floats (rounded: 4 decimals for τ and
        the speed-up, 2 for rates) or None, and "completion_tokens" (int).
    """
    ran = stats.n_steps > 0
    tps = stats.tokens_per_s if ran else None
    step_s = sum(stats.t_phases.values())
    step_tps = stats.n_step_tokens / step_s if ran and step_s > 0 else None
    if plain_only:
        plain_tps, speedup = step_tps, 1.0 if ran else None
    else:
        plain_tps = 1.0 / plain_s if plain_s else None
        speedup = step_tps / plain_tps if step_tps and plain_tps else None
    return {"tau": round(stats.tau, 4) if ran else None,
            "tokens_per_s": round(tps, 2) if tps is not None else None,
            "plain_tokens_per_s": round(plain_tps, 2) if plain_tps is not None else None,
            "speedup": round(speedup, 4) if speedup is not None else None,
            "completion_tokens": stats.n_generated}
