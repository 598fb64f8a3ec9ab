"""Tree mode (patch 0003): one-pass verification of a draft tree on tiny synthetic targets.

Each node's logits must equal decoding that node's root-to-node path alone;
after committing an accepted path the cache must behave as if that path had
been decoded normally. The gemma3 target has a 4-token sliding window on
layers 0 and 1 (layer 2 global), shorter than the prompts and the trees'
depths, so an SWA layer must hide the ancestors and committed tokens that lie
outside a node's window.
"""
import llama_cpp
import numpy as np
import pytest

from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available
from tfm_local.lossless import classify
from tfm_local.decode.sampling import SamplingParams, draw_key, gumbel_noise, kept_set
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target
from test_engine import OracleDrafter, PROMPTS, run_ids, run_with_drafter


#: Sliding window of the gemma3 target (tokens); the prompts and tree depths exceed it.
SWA = 4


@pytest.fixture(scope="module", params=["qwen2", "llama", "gemma3"])
def target_path(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tree-{request.param}")
    return write_tiny_target(d / "t.gguf", arch=request.param, n_layer=3, n_embd=64, seed=11,
                             n_swa=SWA, swa_pattern=3)


def random_tree(rng, n, vocab):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    return np.array(parents, np.int32), rng.integers(0, vocab, n).astype(np.int32), np.array(depth, np.int32)


def path_of(parents, node):
    out = []
    while node >= 0:
        out.append(node)
        node = int(parents[node])
    return out[::-1]


#: Logit tolerance relative to the largest logit. The CPU kernels for a batch and for one row agree
#: to ~1e-3; on CUDA the batched matmuls take other (tensor-core) paths than single-row decoding and
#: differed by up to ~0.7% on these tiny F32 targets (H200), so an argmax flip is then
#: accepted only within a near-tie.
REL_TOL = 1.5e-2 if gpu_available() else 2e-3


def close(a, b):
    if gpu_available():
        return close_or_tie(a, b, rel=REL_TOL)
    scale = np.abs(b).max()
    return np.allclose(a, b, atol=REL_TOL * scale) and int(a.argmax()) == int(b.argmax())


def close_or_tie(a, b, rel=None):
    """Like ``close`` with a looser tolerance (default 5e-3, ``REL_TOL`` on CUDA); an argmax flip only
    within a near-tie of ``b``."""
    atol = (rel or max(REL_TOL, 5e-3)) * np.abs(b).max()
    top2 = np.sort(b)[-2:]
    return np.allclose(a, b, atol=atol) and (int(a.argmax()) == int(b.argmax()) or top2[1] - top2[0] < 2 * atol)


def assert_rows_equal_or_close(a, b):
    """Bitwise equal on the CPU (its batched and one-row kernels agree exactly here); on a GPU build,
    where CUDA's batched kernels round otherwise, every last-axis row ``close_or_tie`` within ``REL_TOL``."""
    a, b = np.asarray(a), np.asarray(b)
    if not gpu_available():
        np.testing.assert_array_equal(a, b)
        return
    assert a.shape == b.shape
    bad = [i for i, (x, y) in enumerate(zip(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])))
           if not close_or_tie(x, y, rel=REL_TOL)]
    assert not bad, f"rows {bad} differ beyond REL_TOL={REL_TOL} or change argmax outside a near-tie"


def assert_greedy_same_or_near_tie(target_path, prompt_ids, out, ref):
    """Greedy ``out == ref``; on a GPU build they may instead part where plain decoding nearly tied.

    At the first difference both tokens' logits, from prefilling ``prompt_ids + ref[:i]`` on a fresh
    target, must lie within ``2 * REL_TOL`` of the largest |logit| below the best (the near-tie of
    ``close_or_tie``); the tokens before it are equal by construction. The CPU stays exact.
    """
    if not gpu_available() or out == ref:
        assert out == ref
        return
    r = Target(target_path, n_ctx=512, n_batch=64)
    try:
        d = classify(r, prompt_ids, ref, out, rel=2 * REL_TOL)
    finally:
        r.close()
    assert d.near_tie, (f"token {d.index}: plain {d.ref_token} vs speculative {d.out_token}, their logits {d.gaps} "
                        f"below the best (not a near-tie; lengths {len(ref)} vs {len(out)})")


