"""Op-level tests of the Gated DeltaNet tree ops (patch 0005) against a float64 numpy reference.

The reference runs the plain recurrence along every root-to-node path from the initial state
(S <- diag(e^g) S; u = beta (v - S^T k); S += k u^T; o = S^T q / sqrt(S_v)), the conv over each
node's ancestor window, and the commits as the path run through the recurrence / the conv
state shifted along the path. Random trees: chains, stars, forests of roots, deep and bushy
trees, N up to 128, depth up to 16; S_v 64 and 128; qwen35's head broadcast (H_k < H_v, v head
h reads k head h % H_k). The ops' results are NaN-filled before every run, so any element an
op leaves unwritten fails the finiteness check.

Error bounds (F32, the only dtype of these ops), as max |op - ref| / max(1, max |ref|):
ERR_F32_BY_DEVICE below; docs/gdn-tree.md lists the measured values.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from tfm_local.testing import op_harness
from tfm_local.testing import gdn_ops as tree_ops

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# float32 error bounds relative to max(1, max |ref|), per device (shared with the GDN benchmark's
# correctness checks, tfm_local/bench/gdn.py)
ERR_F32_BY_DEVICE = tree_ops.ERR_F32_BY_DEVICE

# the GPU cases exist only on a build with a GPU device (a skip would fail CI under TFM_NO_SKIP)
DEVICES = tree_ops.available_devices() or ["cpu"]


def _rng(*key) -> np.random.Generator:
    """A generator seeded from ``key`` (stable across runs, unlike hash() of strings)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def check_tree_op(device: str, q, k, v, g, beta, state, parent, n_threads: int = 2):
    """Run the tree op on ``device``; assert every output written (NaN poison) and o, u, γ within the
    device's bounds of the float64 per-path reference; returns the op's k copy."""
    err = ERR_F32_BY_DEVICE[device]
    o, u, gamma, kc = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, parent, device=device,
                                                    n_threads=n_threads)
    for x in (o, u, gamma, kc):
        assert np.isfinite(x).all(), "an output element was left unwritten (NaN poison)"
    ro, ru, rg = ref_tree(q, k, v, g, beta, state, parent)
    assert rel_err(o, ro) < err["o"]
    assert rel_err(u, ru) < err["u"]
    assert rel_err(gamma, rg) < err["gamma"]
    return kc


def _device_or_skip(device: str) -> None:
    """Skip when the patched library is missing (counts as a failure under TFM_NO_SKIP=1)."""
    try:
        op_harness.lib()
    except op_harness.NativeError as e:
        pytest.skip(str(e))


# -- trees -------------------------------------------------------------------------------------

def make_tree(kind: str, n: int, rng: np.random.Generator, max_depth: int = 16) -> np.ndarray:
    """Parent array int32 ``[n]`` in topological order (parent < node, -1 = root) of a tree of ``kind``.

    chain: 0 <- 1 <- 2 ...; star: node 0 and n-1 children; forest: n roots; deep: mostly extends
    the newest node up to ``max_depth``; bushy: a uniform pick among nodes above ``max_depth``;
    ddtree: a best-first-heap-like shape (few roots, wide near the top).
    """
    if kind == "chain":
        return np.arange(-1, n - 1, dtype=np.int32)
    if kind == "star":
        return np.array([-1] + [0] * (n - 1), dtype=np.int32)[:n]
    if kind == "forest":
        return np.full(n, -1, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int64)  # roots at depth 1
    depth[0] = 1
    for i in range(1, n):
        ok = np.flatnonzero(depth[:i] < max_depth)
        if kind == "deep":
            j = i - 1 if depth[i - 1] < max_depth and rng.random() < 0.8 else int(rng.choice(ok))
        elif kind == "bushy":
            j = int(rng.choice(ok)) if rng.random() > 0.05 else -1
        elif kind == "ddtree":
            w = 1.0 / (1.0 + depth[ok])
            j = int(rng.choice(ok, p=w / w.sum())) if rng.random() > 0.02 else -1
        else:
            raise ValueError(kind)
        parent[i] = j
        depth[i] = 1 if j < 0 else depth[j] + 1
    return parent


