"""Warm-up: every pass shape a generation can take, run once at load instead of inside a generation.

On a GPU the first pass of a new shape is dear: CUDA loads the kernels it launches on first use
(lazy module loading: the quantized mat-vec kernels are compiled per row count 1..8, the mat-mul
tiles per multiple of 8, the attention kernels per column count) and llama.cpp captures a graph.
On the H200 (default pair) a first 16-node verification took 49 ms against 6 after, a
first drafter pass 32 ms against 3, so the automatic budget's first probes cost 10-25 plain steps
each inside the user's generation. ``warm_up`` pays those costs at load (a fraction of a second on
the H200) and measures each verification size's warm cost for the automatic budget, which can then
price every budget from its first step instead of exploring sizes one probe at a time.

On the CPU nothing is loaded lazily but the drafter's weights (paged in by its first pass), and a pass
costs in proportion to its rows (a 16-row pass ~3 single-token ones on the 2-core machines), so the
engine warms up only on a GPU (``Engine(warm_up=...)`` overrides). On the CPU it runs the drafter at a
few depths at load for the automatic budget (``warm_drafter``, ~0.3 s): its first probe then does not
pay the drafter's page-in, and the budget prices each depth's drafting from the start. Before, a first
probe's full-depth draft (78-105 ms on the 2-core Xeon, against ~20 for a depth-3 step) priced every
budget out, and short generations (JSON answers) stayed plain.
"""
from __future__ import annotations

import time

import numpy as np

from .budget import PassCosts
from .draft import DFlashDrafter
from .sampling import SamplingParams
from .verify import Target

#: Timed passes per verification size recorded into the pass costs (after one untimed pass): two
#: samples make a size warm for ``PassCosts`` (a single one counts as cold and is measured again).
TIMED = 2


def _time_pass(target: Target, n: int, token: int, backend_choice: bool) -> float:
    """One verification of a chain of ``n`` copies of ``token`` and the commit of its root; seconds
    (what a decode step times for it: ``StepRecord.t_verify``)."""
    t0 = time.perf_counter()
    target.verify(np.full(n, token, dtype=np.int64), np.arange(-1, n - 1), backend_choice=backend_choice)
    target.commit([0])
    return time.perf_counter() - t0


def warm_up(target: Target, drafter: DFlashDrafter | None, sizes: list[int], costs: PassCosts | None,
            backend_argmax: bool, inject_rows: int = 0, sampler_rows: int = 0, top_k: int = 1) -> float:
    """Run the target's verification at each size in ``sizes`` (nodes, root included) once untimed and
    ``TIMED`` times timed (recorded into ``costs`` when given), with the drafter's features captured
    when there is a drafter; then the drafter's injections of 1..``inject_rows`` rows and its block
    passes of every depth (with ``top_k`` candidates a row, as the trees draw them); with ``sampler_rows`` > 0 one pass of that many rows with the token sampler
    attached. Returns the seconds it took.

    Leaves both caches empty and the target's capture, chooser and committed length as it found them
    (the next generation's prefill starts from position 0 anyway). Sizes beyond the context or the
    batch are skipped, and so are injections that the drafter's cache cannot hold.
    """
    t0 = time.perf_counter()
    layers = list(target.feature_layers)
    if drafter is not None:
        target.set_features(drafter.layers)
    token = max(int(target.tok.bos), 0)  # any id: the values do not change a pass's cost (-1: none)
    sizes = sorted({int(n) for n in sizes if 1 <= n <= min(target.n_batch, target.n_ctx - 2)})
    sampler_rows = min(sampler_rows, max(sizes, default=0))
    if drafter is not None:  # the drafter's cache holds the target's context
        inject_rows = min(inject_rows, target.n_ctx - drafter.block_size - 1)
    try:
        if backend_argmax and sizes and not target.attach_argmax(max(sizes)):
            backend_argmax = False
        for n in sizes:
            if target.n_past + n + TIMED + 2 > target.n_ctx or target.n_past == 0:
                target.reset()  # from the start again (a chooser is kept attached)
                target.verify([token], backend_choice=backend_argmax)
                target.commit([0])
            _time_pass(target, n, token, backend_argmax)
            for _ in range(TIMED):
                s = _time_pass(target, n, token, backend_argmax)
                if costs is not None:
                    costs.record(n, s)
        if sampler_rows > 0 and target.attach_sampler(SamplingParams(temperature=0.7, top_p=0.95), 0, sampler_rows):
            for n in sorted({1, sampler_rows}):
                target.reset()
                target.verify([token], backend_choice=True)
                target.commit([0])
                _time_pass(target, n, token, True)
        if drafter is not None:
            width = len(drafter.layers) * target.model.n_embd
            for m in range(1, inject_rows + 1):
                drafter.reset()
                drafter.inject(np.zeros((m, width), np.float32), 0)
            drafter.reset()
            drafter.inject(np.zeros((1, width), np.float32), 0)
            for depth in range(1, drafter.block_size):
                drafter.top_k(token, 1, depth, top_k)
            drafter.draft_chain(token, 1, drafter.block_size - 1)
    finally:
        target.reset()
        target.detach_choice()
        target.set_features(layers)
        if drafter is not None:
            drafter.reset()
    return time.perf_counter() - t0


def warm_drafter(target: Target, drafter: DFlashDrafter, draft_costs=None, depths=(1, 2, 3, 4, 8)) -> bool:
    """The drafter's passes at ``depths`` (and its block's) once each untimed (its weights paged in, its
    graphs allocated), then, when ``draft_costs`` (``budget.DraftCosts``) is given, twice each timed into
    it: an injection of two feature rows and a chain draft of that depth, what a speculative step's
    drafting does. The drafter's cache is emptied again. A fraction of a second on the 2-core CPU. True."""
    width = len(drafter.layers) * target.model.n_embd
    token = max(int(target.tok.bos), 0)
    rows = np.zeros((2, width), np.float32)
    depths = sorted({d for d in depths if 1 <= d < drafter.block_size} | {drafter.block_size - 1})
    try:
        for timed in ((False, True, True) if draft_costs is not None else (False,)):
            for d in depths:
                drafter.reset()
                t0 = time.perf_counter()
                drafter.inject(rows, 0)
                drafter.draft_chain(token, 2, d)
                if timed:
                    draft_costs.record(d, time.perf_counter() - t0)
    finally:
        drafter.reset()
    return True
