"""float32 numpy emulation of the scalar-gate CUDA kernels of ggml_gated_delta_net_tree (patch 0005,
ggml-cuda/gated_delta_net_tree.cu: pairs, state, solve), on flat buffers with the kernels' own index
formulas and thread/lane mapping (lanes vectorised), against the float64 per-path reference of
tests/test_tree_gdn_ops.py. Both solve kernels run on the same pairs/state results: the first one
(solve 1, gated_delta_net_tree_solve_f32) and the level-ordered one, the shipped default of patch 0008 (solve 2,
gated_delta_net_tree_solve_levels_f32; the switch between them: ggml_ops/dev/). Run:
PYTHONPATH=. .venv/bin/python lab/gdn_tree_cuda_emulation.py
(needs the tfm-local build only because the test module imports tree_ops; about 5 s)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_tree_gdn_ops import make_tree, make_inputs, ref_tree
f32 = np.float32
WS = 32

def run(q, k, v, g, beta, state, parents, solves=(1, 2), order_rng=None):
    """Kernels 1-2 once, then each solve kernel of ``solves`` on its own copy of their results;
    returns {solve: (o, u, gamma, k copy)}. ``order_rng`` shuffles the nodes within a level for
    solve 2 (the kernel's atomics leave that order free)."""
    B, N, H, S = v.shape
    B_k, _, H_k, _ = k.shape
    rk3 = B // B_k
    qf, kf, vf, gf, bf, stf = (np.ascontiguousarray(x, f32).ravel() for x in (q, k, v, g, beta, state))
    pf = np.ascontiguousarray(parents, np.int32).ravel()
    ps1 = 0 if parents.ndim == 1 else N
    sq1, sq2, sq3 = S, S*H_k, S*H_k*N
    sv1, sv2, sv3 = S, S*H, S*H*N
    sg1, sg2, sg3 = 1, H, H*N
    sb1, sb2, sb3 = 1, H, H*N
    ss2, ss3 = S*S, S*S*H
    G = 1
    dst = np.full(2*S*H*N*B + G*H*N*B + S*H_k*N*B_k, np.nan, f32)
    o_off, u_off = 0, S*H*N*B
    y_off = 2*S*H*N*B
    k_off = y_off + G*H*N*B
    coef = np.full((B*H*N*N, 2), np.nan, f32)
    anc = np.full(B*H*N*N if False else B*N*N, -7, np.int32)
    scale = f32(1.0/np.sqrt(np.float32(S)))
    lanes = np.arange(WS)
    RPL = S // WS
    # ---- kernel 1: pairs, grid (N, H, B), 4 warps
    for s in range(B):
        for h in range(H):
            for i in range(N):
                hk, sk = h % H_k, s // rk3
                par_s = [pf[s*ps1 + t] for t in range(i + 1)]
                g_s = [gf[s*sg3 + t*sg2 + h*sg1] for t in range(i + 1)]
                acc = f32(g_s[i]); m = 1; cur = i; j = par_s[i]
                lst, dec = [i], [f32(1)]
                while 0 <= j < cur:
                    lst.append(j); dec.append(f32(np.exp(acc))); acc = f32(acc + g_s[j]); m += 1
                    cur = j; j = par_s[cur]
                ln = m
                dst[y_off + (s*N + i)*H + h] = acc
                kh, qh = sk*sq3 + hk*sq1, sk*sq3 + hk*sq1
                k_i = [kf[kh + i*sq2 + rr*WS + lanes] for rr in range(RPL)]
                q_i = [qf[qh + i*sq2 + rr*WS + lanes] for rr in range(RPL)]
                crow = ((s*H + h)*N + i)*N; arow = (s*N + i)*N
                for m in range(ln):
                    j = lst[m]
                    pk = np.zeros(WS, f32); pq = np.zeros(WS, f32)
                    for rr in range(RPL):
                        kj = kf[kh + j*sq2 + rr*WS + lanes]
                        pk += kj*k_i[rr]; pq += kj*q_i[rr]
                    pk, pq = f32(pk.sum()), f32(pq.sum())
                    d = dec[m]
                    coef[crow + m] = (f32(0) if m == 0 else d*pk, d*pq)
                    if h == 0:
                        anc[arow + m] = j
                if h < H_k and s % rk3 == 0:
                    r = np.arange(S)
                    dst[k_off + ((sk*N + i)*H_k + hk)*S + r] = kf[kh + i*sq2 + r]
    # ---- kernel 2: state, grid (H*B, ceil(2N/64), ceil(S/64)), 256 threads
    BM = BN = 64; BK = 32
    for bx in range(H*B):
        h, s = bx % H, bx // H
        hk, sk = h % H_k, s // rk3
        kh = qh = sk*sq3 + hk*sq1
        M0 = s*ss3 + h*ss2
        for by in range((2*N + 63)//64):
            for bz in range((S + 63)//64):
                row0, col0 = by*BM, bz*BN
                acc = np.zeros((BM, BN), f32)
                for r0 in range(0, S, BK):
                    xs = np.full((BK, 68), np.nan, f32); ms = np.full((BK, 68), np.nan, f32)
                    for tid in range(256):
                        for t in range(BM*BK//256):
                            e = tid + 256*t
                            rr = (e & 7) | ((e >> 9) << 3); rl = (e >> 3) & 63; rho = row0 + rl
                            x = 0.0
                            if rho < N: x = kf[kh + rho*sq2 + r0 + rr]
                            elif rho < 2*N: x = qf[qh + (rho - N)*sq2 + r0 + rr]
                            xs[rr, rl] = x
                            c = col0 + rl
                            ms[rr, rl] = stf[M0 + c*S + r0 + rr] if c < S else 0.0
                    acc += xs[:, :64].T @ ms[:, :64]
                for tid in range(256):
                    tx, ty = tid % 16, tid // 16
                    for ea in range(4):
                        rho = row0 + 4*ty + ea
                        if rho >= 2*N: continue
                        base = u_off + ((s*N + rho)*H + h)*S if rho < N else o_off + ((s*N + (rho - N))*H + h)*S
                        for eb in range(4):
                            c = col0 + 4*tx + eb
                            if c < S: dst[base + c] = acc[4*ty + ea, 4*tx + eb]
    pre = dst.copy()
    out = {}
    for solve in solves:
        dst = pre.copy()
        if solve == 1:
            solve_owned(dst, coef, anc, vf, bf, pf, B, N, H, S, ps1, sv1, sv2, sv3, sb1, sb2, sb3,
                        o_off, u_off, y_off, scale)
        else:
            solve_levels(dst, coef, anc, vf, bf, pf, B, N, H, S, ps1, sv1, sv2, sv3, sb1, sb2, sb3,
                         o_off, u_off, y_off, scale, order_rng)
        o = dst[o_off:u_off].reshape(B, N, H, S); u = dst[u_off:y_off].reshape(B, N, H, S)
        y = dst[y_off:k_off].reshape(B, N, H, 1); kc = dst[k_off:].reshape(B_k, N, H_k, S)
        out[solve] = (o, u, y, kc)
    return out

def solve_owned(dst, coef, anc, vf, bf, pf, B, N, H, S, ps1, sv1, sv2, sv3, sb1, sb2, sb3, o_off, u_off, y_off, scale):
    lanes = np.arange(WS)
    # ---- kernel 3: solve, grid (H, B, S/32), 8 warps
    n_warps, MAX_N = 8, 128
    TPW = MAX_N // n_warps
    assert N <= MAX_N
    for h in range(H):
        for s in range(B):
            for bz in range(S // WS):
                c = bz*WS + lanes
                par_s = np.array([pf[s*ps1 + t] for t in range(N)])
                beta_s = np.array([bf[s*sb3 + t*sb2 + h*sb1] for t in range(N)], f32)
                eg_s = np.exp(np.array([dst[y_off + (s*N + t)*H + h] for t in range(N)], f32)).astype(f32)
                dep_s = np.zeros(N, int)
                for t in range(N):
                    d = 0; cur = t; j = par_s[t]
                    while 0 <= j < cur:
                        d += 1; cur = j; j = par_s[cur]
                    dep_s[t] = d
                maxd = dep_s.max()
                u_s = np.zeros((MAX_N, WS), f32); w_s = np.zeros((MAX_N, WS), f32)
                cf = {}; jm = {}
                for warp in range(n_warps):
                    for t in range(TPW):
                        i = warp + n_warps*t
                        cf[warp, t] = np.zeros((WS, 2), f32); jm[warp, t] = np.zeros(WS, int)
                        if i < N:
                            oi = ((s*N + i)*H + h)*S + c
                            u_s[i] = vf[s*sv3 + i*sv2 + h*sv1 + c] - eg_s[i]*dst[u_off + oi]
                            w_s[i] = eg_s[i]*dst[o_off + oi]
                            ok = lanes <= dep_s[i]
                            cf[warp, t][ok] = coef[((s*H + h)*N + i)*N + lanes[ok]]
                            jm[warp, t][ok] = anc[(s*N + i)*N + lanes[ok]]
                for d in range(maxd + 1):
                    for warp in range(n_warps):
                        for t in range(TPW):
                            i = warp + n_warps*t
                            if i < N and dep_s[i] == d:
                                ln = d + 1; nm = min(WS, ln); acc = np.zeros(WS, f32)
                                for tt in range(1, nm):
                                    acc += cf[warp, t][tt, 0]*u_s[jm[warp, t][tt]]
                                crow = ((s*H + h)*N + i)*N; arow = (s*N + i)*N
                                for m0 in range(WS, ln, WS):
                                    nn = min(WS, ln - m0)
                                    for tt in range(nn):
                                        acc += coef[crow + m0 + tt, 0]*u_s[anc[arow + m0 + tt]]
                                u_s[i] = beta_s[i]*(u_s[i] - acc)
                for warp in range(n_warps):
                    for t in range(TPW):
                        i = warp + n_warps*t
                        if i < N:
                            ln = dep_s[i] + 1; nm = min(WS, ln); acc = w_s[i].copy()
                            for tt in range(nm):
                                acc += cf[warp, t][tt, 1]*u_s[jm[warp, t][tt]]
                            crow = ((s*H + h)*N + i)*N; arow = (s*N + i)*N
                            for m0 in range(WS, ln, WS):
                                for tt in range(min(WS, ln - m0)):
                                    acc += coef[crow + m0 + tt, 1]*u_s[anc[arow + m0 + tt]]
                            oi = ((s*N + i)*H + h)*S + c
                            dst[o_off + oi] = acc*scale
                            dst[u_off + oi] = u_s[i]

def solve_levels(dst, coef, anc, vf, bf, pf, B, N, H, S, ps1, sv1, sv2, sv3, sb1, sb2, sb3, o_off, u_off, y_off,
                 scale, order_rng=None):
    """Kernel 3, level-ordered (patch 0008): grid (H, B, S/32), NW warps, lane = value column, dynamic
    shared memory of N rows (a row index outside [0, N) fails here)."""
    lanes = np.arange(WS)
    MAX_N, NW = 128, 8
    assert N <= MAX_N
    RB = WS*4  # an_s holds ancestors as byte offsets j*C*4 into u_s
    for h in range(H):
        for s in range(B):
            for bz in range(S // WS):
                c = bz*WS + lanes
                # prologue, phase 1: u_s, w_s (all warps); depth walk and beta (thread t < N)
                u_s = np.full((N, WS), np.nan, f32); w_s = np.full((N, WS), np.nan, f32)
                for i in range(N):  # warp i % NW
                    oi = ((s*N + i)*H + h)*S + c
                    e = f32(np.exp(dst[y_off + (s*N + i)*H + h]))
                    u_s[i] = vf[s*sv3 + i*sv2 + h*sv1 + c] - e*dst[u_off + oi]
                    w_s[i] = e*dst[o_off + oi]
                dep_s = np.zeros(N, int); beta_s = np.zeros(N, f32)
                for t in range(N):
                    d = 0; cur = t; j = pf[s*ps1 + t]
                    while 0 <= j < cur:
                        d += 1; cur = j; j = pf[s*ps1 + cur]
                    dep_s[t] = d; beta_s[t] = bf[s*sb3 + t*sb2 + h*sb1]
                # phase 2, warp 0: counting sort by depth; the ranks come from shared atomics (any order)
                lvs = np.zeros(MAX_N + 1, int); rk = np.zeros(N, int)
                for t in (order_rng.permutation(N) if order_rng is not None else range(N)):
                    rk[t] = lvs[dep_s[t]]; lvs[dep_s[t]] += 1
                cn = lvs[:MAX_N].reshape(WS, 4).copy()        # lane l: depths 4l .. 4l+3 (registers)
                tot = cn.sum(axis=1); inc = np.cumsum(tot)    # the warp's inclusive scan
                run_ = inc - tot
                for r in range(4):
                    lvs[4*lanes + r] = run_; run_ = run_ + cn[:, r]
                lvs[MAX_N] = run_[WS - 1]
                assert lvs[MAX_N] == N
                lvl_s = np.full(N, -1, int)
                for t in range(N):
                    lvl_s[lvs[dep_s[t]] + rk[t]] = t
                assert (np.sort(lvl_s) == np.arange(N)).all()
                # phase 2, all warps: the first 32 list entries, entry 0's q coefficient apart, padding
                cf_s = np.full((N, WS, 2), np.nan, f32); an_s = np.full((N, WS), -1, int); cq0_s = np.zeros(N, f32)
                for i in range(N):
                    ln = dep_s[i] + 1
                    cm = np.zeros((WS, 2), f32); jm = np.full(WS, i)
                    ok = lanes < ln
                    cm[ok] = coef[((s*H + h)*N + i)*N + lanes[ok]]
                    jm[ok] = anc[(s*N + i)*N + lanes[ok]]
                    cq0_s[i] = cm[0, 1]; cm[0] = 0
                    cf_s[i] = cm; an_s[i] = jm*RB
                # levels: a level's nodes read a snapshot (what the previous levels wrote)
                d = 0
                while True:
                    beg, end = lvs[d], lvs[d + 1]
                    ln = d + 1; nm = min(WS, ln)
                    snap = u_s.copy()
                    for p in range(beg, end):  # warp (p - beg) % NW
                        i = lvl_s[p]
                        assert dep_s[i] == d
                        ak = np.zeros((4, WS), f32); aq = np.zeros((4, WS), f32)
                        for m in range(0, nm, 4):
                            for r in range(4):
                                off = an_s[i, m + r]
                                assert off % RB == 0 and 0 <= off // RB < N
                                uj = snap[off // RB]
                                ak[r] += cf_s[i, m + r, 0]*uj; aq[r] += cf_s[i, m + r, 1]*uj
                        if ln > WS:
                            crow = ((s*H + h)*N + i)*N; arow = (s*N + i)*N
                            for m0 in range(WS, ln, WS):
                                mm = m0 + lanes
                                cm = np.zeros((WS, 2), f32); jm = np.full(WS, i)
                                ok = mm < ln
                                cm[ok] = coef[crow + mm[ok]]; jm[ok] = anc[arow + mm[ok]]
                                for tt in range(0, min(WS, ln - m0), 4):
                                    for r in range(4):
                                        jt = jm[tt + r]
                                        assert 0 <= jt < N
                                        ak[r] += cm[tt + r, 0]*snap[jt]; aq[r] += cm[tt + r, 1]*snap[jt]
                        sk = (ak[0] + ak[1]) + (ak[2] + ak[3]); sq = (aq[0] + aq[1]) + (aq[2] + aq[3])
                        ui = beta_s[i]*(snap[i] - sk)
                        oo = (w_s[i] + cq0_s[i]*ui + sq)*scale
                        u_s[i] = ui
                        oi = ((s*N + i)*H + h)*S + c
                        dst[u_off + oi] = ui; dst[o_off + oi] = oo
                    if end >= N:
                        break
                    d += 1

def rel(a, b): return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))

cases = [("ddtree", 64, 1, 1, 4, 2, 128, False), ("chain", 40, 1, 1, 4, 2, 32, False),
         ("bushy", 50, 2, 1, 6, 2, 64, True), ("forest", 5, 3, 3, 2, 1, 32, True), ("chain", 1, 1, 1, 2, 1, 64, False),
         ("deep", 128, 1, 1, 2, 1, 32, False), ("chain70", 100, 1, 1, 4, 2, 128, False),
         # the level-ordered solve: N = 128 stars, chains (depth 127: four 32-entry blocks), bushy trees of
         # several sequences, a DDTree-like tree at the Qwen3.6-27B head ratio, deep + chain per sequence
         ("star", 128, 1, 1, 2, 1, 32, False), ("chain", 128, 1, 1, 2, 1, 32, False),
         ("bushy", 128, 3, 1, 3, 1, 32, True), ("ddtree", 128, 2, 2, 3, 1, 128, True),
         ("deepchain", 60, 2, 1, 4, 2, 64, True), ("chain", 33, 1, 1, 2, 2, 32, False),
         ("star", 1, 2, 2, 2, 1, 32, True)]
worst = {1: [0, 0, 0], 2: [0, 0, 0]}
diff12 = [0, 0]
for kind, N, B, Bk, H, H_k, S, per_seq in cases:
    rng = np.random.default_rng(N * 1000 + S + B)
    if kind == "chain70":  # paths up to ~90 deep: the list entries past 32
        parents = np.arange(-1, N - 1, dtype=np.int32)
        for i in range(70, N):
            parents[i] = int(rng.integers(-1, i))
    elif kind == "deepchain":  # paths of 20-40 nodes and a 60-node chain (as the GPU test's last case)
        parents = np.stack([make_tree("deep", N, rng, max_depth=40), make_tree("chain", N, rng)])
    else:
        parents = np.stack([make_tree(kind, N, rng) for _ in range(B)]) if per_seq else make_tree(kind, N, rng)
    q, k, v, g, beta, state = make_inputs(rng, B, N, H, H_k, S, False, B_k=Bk)
    if kind in ("chain70", "deepchain") or (kind == "chain" and N > 32):
        g *= 0.2  # decays e^g in ~(0.87, 1): the deep ancestors still matter
    res = run(q, k, v, g, beta, state, parents, order_rng=np.random.default_rng(N))
    ro, ru, rg = ref_tree(q, k, v, g, beta, state, parents)
    for solve, (o, u, y, kc) in res.items():
        assert np.isfinite(o).all() and np.isfinite(u).all() and np.isfinite(y).all() and np.isfinite(kc).all(), "unwritten"
        np.testing.assert_array_equal(kc, k)
        e = (rel(o, ro), rel(u, ru), rel(y, rg))
        worst[solve] = [max(a, b) for a, b in zip(worst[solve], e)]
        print(f"{kind:9s} N={N:3d} B={B} B_k={Bk} H={H} H_k={H_k} S={S:3d} per-seq={per_seq} solve {solve}:"
              f"  o {e[0]:.2e}  u {e[1]:.2e}  gamma {e[2]:.2e}", flush=True)
    d = (rel(res[2][0], res[1][0]), rel(res[2][1], res[1][1]))
    diff12 = [max(a, b) for a, b in zip(diff12, d)]
for solve in (1, 2):
    print("solve %d worst: o %.2e u %.2e gamma %.2e" % (solve, *worst[solve]))
print("solve 2 vs solve 1: o %.2e u %.2e" % tuple(diff12))