def tree_depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node (roots 1)."""
    d = np.zeros(len(parent), dtype=np.int64)
    for i, p in enumerate(parent):
        d[i] = 1 if p < 0 else d[p] + 1
    return d


def root_path(parent: np.ndarray, a: int) -> list[int]:
    """Node indices from the root down to ``a`` (empty for a = -1)."""
    path = []
    while a >= 0:
        path.append(int(a))
        a = int(parent[a])
    return path[::-1]


# -- inputs and float64 references ---------------------------------------------------------------

def make_inputs(rng, B, N, H, H_k, S, kda, B_k=None):
    """Random GDN inputs shaped as qwen35 feeds them: q, k L2-normalised, beta in (0, 1), g <= 0."""
    B_k = B if B_k is None else B_k

    def l2n(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = l2n(rng.standard_normal((B_k, N, H_k, S))).astype(np.float32)
    k = l2n(rng.standard_normal((B_k, N, H_k, S))).astype(np.float32)
    v = rng.standard_normal((B, N, H, S)).astype(np.float32)
    g = -rng.uniform(0.005, 0.7, size=(B, N, H, S if kda else 1)).astype(np.float32)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((B, N, H))))).astype(np.float32)
    state = (0.5 * rng.standard_normal((B, H, S, S))).astype(np.float32)
    return q, k, v, g, beta, state


def _heads(x, b, t, H, B):
    """Rows of a q/k input for sequence b, token t broadcast to the H v heads (tiled: h % H_k)."""
    B_k, _, H_k, _ = x.shape
    return x[b // (B // B_k), t, np.arange(H) % H_k].astype(np.float64)  # [H, S]


def ref_path(q, k, v, g, beta, state, b, path):
    """float64 plain recurrence of sequence ``b`` along ``path``: (o of the last node [H, S], u of the
    last node [H, S], gamma of the last node [H, G], state after the path [H, S(c), S(r)] in ggml's layout)."""
    B, _, H, S = v.shape
    St = state[b].astype(np.float64).transpose(0, 2, 1)  # St[h, r, c] = S[r][c]
    o = u = None
    gamma = np.zeros((H, g.shape[-1]))
    for t in path:
        kt, qt = _heads(k, b, t, H, B), _heads(q, b, t, H, B)
        gt = g[b, t].astype(np.float64)               # [H, G]
        gamma = gamma + gt
        St = St * np.exp(gt)[:, :, None]              # rows r scaled by e^{g[r]} (or e^g)
        u = beta[b, t].astype(np.float64)[:, None] * (v[b, t] - np.einsum("hrc,hr->hc", St, kt))
        St = St + kt[:, :, None] * u[:, None, :]
        o = np.einsum("hrc,hr->hc", St, qt) / np.sqrt(S)
    return o, u, gamma, St.transpose(0, 2, 1)


def ref_tree(q, k, v, g, beta, state, parents):
    """float64 reference of the tree op: o, u, gamma per node, each from its own root-to-node path."""
    B, N, H, S = v.shape
    o = np.zeros((B, N, H, S))
    u = np.zeros((B, N, H, S))
    gamma = np.zeros((B, N, H, g.shape[-1]))
    for b in range(B):
        par = parents[b] if parents.ndim == 2 else parents
        for i in range(N):
            o[b, i], u[b, i], gamma[b, i], _ = ref_path(q, k, v, g, beta, state, b, root_path(par, i))
    return o, u, gamma


def ref_conv_tree(sx, c, parent):
    """float64 conv of every node over [d_conv-1 nearest ancestors (then the conv state), itself]: (B, N, C)."""
    B, C, T = sx.shape
    d = c.shape[1]
    N = T - (d - 1)
    out = np.zeros((B, N, C))
    for b in range(B):
        par = parent[b] if parent.ndim == 2 else parent
        for i in range(N):
            seq = [sx[b, :, j].astype(np.float64) for j in range(d - 1)]
            seq += [sx[b, :, d - 1 + j].astype(np.float64) for j in root_path(par, i)]
            window = np.stack(seq[-d:], axis=1)  # [C, d], oldest first
            out[b, i] = (window * c).sum(axis=1)
    return out


rel_err = tree_ops.rel_err


# -- tests -------------------------------------------------------------------------------------

TREES = [("chain", 16), ("star", 33), ("forest", 8), ("deep", 128), ("bushy", 128), ("ddtree", 64), ("chain", 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("S", [64, 128])
@pytest.mark.parametrize("kda", [False, True], ids=["scalar-g", "vector-g"])
@pytest.mark.parametrize("kind,N", TREES)
def test_gdn_tree_matches_per_path_recurrence(device, S, kda, kind, N):
    _device_or_skip(device)
    rng = _rng(S, kda, kind, N)
    B, H, H_k = 1, 4, 2
    parent = make_tree(kind, N, rng)
    assert tree_depths(parent).max() <= 16
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, kda)
    np.testing.assert_array_equal(check_tree_op(device, q, k, v, g, beta, state, parent, n_threads=3), k)


# Cases of the CUDA fast path (scalar gate, N <= 128): (B, N, H_v, H_k, S, B_k, tree kinds per sequence,
# max depth). v heads per k head 3, 1 (q/k shared by both sequences) and 8 (the per-k-head pairs
# kernel's largest); the last: paths of 20-40 nodes and a 60-node chain (ancestor sums of 17-32 entries
# staged in shared memory, the rest read from the scratch).
GPU_FAST_CASES = {
    "r3-two-seqs": (2, 96, 6, 2, 128, 2, ("bushy", "ddtree"), 16),
    "r1-shared-qk": (2, 64, 4, 4, 64, 1, ("bushy", "ddtree"), 16),
    "r8-n128": (1, 128, 16, 2, 128, 1, ("ddtree",), 16),
    "deep-paths": (2, 60, 6, 2, 64, 1, ("deep", "chain"), 40),
}


def _gpu_fast_case(name: str):
    """Inputs and per-sequence parents of GPU_FAST_CASES[name]."""
    B, N, H, H_k, S, B_k, kinds, depth = GPU_FAST_CASES[name]
    rng = _rng("gpu-fast", name)
    parent = np.stack([make_tree(kind, N, rng, max_depth=depth) for kind in kinds])
    return make_inputs(rng, B, N, H, H_k, S, False, B_k=B_k), parent


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_FAST_CASES))
def test_gdn_tree_cuda_fast_path_matches_reference_and_cpu(case):
    """CUDA, the shipped fast path (pairs per k head, state products on a forked stream, level-ordered
    solve): within the GPU bounds of the float64 per-path reference and of the CPU op, the k copy
    exact; per-sequence trees, head broadcast, q/k shared by sequences, paths deeper than 32."""
    _device_or_skip("gpu")
    inputs, parent = _gpu_fast_case(case)
    kc = check_tree_op("gpu", *inputs, parent)
    np.testing.assert_array_equal(kc, inputs[1])
    gpu = tree_ops.gated_delta_net_tree(*inputs, parent, device="gpu")
    cpu = tree_ops.gated_delta_net_tree(*inputs, parent, device="cpu", n_threads=2)
    err = ERR_F32_BY_DEVICE["gpu"]
    for name, x, y in zip(("o", "u", "gamma"), gpu, cpu):
        assert rel_err(x, y) < err[name], name