def assert_same_or_near_tie(target_path, prompt_ids, out, ref, sp, tol=3e-3):
    """``out == ref``, or they part where plain decoding's draw was a numerical near-tie.

    A draw is the Gumbel-max of the kept tokens' ``(x - max) / T + noise`` with noise keyed by (seed,
    position, id), so logits that differ by rounding (another batch shape) can swap two scores that
    nearly tie. At the first difference both tokens' scores on the reference row must lie within
    ``tol`` of the best.
    """
    if out == ref:
        return
    i = next(k for k, (a, b) in enumerate(zip(out, ref)) if a != b)
    r = Target(target_path, n_ctx=512, n_batch=64)
    try:
        x = np.array(r.prefill(prompt_ids + ref[:i]))
    finally:
        r.close()
    keep = kept_set(x, sp)
    score = np.full(x.shape[0], -np.inf)
    ids = np.flatnonzero(keep)
    score[ids] = (x[ids].astype(np.float64) - x[ids].max()) / sp.temperature + gumbel_noise(
        draw_key(sp.seed, len(prompt_ids) + i), ids)
    best = score.max()
    assert best - score[out[i]] <= tol and best - score[ref[i]] <= tol, (
        f"token {i}: {out[i]} != {ref[i]} and not a near-tie (scores {best - score[out[i]]:.4g}, "
        f"{best - score[ref[i]]:.4g} below the best)")


@pytest.mark.parametrize("shape", ["chain", "star", "bushy"])
def test_node_logits_equal_path_decoding(target_path, shape):
    rng = np.random.default_rng({"chain": 1, "star": 2, "bushy": 3}[shape])
    tree_t = Target(target_path, n_ctx=256, n_batch=64)
    ref_t = Target(target_path, n_ctx=256, n_batch=64)
    prompt = tree_t.tok.encode(PROMPTS[0])
    n = 24
    if shape == "chain":
        parents = np.arange(-1, n - 1, dtype=np.int32)
    elif shape == "star":
        parents = np.array([-1] + [0] * (n - 1), np.int32)
    else:
        parents = random_tree(rng, n, 10)[0]
    depth = np.zeros(n, np.int32)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = rng.integers(0, tree_t.model.n_vocab - 20, n).astype(np.int32)
    tree_t.prefill(prompt)
    logits = np.array(tree_t.verify(tokens, parents, depth).logits)
    for node in range(n):
        ref_t.prefill(prompt)
        ref = np.array(ref_t.verify([int(tokens[j]) for j in path_of(parents, node)]).logits)[-1]
        assert close(logits[node], ref), f"node {node} (depth {depth[node]}) differs from its path"
    # commit the deepest path: the next decode equals plain decoding of prompt + path
    leaf = int(np.argmax(depth))
    path = path_of(parents, leaf)
    tree_t.commit(path)
    nxt = np.array(tree_t.verify([5]).logits)[0]
    ref_t.prefill(prompt + [int(tokens[j]) for j in path] + [5])
    assert close(nxt, np.array(ref_t.ctx.logits(1))[0])
    tree_t.close()
    ref_t.close()


def test_commit_root_only_and_repeat(target_path):
    t = Target(target_path, n_ctx=256, n_batch=64)
    r = Target(target_path, n_ctx=256, n_batch=64)
    rng = np.random.default_rng(5)
    prompt = t.tok.encode(PROMPTS[2])
    t.prefill(prompt)
    committed = list(prompt)
    for step in range(6):  # several tree steps in a row, committing 1..k nodes
        parents, tokens, depth = random_tree(rng, 12, t.model.n_vocab - 20)
        t.verify(tokens, parents, depth)
        node = int(rng.integers(0, 12)) if step else 0
        path = path_of(parents, node)
        t.commit(path)
        committed += [int(tokens[j]) for j in path]
    probe = np.array(t.verify([7]).logits)[0]
    r.prefill(committed + [7])
    assert close(probe, np.array(r.ctx.logits(1))[0])
    t.close()
    r.close()


def small_swa_target(path, **kw) -> Target:
    """A Target on llama.cpp's small SWA cache (``swa_full=False``; our default is the full one).

    That cache has window + n_ubatch cells (padded to 256); a new token reuses
    cells that have left its sequence's window, so a long run wraps around it.
    """
    default = llama_cpp.llama_context_default_params

    def params():
        p = default()
        p.swa_full = False
        return p

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llama_cpp, "llama_context_default_params", params)
        return Target(path, **kw)


