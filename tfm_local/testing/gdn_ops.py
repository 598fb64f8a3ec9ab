"""The Gated DeltaNet tree ops of patch 0005, run one at a time on numpy arrays (tests, checks).

Thin wrappers over ``op_harness.run_op``: each builds the ggml op on the CPU backend (or the first
GPU with ``device="gpu"``), runs it on the given arrays and unpacks the result. Shapes are numpy
order (ggml's ``ne`` reversed); all float arrays are float32, index arrays int32:

- q, k: ``(B_k, N, H_k, S)``; v: ``(B, N, H, S)``; g: ``(B, N, H, G)`` with G = 1 (scalar gate)
  or S (per key dimension); beta: ``(B, N, H)``; v head h reads q/k head ``h % H_k`` and
  sequence ``b // (B // B_k)``, as ``ggml_gated_delta_net``.
- state: ``(B, H, S, S)`` in ggml's transposed layout, ``state[b, h, c, r] = S[r][c]`` (r: key
  index, c: value index); the recurrence is S <- diag(e^g) S; u = beta (v - S^T k);
  S += k u^T; o = S^T q / sqrt(S).
- parent: ``(N,)`` (shared by all sequences) or ``(B, N)``; ``parent[i] < i``, -1 for a root.
- path: ``(B, L)``: accepted node indices, root first, padded with -1.
- conv input sx: ``(B, C, d_conv - 1 + N)``: the conv state then the N node inputs per channel;
  conv weights c: ``(C, d_conv)``.
See docs/gdn-tree.md for the semantics.
"""
from __future__ import annotations

import numpy as np

from . import op_harness


# float32 error bounds relative to max(1, max |ref|) (``rel_err``), per device, of tests/test_tree_gdn_ops.py
# and of the benchmark's correctness checks. CPU: about 10x the largest error measured over the tests
# (docs/gdn-tree.md). GPU: provisional until the first GPU run (its kernels use fast-math expf and another
# summation order). o, u, gamma, state: against a float64 reference; chain_vs_gdn: the tree op against
# ggml_gated_delta_net on the same path; conv: the tree conv against float64 and against ggml_ssm_conv.
ERR_F32_BY_DEVICE = {
    "cpu": {"o": 5e-7, "u": 3e-6, "gamma": 2e-6, "state": 3e-6, "chain_vs_gdn": 3e-6, "conv": 1e-6},
    "gpu": {"o": 1e-5, "u": 1e-5, "gamma": 1e-5, "state": 1e-5, "chain_vs_gdn": 1e-5, "conv": 1e-6},
}


def rel_err(x, ref) -> float:
    """max |x - ref| / max(1, max |ref|), computed in float64 (arrays of one shape)."""
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(x, dtype=np.float64) - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def available_devices() -> list[str]:
    """The devices (``"cpu"``, ``"gpu"``) on which this build runs the tree ops; empty without the
    patched library."""
    try:
        op_harness.lib()
    except op_harness.NativeError:
        return []
    devices = ["cpu"]
    try:
        ssm_conv_tree_commit(np.zeros((1, 1, 2), np.float32), np.zeros((1, 1), np.int32), 2, device="gpu")
        devices.append("gpu")
    except op_harness.OpUnavailable:
        pass
    return devices


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _parent2d(parent, n_seqs: int) -> np.ndarray:
    p = np.ascontiguousarray(parent, dtype=np.int32)
    return p.reshape(1, -1) if p.ndim == 1 else p.reshape(n_seqs, -1)


def gated_delta_net(q, k, v, g, beta, state, device: str = "cpu", n_threads: int = 2):
    """The existing ``ggml_gated_delta_net`` (K = 1) over N tokens per sequence.

    Returns ``(o, state_out)``: o float32 ``(B, N, H, S)``, the final state ``(B, H, S, S)``.
    """
    v = _f32(v)
    B, N, H, S = v.shape
    out = op_harness.run_op("gdn", [_f32(q), _f32(k), v, _f32(g), _f32(beta)[..., None], _f32(state)],
                        S * H * N * B + S * S * H * B, device=device, n_threads=n_threads)
    n_o = S * H * N * B
    return out[:n_o].reshape(B, N, H, S), out[n_o:].reshape(B, H, S, S)


def gated_delta_net_tree(q, k, v, g, beta, state, parent, device: str = "cpu", n_threads: int = 2):
    """``ggml_gated_delta_net_tree``: every node's output as if its root-to-node path ran alone.

    Returns ``(o, u, gamma, k_copy)``: o and u float32 ``(B, N, H, S)`` (u_i = beta_i (v_i - S'^T k_i),
    the rank-1 update of node i), gamma ``(B, N, H, G)`` (cumulative log-decay from the state
    to node i), k_copy ``(B_k, N, H_k, S)``; the last three are what the commit needs.
    """
    q, k, v, g = _f32(q), _f32(k), _f32(v), _f32(g)
    B, N, H, S = v.shape
    G = g.shape[-1]
    sizes = [S * H * N * B, S * H * N * B, G * H * N * B, k.size]
    out = op_harness.run_op("gdn_tree", [q, k, v, g, _f32(beta)[..., None], _f32(state), _parent2d(parent, B)],
                        sum(sizes), device=device, n_threads=n_threads)
    o, u, gamma, kc = np.split(out, np.cumsum(sizes)[:-1])
    return o.reshape(B, N, H, S), u.reshape(B, N, H, S), gamma.reshape(B, N, H, G), kc.reshape(k.shape)


def gated_delta_net_tree_commit(state, k, u, gamma, path, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """``ggml_gated_delta_net_tree_commit``: the state after the accepted path; float32 ``(B, H, S, S)``.

    ``k``, ``u``, ``gamma`` as returned by ``gated_delta_net_tree``; ``path`` int ``(B, L)``.
    """
    state = _f32(state)
    path = np.ascontiguousarray(path, dtype=np.int32).reshape(state.shape[0], -1)
    out = op_harness.run_op("gdn_commit", [state, _f32(k), _f32(u), _f32(gamma), path], state.size,
                        device=device, n_threads=n_threads)
    return out.reshape(state.shape)


def ssm_conv(sx, c, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """The existing ``ggml_ssm_conv`` over a chain: float32 ``(B, N, C)``."""
    sx, c = _f32(sx), _f32(c)
    B, C, T = sx.shape
    N = T - c.shape[1] + 1
    return op_harness.run_op("conv", [sx, c], C * N * B, device=device, n_threads=n_threads).reshape(B, N, C)


def ssm_conv_tree(sx, c, parent, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """``ggml_ssm_conv_tree``: each node convolved over itself and its d_conv-1 nearest ancestors
    (then the conv state above the root); float32 ``(B, N, C)``."""
    sx, c = _f32(sx), _f32(c)
    B, C, T = sx.shape
    N = T - c.shape[1] + 1
    return op_harness.run_op("conv_tree", [sx, c, _parent2d(parent, B)], C * N * B,
                         device=device, n_threads=n_threads).reshape(B, N, C)


def ssm_conv_tree_commit(sx, path, d_conv: int, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """``ggml_ssm_conv_tree_commit``: the conv state after the accepted path; float32 ``(B, C, d_conv - 1)``."""
    sx = _f32(sx)
    B, C, _ = sx.shape
    path = np.ascontiguousarray(path, dtype=np.int32).reshape(B, -1)
    return op_harness.run_op("conv_commit", [sx, path], (d_conv - 1) * C * B, iparam=d_conv,
                         device=device, n_threads=n_threads).reshape(B, C, d_conv - 1)
