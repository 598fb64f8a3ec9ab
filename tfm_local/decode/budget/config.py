"""The automatic budget's tuning: one frozen ``BudgetConfig``, with a CPU and a GPU profile.

The engine takes ``GPU`` when the target runs on a GPU, else ``CPU``; a study overrides fields with
``dataclasses.replace`` (``overrides`` parses ``FIELD=VALUE`` strings for the lab scripts). Why each
value is what it is: docs/notebook/budget-history.md.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

#: The node counts of a verification pass on a GPU (``GPU.sizes``): few shapes, each of which keeps its
#: CUDA graph (patch 0014); a pass of a new size runs kernel by kernel and would price its size out.
GPU_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BudgetConfig:
    """How the automatic budget decides (docs/design.md §5). Step counts are decode steps.

    Attributes:
        first_probe: budget of the first speculative step, before any statistics (at most the ceiling):
            deep enough that one probe measures a gain curve and a pass of a useful size.
        probe_min / probe_max: plain steps between probes (doubling while plain keeps winning).
        recheck: plain steps a "plain wins" decision is kept before it is computed again (a speculative
            step's statistics clear it at once).
        window: plain steps whose features the drafter gets before a speculative step that follows a
            stretch without capture (the tokens before them are a hole in its cache).
        overhead: the most of plain decoding's time probing may cost (the probe spacing's floor).
        probe_cap: the most plain steps between two probes, whatever a probe costs.
        alpha: weight of a new sample in the running means of costs and the gain curve.
        alpha_accept: the same for the accepted and predicted tokens behind the calibration r (a step's
            accepted count varies a lot; a low weight keeps r's noise from stopping speculation that pays).
        margin: speculation must beat plain decoding by this factor to start (``best_budget``,
            exploration, the futility bound): predicted gains of a few percent are within the model's error.
        skip_futile: skip the probes that cannot lead to speculation (False: probe on the schedule alone).
        futile_after: probe cycles made before a probe may be skipped as futile (a few probes say little
            about the prompts to come).
        curve_probe: the least weight of a probe's gain curve in the running curve (a probe after a long
            plain stretch is the only sample of the text now).
        keep: speculation under way goes on while predicted at this factor of plain decoding or better
            (a hysteresis against the calibration's noise).
        prior_steps: the weight of the calibration's prior (one accepted per one predicted token), in
            speculative steps.
        alpha_probe: the least weight of a probe's acceptance in the calibration and of a cycle's savings in
            ``probe_gain`` (None: ``alpha_accept`` and ``alpha``). A generation's first speculative step
            weighs as a probe.
        sizes: the node counts a verification may have (None: any up to the ceiling); budgets are these
            minus one.
        size_keep: speculation under way keeps its budget while predicted at this factor of the best
            budget's rate or better (1.0: always the best), so that the pass keeps its shape.
        steady_costs: a pass's cost is recorded only from the third pass in a row of its size (on a GPU
            the first pass of a shape after another runs kernel by kernel, the second captures its graph).
        probe_at_start: a probe due within a generation is made at its first step, with the prompt's
            features captured in the prefill (``plan`` judges "within" by ``max_tokens``; the steps it
            came early are added to the next gap). Off where injecting a prompt costs a drafter pass over it.
        measured_depth: the running gain curve remembers how deep it was measured; the first deeper
            curve replaces a probe's extrapolation beyond that depth instead of being blended into it.
        draft_ahead: how many nodes beyond its budget a speculative step drafts (its gain curve is
            measured that deep, extrapolated beyond), and the drafting priced by depth (``DraftCosts``);
            None: to the block's end (the budget's ceiling) at one drafting cost, where a drafter pass
            costs the same at any depth (a GPU). On a CPU a shallow draft costs a fraction of a full block.
    """

    first_probe: int = 7
    probe_min: int = 8
    probe_max: int = 256
    recheck: int = 32
    window: int = 32
    overhead: float = 0.005
    probe_cap: int = 4096
    alpha: float = 0.2
    alpha_accept: float = 0.03
    margin: float = 1.08
    skip_futile: bool = True
    futile_after: int = 0
    curve_probe: float = 0.2
    keep: float = 1.0
    prior_steps: float = 4.0
    alpha_probe: float | None = 0.3
    sizes: tuple[int, ...] | None = None
    size_keep: float = 1.0
    steady_costs: bool = False
    probe_at_start: bool = False
    measured_depth: bool = True
    draft_ahead: int | None = None

    def budgets(self, k_max: int) -> np.ndarray:
        """The budgets a speculative step may take, up to ``k_max`` (int64 ``[m]``, ascending; empty when
        ``k_max`` < 1): 1 .. ``k_max``, or ``sizes`` minus one (``k_max`` itself when none fits)."""
        if k_max < 1:
            return np.zeros(0, dtype=np.int64)
        if self.sizes is None:
            return np.arange(1, k_max + 1)
        b = np.array(sorted({n - 1 for n in self.sizes if 1 <= n - 1 <= k_max}), dtype=np.int64)
        return b if len(b) else np.array([k_max], dtype=np.int64)

    def fit(self, b: int, k_max: int) -> int:
        """The largest allowed budget (``budgets``) at most ``min(b, k_max)``; 0 when that is below 1."""
        allowed = self.budgets(min(b, k_max))
        return int(allowed[-1]) if len(allowed) else 0


#: The CPU's profile: every pass size, each step drafted two nodes beyond its budget (probes only as deep
#: as their budget) and priced by its depth.
CPU = BudgetConfig(draft_ahead=2)

#: A GPU's profile: passes of ``GPU_SIZES`` nodes, a budget kept while within 3% of the best, costs of
#: steady passes only, a probe's curve taken whole, futility judged after 8 cycles, probes at answers' start,
#: every step drafted to the block's end.
GPU = replace(CPU, sizes=GPU_SIZES, size_keep=0.97, steady_costs=True, probe_at_start=True, curve_probe=1.0,
              futile_after=8, draft_ahead=None)


def overrides(items: list[str]) -> dict:
    """``FIELD=VALUE`` strings → ``BudgetConfig`` keyword arguments for ``dataclasses.replace`` (True /
    False / None, ints, floats). Raises ValueError naming an unknown field."""
    names = {f.name for f in fields(BudgetConfig)}
    consts = {"True": True, "False": False, "None": None}
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        if k not in names:
            raise ValueError(f"BudgetConfig has no field {k!r}")
        out[k] = consts[v] if v in consts else int(v) if v.lstrip("-").isdigit() else float(v)
    return out
