"""The automatic draft budget: per step, plain decoding or B drafted tokens, chosen from measured pass
costs and the drafter's predicted acceptance (docs/design.md §5).

- ``config``  ``BudgetConfig``, the frozen tuning, and its ``CPU`` and ``GPU`` profiles
- ``costs``   running costs, the target's pass costs by size (``PassCosts``), the drafter's by depth
              (``DraftCosts``)
- ``gain``    the gain curve, its calibration (``GainModel``) and the predicted rate (``best_budget``)
- ``probes``  when to probe the drafter while plain decoding wins, and what a probe cycle costs
- ``policy``  ``BudgetPolicy``: ``plan(k_max, remaining) -> StepPlan`` per step, ``observe(StepRecord)``,
              the capture of the drafter's features around plain stretches

How the rules and values came to be: docs/notebook/budget-history.md.
"""
from .config import CPU, GPU, GPU_SIZES, BudgetConfig, overrides
from .costs import OUTLIER, PROBE_OUTLIER, DraftCosts, PassCosts, running_cost
from .gain import GainModel, best_budget, draft_seconds, extrapolate, gain_curve, predicted_rate
from .policy import SYNCED, BudgetPolicy, StepPlan
from .probes import ProbeSchedule

__all__ = ["CPU", "GPU", "GPU_SIZES", "OUTLIER", "PROBE_OUTLIER", "SYNCED", "BudgetConfig", "BudgetPolicy",
           "DraftCosts", "GainModel", "PassCosts", "ProbeSchedule", "StepPlan", "best_budget", "draft_seconds",
           "extrapolate", "gain_curve", "overrides", "predicted_rate", "running_cost"]