@pytest.mark.gpu
def test_gdn_tree_cuda_pairs_per_v_head_fallback():
    """CUDA: more than 8 v heads per k head (here 9) take the pairs kernel with one block per v head;
    same bounds against the float64 reference."""
    _device_or_skip("gpu")
    rng = _rng("gpu-vhead-pairs")
    B, N, H, H_k, S = 1, 80, 18, 2, 64
    parent = np.stack([make_tree("ddtree", N, rng)])
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, False)
    np.testing.assert_array_equal(check_tree_op("gpu", q, k, v, g, beta, state, parent), k)


@pytest.mark.gpu
def test_gdn_tree_cuda_runs_are_bit_identical():
    """CUDA: the fast path is deterministic (the forked state stream, the level solve's fixed sum
    order): two runs of every GPU_FAST_CASES case give the same bytes."""
    _device_or_skip("gpu")
    for case in sorted(GPU_FAST_CASES):
        inputs, parent = _gpu_fast_case(case)
        a = tree_ops.gated_delta_net_tree(*inputs, parent, device="gpu")
        b = tree_ops.gated_delta_net_tree(*inputs, parent, device="gpu")
        assert all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b)), case


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kda", [False, True], ids=["scalar-g", "vector-g"])
def test_gdn_tree_per_sequence_trees_and_broadcasts(device, kda):
    """Two sequences with their own trees; q/k shared by both sequences (B_k = 1), H_k = 1."""
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = np.random.default_rng(7 + kda)
    B, N, H, H_k, S = 2, 40, 3, 1, 64
    parent = np.stack([make_tree("bushy", N, rng), make_tree("deep", N, rng)])
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, kda, B_k=1)
    check_tree_op(device, q, k, v, g, beta, state, parent)
    # a parent array shared by both sequences ([N] broadcast)
    o2, *_ = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, parent[0], device=device)
    ro2, _, _ = ref_tree(q, k, v, g, beta, state, np.stack([parent[0], parent[0]]))
    assert rel_err(o2, ro2) < err["o"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("S", [32, 128])
@pytest.mark.parametrize("kda", [False, True], ids=["scalar-g", "vector-g"])
@pytest.mark.parametrize("N", [100, 160])
def test_gdn_tree_paths_deeper_than_32(device, S, kda, N):
    """Paths of up to ~90 nodes (a 70-node chain, then random parents) and N past 128: the CUDA
    scalar-gate kernels keep 32 ancestors per node in registers and read the rest apart, and fall
    back to the column-warp kernel above 128 nodes."""
    _device_or_skip(device)
    rng = _rng("deep32", S, kda, N)
    B, H, H_k = 1, 4, 2
    parent = np.arange(-1, N - 1, dtype=np.int32)
    for i in range(70, N):
        parent[i] = int(rng.integers(-1, i))
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, kda)
    g *= 0.2  # decays e^g in ~(0.87, 1): the deep ancestors still matter
    np.testing.assert_array_equal(check_tree_op(device, q, k, v, g, beta, state, parent), k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("S", [64, 128])
@pytest.mark.parametrize("kda", [False, True], ids=["scalar-g", "vector-g"])
def test_gdn_tree_on_a_chain_equals_gated_delta_net(device, S, kda):
    """On a chain the tree op gives ggml_gated_delta_net's outputs, and the commit of the whole
    chain its final state."""
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = np.random.default_rng(11 + S + kda)
    B, N, H, H_k = 2, 24, 4, 2
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, kda)
    chain = make_tree("chain", N, rng)
    o_ref, s_ref = tree_ops.gated_delta_net(q, k, v, g, beta, state, device=device)
    o, u, gamma, kc = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, chain, device=device)
    assert rel_err(o, o_ref) < err["chain_vs_gdn"]
    path = np.tile(np.arange(N, dtype=np.int32), (B, 1))
    s_commit = tree_ops.gated_delta_net_tree_commit(state, kc, u, gamma, path, device=device)
    assert rel_err(s_commit, s_ref) < err["chain_vs_gdn"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("S", [64, 128])
@pytest.mark.parametrize("kda", [False, True], ids=["scalar-g", "vector-g"])
@pytest.mark.parametrize("kind,N", [("bushy", 128), ("ddtree", 96), ("star", 20)])
def test_gdn_commit_equals_recurrence_along_accepted_path(device, S, kda, kind, N):
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = _rng("commit", S, kda, kind)
    B, H, H_k = 3, 4, 2
    parent = make_tree(kind, N, rng)
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, kda)
    _, u, gamma, kc = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, parent, device=device)
    depth = tree_depths(parent)
    # per sequence: the deepest node, a random node, nothing accepted
    accepted = [int(np.argmax(depth)), int(rng.integers(N)), -1]
    paths = [root_path(parent, a) for a in accepted]
    L = max(len(p) for p in paths) + 2  # padded with -1
    path = np.full((B, L), -1, dtype=np.int32)
    for b, p in enumerate(paths):
        path[b, :len(p)] = p
    s_new = tree_ops.gated_delta_net_tree_commit(state, kc, u, gamma, path, device=device, n_threads=3)
    assert np.isfinite(s_new).all()
    for b, p in enumerate(paths):
        ref = ref_path(q, k, v, g, beta, state, b, p)[3] if p else state[b]
        assert rel_err(s_new[b], ref) < err["state"], (b, len(p))
    np.testing.assert_array_equal(s_new[2], state[2])  # empty path: unchanged