def test_gemma3_small_swa_cache_wraps_around(tmp_path):
    """Many tree steps on a 256-cell SWA cache: tree cells reuse pruned window cells, stay exact."""
    path = write_tiny_target(tmp_path / "g.gguf", arch="gemma3", n_layer=3, n_embd=64, seed=11,
                             n_swa=SWA, swa_pattern=3)
    t = small_swa_target(path, n_ctx=1024, n_batch=64)
    r = Target(path, n_ctx=1024, n_batch=64)
    rng = np.random.default_rng(7)
    prompt = t.tok.encode(PROMPTS[0])
    t.prefill(prompt)
    r.prefill(prompt)
    while t.n_past < 400:  # past 256 cells: the SWA cache has wrapped around
        parents, tokens, depth = random_tree(rng, 40, t.model.n_vocab - 20)
        logits = np.array(t.verify(tokens, parents, depth).logits)
        node = int(np.argmax(depth)) if rng.random() < 0.5 else int(rng.integers(0, 40))
        path = path_of(parents, node)
        ref = np.array(r.verify([int(tokens[j]) for j in path]).logits)
        for k, j in enumerate(path):
            assert close_or_tie(logits[j], ref[k]), f"at {t.n_past}: node {j} (depth {depth[j]}) differs"
        t.commit(path)
        r.commit(range(len(path)))
    probe = np.array(t.verify([7]).logits)[0]
    assert close_or_tie(probe, np.array(r.verify([7]).logits)[0])
    t.close()
    r.close()


class TreeOracle(OracleDrafter):
    """Marginals that put the reference token among the top candidates (often not first)."""

    def marginals(self, last_token, pos, n_draft):
        real = np.array(self.inner.marginals(last_token, pos, n_draft))
        start = pos - self.prompt_len + 1
        for i in range(n_draft):
            j = start + i
            if 0 <= j < len(self.script):
                real[i, self.script[j]] = real[i].max() + (self.rng.normal(0, 1) - 0.3)
        return real


@pytest.mark.parametrize("mode", ["ddtree", "wide"])
def test_tree_engine_greedy_equals_plain(target_path, mode):
    from tfm_convert.pipeline import init_random

    drafter, _ = init_random(target_path, target_path.with_name(f"d-{mode}.gguf"), layers=1, seed=3)
    plain = Engine(target_path, None, n_ctx=512)
    spec = Engine(target_path, drafter, n_ctx=512, tree=mode, budget=24)
    try:
        for prompt in PROMPTS:
            ref = run_ids(plain, prompt, 48)
            oracle = TreeOracle(spec.drafter, len(plain.prompt_tokens(prompt)), ref, 0.0)
            assert run_with_drafter(spec, oracle, prompt, 48) == ref
            assert spec.stats.tau > 1.5
            assert run_ids(spec, prompt, 24) == ref[:24]  # the random drafter's trees too
        sp = SamplingParams(temperature=0.9, seed=3)
        assert_same_or_near_tie(target_path, plain.prompt_tokens(PROMPTS[0]), run_ids(spec, PROMPTS[0], 32, sp),
                                run_ids(plain, PROMPTS[0], 32, sp), sp)
    finally:
        spec.close()
        plain.close()


@pytest.mark.parametrize("mode", ["ddtree", "wide"])
def test_tree_runs_to_the_end_of_a_small_context(target_path, mode):
    """Node count is bounded by the room left: generation ends cleanly at the context limit."""
    from tfm_convert.pipeline import init_random

    drafter, _ = init_random(target_path, target_path.with_name(f"e-{mode}.gguf"), layers=1, seed=4)
    plain = Engine(target_path, None, n_ctx=64)
    with Engine(target_path, drafter, n_ctx=64, tree=mode, budget=None) as spec:  # fixed: every step drafts
        assert spec.budget == 63 or spec.budget == spec.target.n_batch - 1
        out = run_ids(spec, PROMPTS[0], 1000)
        assert out == run_ids(plain, PROMPTS[0], 1000)
        assert spec.target.n_past <= 64
    plain.close()


def test_bad_tree_options(target_path):
    with pytest.raises(ValueError):
        Engine(target_path, None, n_ctx=64, tree="wide", tree_width=0)
    with pytest.raises(ValueError):
        Engine(target_path, None, n_ctx=64, tree="forest")
