"""Acceptance walk over random trees against a synthetic target (no llama.cpp needed).

The synthetic target's logits depend only on the token prefix (a hash), as a
real target's do; the checks are that the walk is exactly the target's own
decoding, greedy and sampled, whatever the tree.
"""
import hashlib

import numpy as np
import pytest

from tfm_local.decode.accept import walk_tree
from tfm_local.decode.sampling import SamplingParams, TokenChooser

V = 6


def logits_of(prefix: tuple[int, ...], sharp: float = 2.0) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(repr(prefix).encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(0, sharp, V).astype(np.float32)


def random_tree(rng, n_nodes: int, root_token: int):
    """Topological random tree of at most ``n_nodes`` nodes, distinct tokens among siblings."""
    parents, tokens = [-1], [root_token]
    for _ in range(1, n_nodes):
        p = int(rng.integers(0, len(parents)))
        taken = {tokens[j] for j in range(1, len(parents)) if parents[j] == p}
        free = [t for t in range(V) if t not in taken]
        if not free:
            continue
        parents.append(p)
        tokens.append(int(rng.choice(free)))
    return np.array(parents), np.array(tokens)


def prefix_of(node, parents, tokens, context):
    path = []
    while node != -1:
        path.append(int(tokens[node]))
        node = int(parents[node])
    return context + tuple(reversed(path))


def pick(choose, prefix):
    """The target's token after ``prefix``: drawn for position ``len(prefix)``."""
    return choose(logits_of(prefix), len(prefix))


def plain_decode(context, n, sp):
    choose = TokenChooser(sp)
    out = []
    while len(out) < n:
        out.append(pick(choose, context + tuple(out)))
    return out


def speculative_decode(context, n, sp, rng, tree_size):
    choose = TokenChooser(sp)
    out = [pick(choose, context)]
    while len(out) < n:
        parents, tokens = random_tree(rng, tree_size, out[-1])
        base = context + tuple(out[:-1])
        walk = walk_tree(parents, tokens, lambda node: pick(choose, prefix_of(node, parents, tokens, base)),
                         max_tokens=n - len(out))
        assert all(int(tokens[walk.path[i + 1]]) == walk.tokens[i] for i in range(walk.n_accepted))
        out.extend(walk.tokens)
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
@pytest.mark.parametrize("tree_size", [1, 2, 8, 40])
def test_walk_equals_plain_decoding(temperature, tree_size):
    """Same seed, draws keyed by position: the speculative output is token-for-token the plain one."""
    rng = np.random.default_rng(tree_size)
    for trial in range(5):
        sp = SamplingParams(temperature=temperature, top_k=4 if trial % 2 else 0, top_p=0.9 if trial % 3 else 1.0,
                            seed=trial)
        ctx = (trial,)
        assert speculative_decode(ctx, 30, sp, rng, tree_size) == plain_decode(ctx, 30, sp)


def test_greedy_accepts_longest_matching_branch():
    """A tree holding the target's greedy continuation on one branch is accepted along it."""
    ctx = (9,)
    greedy = plain_decode(ctx, 6, SamplingParams())
    # root = greedy[0]; a decoy branch first, then the true chain of 4 drafts
    parents = [-1, 0, 1, 0, 3, 4, 5]
    wrong = (greedy[1] + 1) % V
    tokens = [greedy[0], wrong, greedy[2], greedy[1], greedy[2], greedy[3], greedy[4]]
    choose = TokenChooser(SamplingParams())
    p, t = np.array(parents), np.array(tokens)
    walk = walk_tree(p, t, lambda node: pick(choose, prefix_of(node, p, t, ctx)))
    assert walk.path == [0, 3, 4, 5, 6]
    assert walk.tokens == greedy[1:6]


def test_max_tokens_stops_the_walk():
    ctx = (3,)
    greedy = plain_decode(ctx, 5, SamplingParams())
    p, t = np.arange(-1, 4), np.array(greedy[:5])
    choose = TokenChooser(SamplingParams())
    walk = walk_tree(p, t, lambda node: pick(choose, prefix_of(node, p, t, ctx)), max_tokens=2)
    assert walk.tokens == greedy[1:3] and walk.path == [0, 1]