def _conv_inputs(rng, B, C, N, d):
    sx = rng.standard_normal((B, C, d - 1 + N)).astype(np.float32)
    c = rng.standard_normal((C, d)).astype(np.float32)
    return sx, c


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d_conv", [2, 4])
@pytest.mark.parametrize("kind,N", TREES)
def test_conv_tree_matches_ancestor_windows(device, d_conv, kind, N):
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = _rng("conv", d_conv, kind, N)
    B, C = 2, 256
    parent = make_tree(kind, N, rng)
    sx, c = _conv_inputs(rng, B, C, N, d_conv)
    out = tree_ops.ssm_conv_tree(sx, c, parent, device=device, n_threads=3)
    assert np.isfinite(out).all()
    assert rel_err(out, ref_conv_tree(sx, c, parent)) < err["conv"]


@pytest.mark.parametrize("device", DEVICES)
def test_conv_tree_on_a_chain_equals_ssm_conv(device):
    """Same taps in the same order as ggml_ssm_conv on a chain: equal up to the compiler's
    contraction of the sums (one rounding)."""
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = np.random.default_rng(3)
    B, C, N, d = 3, 384, 37, 4
    sx, c = _conv_inputs(rng, B, C, N, d)
    assert rel_err(tree_ops.ssm_conv_tree(sx, c, make_tree("chain", N, rng), device=device),
                   tree_ops.ssm_conv(sx, c, device=device)) < err["conv"]
    # per-sequence trees: sequence 1 a star, others chains
    parent = np.stack([make_tree("chain", N, rng), make_tree("star", N, rng), make_tree("chain", N, rng)])
    out = tree_ops.ssm_conv_tree(sx, c, parent, device=device)
    assert rel_err(out, ref_conv_tree(sx, c, parent)) < err["conv"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d_conv", [2, 4, 5])
def test_conv_commit_shifts_the_state_along_the_path(device, d_conv):
    _device_or_skip(device)
    rng = np.random.default_rng(5 + d_conv)
    B, C, N = 4, 130, 50
    parent = make_tree("bushy", N, rng)
    sx, _ = _conv_inputs(rng, B, C, N, d_conv)
    depth = tree_depths(parent)
    # a deep node, a root (path of 1), a node at depth 2, nothing accepted
    accepted = [int(np.argmax(depth)), int(np.flatnonzero(parent < 0)[0]),
                int(np.flatnonzero(depth == 2)[0]), -1]
    paths = [root_path(parent, a) for a in accepted]
    path = np.full((B, max(len(p) for p in paths) + 1), -1, dtype=np.int32)
    for b, p in enumerate(paths):
        path[b, :len(p)] = p
    new = tree_ops.ssm_conv_tree_commit(sx, path, d_conv, device=device, n_threads=3)
    assert np.isfinite(new).all()
    for b, p in enumerate(paths):
        cols = list(range(d_conv - 1)) + [d_conv - 1 + j for j in p]  # [conv state, x_path...]
        np.testing.assert_array_equal(new[b], sx[b][:, cols[-(d_conv - 1):]])


@pytest.mark.parametrize("device", DEVICES)
def test_conv_commit_then_plain_conv_equals_tree_conv(device):
    """The next token after a committed path sees the window the tree gave the path's child."""
    _device_or_skip(device)
    err = ERR_F32_BY_DEVICE[device]
    rng = np.random.default_rng(21)
    B, C, N, d = 1, 128, 30, 4
    parent = make_tree("bushy", N, rng, max_depth=6)
    sx, c = _conv_inputs(rng, B, C, N, d)
    tree_out = tree_ops.ssm_conv_tree(sx, c, parent, device=device)
    child = int(np.flatnonzero(tree_depths(parent) >= 3)[0])
    a = int(parent[child])
    state = tree_ops.ssm_conv_tree_commit(sx, np.array([root_path(parent, a)], np.int32), d, device=device)
    nxt = np.concatenate([state, sx[:, :, d - 1 + child:d + child]], axis=2)  # [B, C, d]: state then the child
    np.testing.assert_allclose(tree_ops.ssm_conv(nxt, c, device=device)[:, 0], tree_out[:, child], rtol=0, atol=err["conv"])


def measure_errors(device: str = "cpu") -> dict[str, float]:
    """Largest error of each quantity over the test shapes (for docs/gdn-tree.md): name -> rel_err."""
    worst: dict[str, float] = {}

    def upd(name, x, ref):
        worst[name] = max(worst.get(name, 0.0), rel_err(x, ref))

    for S in (64, 128):
        for kda in (False, True):
            for kind, N in TREES:
                rng = _rng(S, kda, kind, N)
                parent = make_tree(kind, N, rng)
                q, k, v, g, beta, state = make_inputs(rng, 1, N, 4, 2, S, kda)
                o, u, gamma, kc = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, parent, device=device)
                ro, ru, rg = ref_tree(q, k, v, g, beta, state, parent)
                upd("o", o, ro)
                upd("u", u, ru)
                upd("gamma", gamma, rg)
                p = root_path(parent, int(np.argmax(tree_depths(parent))))
                s_new = tree_ops.gated_delta_net_tree_commit(state, kc, u, gamma, np.array([p], np.int32), device=device)
                upd("state", s_new[0], ref_path(q, k, v, g, beta, state, 0, p)[3])
            rng = _rng("chain", S, kda)
            N = 24
            q, k, v, g, beta, state = make_inputs(rng, 2, N, 4, 2, S, kda)
            chain = make_tree("chain", N, rng)
            o_ref, s_ref = tree_ops.gated_delta_net(q, k, v, g, beta, state, device=device)
            o, u, gamma, kc = tree_ops.gated_delta_net_tree(q, k, v, g, beta, state, chain, device=device)
            upd("chain_o", o, o_ref)
            upd("chain_state", tree_ops.gated_delta_net_tree_commit(
                state, kc, u, gamma, np.tile(np.arange(N, dtype=np.int32), (2, 1)), device=device), s_ref)
            upd("gated_delta_net_o", o_ref, ref_tree(q, k, v, g, beta, state, chain)[0])
    for d in (2, 4):
        for kind, N in TREES:
            rng = _rng("conv", d, kind, N)
            parent = make_tree(kind, N, rng)
            sx, c = _conv_inputs(rng, 2, 256, N, d)
            upd("conv", tree_ops.ssm_conv_tree(sx, c, parent, device=device), ref_conv_tree(sx, c, parent))
    return worst


if __name__ == "__main__":  # python tests/test_tree_gdn_ops.py [cpu|gpu]: the measured maxima
    import sys

    for name, value in measure_errors(sys.argv[1] if len(sys.argv) > 1 else "cpu").items():
        print(f"{name:18s} {value:.1e}")
