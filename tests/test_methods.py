"""The drafting methods (tfm_local.decode.methods): one object per method, built and checked once by one
factory from the user's options, each turning one drafter pass into a ``Tree``; the engine and the step
hold the object, so that a method added to the factory drives them unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.decode.draft import DFlashDrafter
from tfm_local.decode.methods import METHODS, TREE_SHAPES, DraftMethod, make_method, method_class
from tfm_local.decode.methods.base import marginal_tree
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.stats import PHASES, PhaseClock
from tfm_local.decode.tree import build_chain, build_ddtree, build_wide
from tfm_local.decode.verify import Target

from test_drafter_topk import PROMPT, paths  # noqa: F401  (paths: the tiny qwen2 target + random drafter)


def test_the_factory_makes_each_method_once_from_the_options():
    for name in TREE_SHAPES:
        m = make_method(name, 5, 3, weaver_given=True)
        assert isinstance(m, DraftMethod) and m.name == name and (m.top_k, m.width) == (5, 3)
        assert method_class(name) is METHODS[name] is type(m)
    assert TREE_SHAPES == ("chain", "ddtree", "wide", "tfm", "dartree", "lattice")  # the order help lists them in
    for args, kw, msg in [(("bogus",), {}, "unknown tree mode 'bogus'; choose one of chain, ddtree"),
                          ((["chain"],), {}, "unknown tree mode"),
                          (("tfm",), {}, 'tree="tfm" needs a Weaver: --weaver'),
                          (("dartree",), {}, 'tree="dartree" needs a correction head'),
                          (("wide", 8, 0), {}, "must be >= 1"), (("ddtree", 0), {}, "must be >= 1")]:
        with pytest.raises(ValueError, match=msg):
            make_method(*args, **kw)
    # the lattice tree needs a DFlash2 drafter only once one is loaded (without one it never drafts)
    assert make_method("lattice").name == "lattice"


def test_each_method_draws_its_builders_tree(paths):
    """On a DFlash drafter: the chain is the drafter's greedy chain (its top-1 path log-probabilities kept
    for the gain curve), DDTree and wide the builders' trees over its marginals; TfM and DARTree without a
    loaded Weaver draft DDTree (a generation's first step); the lattice tree and DARTree refuse a DFlash
    drafter when made for it, and the lattice tree refuses one at draft time."""
    tgt = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    dft = DFlashDrafter(paths[1], tgt, n_threads=1)
    try:
        tgt.prefill(PROMPT, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s))
        last, pos, k = 9, tgt.n_past, 6
        cand, logp = dft.top_k(last, pos, k, 4)
        want = {"chain": build_chain(last, cand[:, :1], logp[:, :1], k), "ddtree": build_ddtree(last, cand, logp, k),
                "wide": build_wide(last, cand, logp, k, width=2), "tfm": build_ddtree(last, cand, logp, k),
                "dartree": build_ddtree(last, cand, logp, k)}
        for name, tree in want.items():
            acc = dict.fromkeys(PHASES, 0.0)
            got = make_method(name, 4, 2, weaver_given=True).draft(dft, last, pos, k, PhaseClock(acc))
            assert got.tokens.tolist() == tree.tokens.tolist() and got.parents.tolist() == tree.parents.tolist(), name
            np.testing.assert_allclose(got.logp, tree.logp, err_msg=name)
            assert acc["drafter"] > 0 and sum(acc.values()) == acc["drafter"], name  # the caller times the tree
        for scored in (True, False):  # without the gain curve, the drafter's draft_chain (logp 0)
            chain = make_method("chain").draft(dft, last, pos, k, PhaseClock(dict.fromkeys(PHASES, 0.0)), scored)
            assert chain.tokens[1:].tolist() == dft.draft_chain(last, pos, k)
            assert (chain.logp[1:] != 0).all() == scored
        for name, msg in (("lattice", "needs a DFlash2 drafter"), ("dartree", "correction head")):
            with pytest.raises(ValueError, match=msg):
                make_method(name, drafter=dft)
        with pytest.raises(ValueError, match="needs a DFlash2 drafter"):
            make_method("lattice").draft(dft, last, pos, k, PhaseClock(dict.fromkeys(PHASES, 0.0)))
    finally:
        dft.close()
        tgt.close()


class WideByOne(DraftMethod):
    """A method the engine has never heard of: the w-wide heap popping one entry a round (DDTree's tree)."""

    name = "wide1"

    def draft(self, drafter, last, pos, budget, clock, path_logp=True):
        return marginal_tree(drafter, lambda *a: build_wide(*a, width=1), self.top_k, last, pos, budget, clock)


def test_a_method_added_to_the_factory_drives_the_engine(paths, monkeypatch):
    """One class and its line in the factory's table: the engine takes it by name, its steps draft its trees,
    and greedy output stays the target's own."""
    from tfm_local.engine import Engine

    monkeypatch.setitem(METHODS, WideByOne.name, WideByOne)
    sp = SamplingParams()
    with Engine(paths[0], None, n_ctx=256, n_threads=1) as plain, \
            Engine(paths[0], paths[1], n_ctx=256, budget=6, tree="wide1", n_threads=1) as e:
        assert e.tree_mode == "wide1" and isinstance(e.method, WideByOne)
        want = list(plain.generate_ids(PROMPT, 24, sp))
        assert list(e.generate_ids(PROMPT, 24, sp)) == want
        assert e.stats.n_drafted > 0
        e.set_draft("ddtree", 6)
        assert list(e.generate_ids(PROMPT, 24, sp)) == want and e.tree_mode == "ddtree"
        with pytest.raises(ValueError, match="unknown tree mode 'wide2'"):
            e.set_draft("wide2", 6)
        assert e.tree_mode == "ddtree"
