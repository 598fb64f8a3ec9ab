"""Tree builders over random marginals: shapes, topology, and DDTree = the global top-B set."""
import itertools

import numpy as np
import pytest

from tfm_local.decode.tree import build_chain, build_ddtree, build_wide


def marginals(rng, D, K, V=50):
    logits = rng.normal(0, 2, (D, V))
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    order = np.argsort(-logp, axis=1)[:, :K]
    return order, np.take_along_axis(logp, order, 1)


def check_topology(tree):
    assert tree.parents[0] == -1 and tree.depth[0] == 0
    for i in range(1, len(tree)):
        p = tree.parents[i]
        assert 0 <= p < i and tree.depth[i] == tree.depth[p] + 1
        assert tree.logp[i] <= tree.logp[p] + 1e-12
    for p in set(tree.parents[1:].tolist()):  # siblings carry distinct tokens
        kids = tree.tokens[1:][tree.parents[1:] == p]
        assert len(set(kids.tolist())) == len(kids)


@pytest.mark.parametrize("seed", range(5))
def test_ddtree_is_global_top_b(seed):
    rng = np.random.default_rng(seed)
    D, K, B = 4, 3, 20
    tok, lp = marginals(rng, D, K)
    tree = build_ddtree(7, tok, lp, B)
    check_topology(tree)
    assert len(tree) == B + 1
    every = sorted((float(sum(lp[d, ks[d]] for d in range(len(ks)))) for n in range(1, D + 1)
                    for ks in itertools.product(range(K), repeat=n)), reverse=True)
    assert np.allclose(sorted(tree.logp[1:], reverse=True), every[:B])


def test_chain_and_wide():
    rng = np.random.default_rng(1)
    tok, lp = marginals(rng, 15, 8)
    chain = build_chain(3, tok, lp, 15)
    assert chain.parents.tolist() == list(range(-1, 15)) and chain.tokens[1:].tolist() == tok[:, 0].tolist()
    for w in (1, 2, 4, 8):
        t = build_wide(3, tok, lp, 64, width=w)
        check_topology(t)
        assert len(t) == 65
    # width 1 is best-first exactly
    assert np.allclose(build_wide(3, tok, lp, 64, width=1).logp, build_ddtree(3, tok, lp, 64).logp)


def test_budget_larger_than_tree_and_zero():
    rng = np.random.default_rng(2)
    tok, lp = marginals(rng, 2, 2)
    assert len(build_ddtree(0, tok, lp, 100)) == 1 + 2 + 4
    assert len(build_ddtree(0, tok, lp, 0)) == 1


@pytest.mark.parametrize("D,K,B", [(15, 8, 16), (15, 8, 64), (3, 2, 100), (1, 1, 5), (4, 3, 0), (15, 1, 15)])
def test_ddtree_is_wide_with_width_one_exactly(D, K, B):
    """build_ddtree's own loop gives the same tree as build_wide(width=1), bit for bit, ties included
    (log-probs rounded to a coarse grid so that equal path scores occur)."""
    for seed in range(4):
        tok, lp = marginals(np.random.default_rng(seed), D, K)
        lp = np.round(lp * 2) / 2 if seed % 2 else lp
        for lp_in in (lp, lp.astype(np.float32)):
            a, b = build_ddtree(5, tok, lp_in, B), build_wide(5, tok, lp_in, B, width=1)
            for name in ("parents", "tokens", "depth", "logp"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, seed)


def test_chain_matches_the_list_form():
    """build_chain's arrays equal the from_lists construction it replaces (dtypes included)."""
    from tfm_local.decode.tree import Tree

    tok, lp = marginals(np.random.default_rng(3), 15, 4)
    for B in (0, 1, 7, 15, 40):
        n = min(B, 15)
        cum = np.cumsum(lp[:n, 0])
        want = Tree.from_lists(9, [(i, int(tok[i, 0]), float(cum[i])) for i in range(n)])
        got = build_chain(9, tok, lp, B)
        for name in ("parents", "tokens", "depth", "logp"):
            x, y = getattr(got, name), getattr(want, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), (name, B)


def _path_scorer(rng, K, coarse=False):
    """A path-dependent scorer: log-softmax over K of logits drawn per path (cached, so repeated calls
    agree); ``coarse``: logits on a grid of 0.5, so that equal path scores occur."""
    seen = {}

    def score(paths):
        out = []
        for p in paths:
            if p not in seen:
                z = rng.normal(0, 2, K)
                z = np.round(z * 2) / 2 if coarse else z
                seen[p] = z - np.log(np.exp(z - z.max()).sum()) - z.max()
            out.append(seen[p])
        return np.asarray(out)
    return score


@pytest.mark.parametrize("seed", range(12))
def test_dartree_deferred_top_b_is_the_best_first_heaps_selection(seed):
    """DARTree's Lemma 1 as a property: over random supertrees (depth, candidates, width drawn at random,
    path-dependent log-probabilities, some with ties) and β ≤ 0, the global top-B by path + β·depth is
    prefix-closed and equals what a best-first heap over the same supertree selects, for every B."""
    from tfm_local.decode.tree import best_first_selection, build_dartree, dartree_supertree, global_top

    rng = np.random.default_rng(seed)
    D, K, W = int(rng.integers(1, 8)), int(rng.integers(1, 7)), int(rng.integers(1, 6))
    score = _path_scorer(rng, K, coarse=seed % 3 == 0)
    tok = rng.integers(0, 1000, size=(D, K))
    parents, depth, scores, _ = dartree_supertree(tok, score, W)
    for beta in (0.0, -0.2, -1.5):
        prune = scores + beta * depth
        for B in (0, 1, 2, 5, 17, len(parents) - 1, len(parents) + 3):
            top = np.sort(global_top(prune, B))
            assert np.array_equal(top, best_first_selection(parents, prune, B)), (beta, B)
            assert np.isin(parents[top], np.append(top, 0)).all()
        t = build_dartree(7, tok, 9, score, W, beta)
        assert len(t) == min(9, len(parents) - 1) + 1 and np.all(t.parents[1:] < np.arange(1, len(t)))
        assert np.all(t.depth[1:] == t.depth[t.parents[1:]] + 1)
    with pytest.raises(ValueError, match="beta"):
        build_dartree(7, tok, 9, score, W, 0.1)


@pytest.mark.parametrize("seed", range(6))
def test_dartree_over_marginals_with_wide_branches_is_ddtree(seed):
    """With a scorer that ignores the path (the marginals), β = 0 and W ≥ B, DARTree keeps every node
    DDTree could pick, so it picks DDTree's tree: the same node set (as token paths)."""
    from tfm_local.decode.tree import build_dartree

    rng = np.random.default_rng(seed)
    tok, lp = marginals(rng, 6, 4)
    for B in (1, 5, 16, 40):
        a = build_ddtree(3, tok, lp, B)
        b = build_dartree(3, tok, B, lambda paths: lp[[len(p) for p in paths]], width=B, beta=0.0)
        paths = lambda t: {tuple(t.tokens[t.path(i)]) for i in range(len(t))}  # noqa: E731
        assert paths(a) == paths(b), B
