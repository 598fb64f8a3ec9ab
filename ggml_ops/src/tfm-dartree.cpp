// tfm-local: DARTree on the Weaver's backend (tfm-weaver.h: tfm_weaver_attach_target, tfm_weaver_dartree,
// tfm_weaver_dartree_graphs; tfm_local/decode/tree.py build_dartree is the reference).
// One graph per shape (depth D, candidates K, live branches W, budget B, beta) builds the whole tree:
// the draft's prefix, then D rounds of the Weaver over the live branches (round 0 the root alone), each
// round's children scored (codes rows by get_rows, a product with q, plus the drafter's logits, a
// log-softmax over K, plus the parent's path score), the W best children chosen on the device as the next
// round's branches (their step inputs by get_rows from a table of every token's, their attention masks from
// their parents'), and at the end one top-B over every materialised child by path + beta * depth. The
// supertree's scores never leave the device: the host reads back each round's chosen children and the B
// selected nodes (tfm_weaver_dartree), and renumbers them (tfm_local/decode/weaver.py).
#include "tfm-weaver-impl.h"

#include "gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

using namespace tfm;  // the Weaver's graph pieces (tfm-weaver-impl.h)

struct tfm_dartree_graph {
    ggml_context *        ctx   = nullptr;  // the graph's tensors (allocated by galloc)
    ggml_context *        cctx  = nullptr;  // constants and outputs, in a buffer of their own
    ggml_backend_buffer_t cbuf  = nullptr;
    ggml_gallocr_t        galloc = nullptr;
    ggml_cgraph *         gf    = nullptr;
    ggml_tensor *         ht = nullptr, * hdr = nullptr, * cand = nullptr, * clog = nullptr, * root = nullptr;
    ggml_tensor *         out_i = nullptr, * out_f = nullptr;  // [n_live + B] I32 / F32
    int64_t               n_live = 0, B = 0;

    ~tfm_dartree_graph() {
        if (galloc != nullptr) {
            ggml_gallocr_free(galloc);
        }
        if (cbuf != nullptr) {
            ggml_backend_buffer_free(cbuf);
        }
        if (cctx != nullptr) {
            ggml_free(cctx);
        }
        if (ctx != nullptr) {
            ggml_free(ctx);
        }
    }
};

void tfm_dartree_graph_free::operator()(tfm_dartree_graph * g) const {
    delete g;
}

namespace {

// a GGUF tensor's bytes (rows [r0, r0 + n) of row_bytes each) from an open file; false on a short read
bool read_rows(FILE * f, size_t at, size_t row_bytes, int64_t r0, int64_t n, void * out) {
    return std::fseek(f, (long) (at + (size_t) r0 * row_bytes), SEEK_SET) == 0 &&
           std::fread(out, 1, row_bytes * (size_t) n, f) == row_bytes * (size_t) n;
}

// live branches of each round: 1 (the root), then min(W, K * the previous round's)
std::vector<int64_t> dartree_rows(int32_t D, int32_t K, int32_t Wl) {
    std::vector<int64_t> R(D);
    for (int32_t d = 0; d < D; ++d) {
        R[d] = d == 0 ? 1 : std::min<int64_t>(Wl, (int64_t) K * R[d - 1]);
    }
    return R;
}

// a log-softmax over the rows (ne0) of z [K, R] from ggml ops, stable: z - max - log(sum(exp(z - max))) (a
// log(soft_max(z)) in float32 gives -inf to every candidate of log-probability below about -87, where
// exp underflows; the host's log-softmax, tree.py's reference, keeps them finite)
ggml_tensor * log_softmax_rows(ggml_context * ctx, ggml_tensor * z) {
    const int K = (int) z->ne[0];
    ggml_tensor * zm = ggml_sub(ctx, z, ggml_pool_1d(ctx, z, GGML_OP_POOL_MAX, K, K, 0));   // z - max [K, R]
    return ggml_sub(ctx, zm, ggml_log(ctx, ggml_sum_rows(ctx, ggml_exp(ctx, zm))));
}

// the graph of one DARTree shape, kept: at most TFM_DARTREE_GRAPHS shapes, the least recently used freed
// to make room for a new one
tfm_dartree_graph * dartree_graph(tfm_weaver * W, int32_t D, int32_t K, int32_t Wl, int64_t B, float beta) {
    char key[96];
    std::snprintf(key, sizeof(key), "%d/%d/%d/%lld/%a", D, K, Wl, (long long) B, (double) beta);
    auto it = W->dartree_graphs.find(key);
    if (it != W->dartree_graphs.end()) {
        W->dartree_used[key] = ++W->dartree_clock;
        return it->second.get();
    }
    while (W->dartree_graphs.size() >= TFM_DARTREE_GRAPHS) {
        auto lru = std::min_element(W->dartree_used.begin(), W->dartree_used.end(),
                                    [](const auto & a, const auto & b) { return a.second < b.second; });
        W->dartree_graphs.erase(lru->first);
        W->dartree_used.erase(lru);
    }
    const int32_t Dw = W->depth, P = 1 + Dw, Wd = W->width, H = W->heads, hd = Wd / H;
    const std::vector<int64_t> R = dartree_rows(D, K, Wl);
    int64_t n_total = 0, n_live = 0;
    for (int32_t d = 0; d < D; ++d) {
        n_total += K * R[d];
        n_live += d > 0 ? R[d] : 0;
    }
    std::unique_ptr<tfm_dartree_graph, tfm_dartree_graph_free> g(new tfm_dartree_graph);
    g->n_live = n_live;
    g->B = B;
    // constants: positions, the prefix's mask column, each round's own-row block, the depth bonus; outputs
    ggml_init_params cp = {(size_t) (4 * D + 8) * ggml_tensor_overhead(), nullptr, true};
    if ((g->cctx = ggml_init(cp)) == nullptr) {
        return nullptr;
    }
    ggml_tensor * pos_p = ggml_new_tensor_1d(g->cctx, GGML_TYPE_I32, P);
    ggml_tensor * open0 = ggml_new_tensor_2d(g->cctx, GGML_TYPE_F32, P + 1, 1);  // round 0's mask: all 0
    ggml_tensor * bonus = ggml_new_tensor_1d(g->cctx, GGML_TYPE_F32, n_total);
    // per round: positions, the mask block of its own rows, and for a child's flat index r * K + k its parent
    // row r and candidate k (read by get_rows: a child's step input and mask come from k and r)
    std::vector<ggml_tensor *> pos(D), eye(D), par(D), rnk(D);
    for (int32_t d = 0; d < D; ++d) {
        pos[d] = ggml_new_tensor_1d(g->cctx, GGML_TYPE_I32, R[d]);
        eye[d] = ggml_new_tensor_2d(g->cctx, GGML_TYPE_F32, R[d], R[d]);
        par[d] = ggml_new_tensor_2d(g->cctx, GGML_TYPE_I32, 1, K * R[d]);
        rnk[d] = ggml_new_tensor_2d(g->cctx, GGML_TYPE_I32, 1, K * R[d]);
    }
    g->out_i = ggml_new_tensor_1d(g->cctx, GGML_TYPE_I32, n_live + B);
    g->out_f = ggml_new_tensor_1d(g->cctx, GGML_TYPE_F32, n_live + B);
    if ((g->cbuf = ggml_backend_alloc_ctx_tensors(g->cctx, W->backend)) == nullptr) {
        return nullptr;
    }
    {
        std::vector<int32_t> pp(P);
        for (int32_t i = 0; i < P; ++i) {
            pp[i] = i;  // the target state at 0, the drafter states at 1..depth
        }
        ggml_backend_tensor_set(pos_p, pp.data(), 0, ggml_nbytes(pos_p));
        std::vector<float> zero(P + 1, 0.0f), bon(n_total);
        ggml_backend_tensor_set(open0, zero.data(), 0, ggml_nbytes(open0));
        for (int32_t d = 0, at = 0; d < D; at += K * R[d], ++d) {
            std::fill(bon.begin() + at, bon.begin() + at + K * R[d], beta * (float) (d + 1));
            std::vector<int32_t> pd(R[d], d + 1);
            ggml_backend_tensor_set(pos[d], pd.data(), 0, ggml_nbytes(pos[d]));
            std::vector<float> e((size_t) R[d] * R[d], -1e30f);  // a row sees itself among its round's rows
            for (int64_t i = 0; i < R[d]; ++i) {
                e[(size_t) i * R[d] + i] = 0.0f;
            }
            ggml_backend_tensor_set(eye[d], e.data(), 0, ggml_nbytes(eye[d]));
            std::vector<int32_t> pr(K * R[d]), kr(K * R[d]);
            for (int64_t i = 0; i < K * R[d]; ++i) {
                pr[i] = (int32_t) (i / K);
                kr[i] = (int32_t) (i % K);
            }
            ggml_backend_tensor_set(par[d], pr.data(), 0, ggml_nbytes(par[d]));
            ggml_backend_tensor_set(rnk[d], kr.data(), 0, ggml_nbytes(rnk[d]));
        }
        ggml_backend_tensor_set(bonus, bon.data(), 0, ggml_nbytes(bonus));
    }
    const size_t n_nodes = 256 + (size_t) D * (96 + 64 * (size_t) W->layers);
    ggml_init_params params = {n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
    if ((g->ctx = ggml_init(params)) == nullptr) {
        return nullptr;
    }
    ggml_context * ctx = g->ctx;
    g->ht   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->target_hidden, 1);
    g->hdr  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->drafter_hidden, Dw);
    g->cand = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, K, D);
    g->clog = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, D);
    g->root = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    for (ggml_tensor * t : {g->ht, g->hdr, g->cand, g->clog, g->root}) {
        ggml_set_input(t);
    }
    ggml_cgraph * gf = g->gf = ggml_new_graph_custom(ctx, n_nodes, false);
    // the draft's prefix: keys and values of every layer (tfm_weaver_prefix's rows)
    std::vector<ggml_tensor *> keys, vals;
    weaver_prefix_kv(ctx, W, g->ht, g->hdr, pos_p, keys, vals);
    ggml_tensor * x = ggml_get_rows(ctx, W->table, g->root);                               // [Wd, 1]
    ggml_tensor * mask = open0;                                                           // [Tk, R] 0 or -1e30
    // every round's candidates at once: their codes rows and step inputs
    ggml_tensor * cand_flat = ggml_reshape_1d(ctx, g->cand, (int64_t) K * D);
    ggml_tensor * codes_all = ggml_get_rows(ctx, W->codes, cand_flat);                    // [rank, K * D]
    ggml_tensor * steps_all = ggml_get_rows(ctx, W->table, cand_flat);                    // [Wd, K * D]
    ggml_tensor * s = nullptr, * o = nullptr, * all = nullptr, * next_x = nullptr, * next_parent = nullptr;
    int64_t at = 0;
    for (int32_t d = 0; d < D; ++d) {
        if (d > 0) {  // the branches chosen in the last round: their step inputs and masks by parent
            x = next_x;
            mask = ggml_concat(ctx, ggml_get_rows(ctx, mask, next_parent), eye[d], 0);
        }
        for (int32_t l = 0; l < W->layers; ++l) {
            ggml_tensor * q, * ks, * vs;
            weaver_qkv(ctx, W, l, x, pos[d], q, ks, vs);
            keys[l] = ggml_concat(ctx, keys[l], ks, 2);
            vals[l] = ggml_concat(ctx, vals[l], vs, 1);
            x = weaver_attend_mlp(ctx, W, l, x, q, keys[l], vals[l], mask);
        }
        ggml_tensor * cr = ggml_view_2d(ctx, codes_all, W->rank, K, codes_all->nb[1], (size_t) d * K * codes_all->nb[1]);
        ggml_tensor * lr = ggml_view_2d(ctx, g->clog, K, 1, g->clog->nb[1], (size_t) d * g->clog->nb[1]);
        ggml_tensor * z  = ggml_add(ctx, ggml_mul_mat(ctx, cr, weaver_q_out(ctx, W, x)), lr);
        ggml_tensor * S  = log_softmax_rows(ctx, z);                                      // [K, R] log-probabilities
        if (s != nullptr) {
            S = ggml_add(ctx, S, s);                                                      // + the parent's path score
        }
        ggml_tensor * flat = ggml_reshape_1d(ctx, S, K * R[d]);
        all = all == nullptr ? flat : ggml_concat(ctx, all, flat, 0);
        if (d + 1 < D) {
            const int64_t Rn = R[d + 1];
            o = ggml_top_k(ctx, flat, Rn);                                                // flat index r * K + k
            s = ggml_get_rows(ctx, ggml_reshape_2d(ctx, flat, 1, K * R[d]), o);            // [1, Rn]
            ggml_tensor * e = ggml_view_2d(ctx, steps_all, Wd, K, steps_all->nb[1], (size_t) d * K * steps_all->nb[1]);
            next_parent = ggml_reshape_1d(ctx, ggml_get_rows(ctx, par[d], o), Rn);
            next_x = ggml_get_rows(ctx, e, ggml_reshape_1d(ctx, ggml_get_rows(ctx, rnk[d], o), Rn));
            ggml_build_forward_expand(gf, ggml_cpy(ctx, o, ggml_view_1d(ctx, g->out_i, Rn, (size_t) at * sizeof(int32_t))));
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_1d(ctx, s, Rn), ggml_view_1d(ctx, g->out_f, Rn, (size_t) at * sizeof(float))));
            at += Rn;
        }
    }
    ggml_tensor * sel = ggml_top_k(ctx, ggml_add(ctx, all, bonus), B);                     // global top-B
    ggml_tensor * ssel = ggml_get_rows(ctx, ggml_reshape_2d(ctx, all, 1, n_total), sel);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, sel, ggml_view_1d(ctx, g->out_i, B, (size_t) at * sizeof(int32_t))));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_1d(ctx, ssel, B), ggml_view_1d(ctx, g->out_f, B, (size_t) at * sizeof(float))));
    g->galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(W->backend));
    if (g->galloc == nullptr || !ggml_gallocr_alloc_graph(g->galloc, gf)) {
        return nullptr;
    }
    W->dartree_used[key] = ++W->dartree_clock;
    return (W->dartree_graphs[key] = std::move(g)).get();
}

} // namespace

static int32_t weaver_attach_target(tfm_weaver * W, const char * target_path) {
    if (W == nullptr || target_path == nullptr || W->codes == nullptr) {
        return -1;
    }
    W->free_table();
    // (the codes table is on the backend since tfm_weaver_load) the target's token embeddings, a chunk of rows at a time, into the table of step inputs
    ggml_context * meta = nullptr;
    gguf_init_params gp = {true, &meta};
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> g(gguf_init_from_file(target_path, gp), gguf_free);
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> meta_guard(meta, ggml_free);
    const int64_t id = g ? gguf_find_tensor(g.get(), "token_embd.weight") : -1;
    ggml_tensor * e = id >= 0 ? ggml_get_tensor(meta, "token_embd.weight") : nullptr;
    if (e == nullptr || e->ne[0] != W->target_hidden || e->ne[1] != W->codes->ne[1] ||
        (e->type != GGML_TYPE_F32 && ggml_get_type_traits(e->type)->to_float == nullptr)) {
        return -1;
    }
    const int64_t V = e->ne[1], C = std::min<int64_t>(4096, V), th = W->target_hidden;
    ggml_init_params tp = {ggml_tensor_overhead(), nullptr, true};
    if ((W->table_ctx = ggml_init(tp)) == nullptr) {
        return -2;
    }
    W->table = ggml_new_tensor_2d(W->table_ctx, GGML_TYPE_F32, W->width, V + 1);
    if ((W->table_buf = ggml_backend_alloc_ctx_tensors(W->table_ctx, W->backend)) == nullptr) {
        W->free_table();
        return -2;
    }
    auto ctx_guard = weaver_graph_ctx(16);
    ggml_context * ctx = ctx_guard.get();
    std::unique_ptr<ggml_gallocr, void (*)(ggml_gallocr_t)> galloc(
        ggml_gallocr_new(ggml_backend_get_default_buffer_type(W->backend)), ggml_gallocr_free);
    if (ctx == nullptr || !galloc) {
        W->free_table();
        return -2;
    }
    ggml_tensor * se  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, th, C);
    ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, C);
    ggml_set_input(se);
    ggml_set_input(idx);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 16, false);
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, W->table, weaver_step_in(ctx, W, se), idx));
    if (!ggml_gallocr_alloc_graph(galloc.get(), gf)) {
        W->free_table();
        return -2;
    }
    FILE * f = std::fopen(target_path, "rb");
    if (f == nullptr) {
        W->free_table();
        return -1;
    }
    const size_t row = ggml_row_size(e->type, th), at = gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), id);
    std::vector<uint8_t> raw(row * (size_t) C);
    std::vector<float> x((size_t) th * C);
    std::vector<int64_t> ix(C);
    int32_t r = 0;
    for (int64_t r0 = 0; r0 < V && r == 0; r0 += C) {
        const int64_t n = std::min(C, V - r0);
        if (!read_rows(f, at, row, r0, n, raw.data())) {
            r = -1;
            break;
        }
        if (e->type == GGML_TYPE_F32) {
            std::memcpy(x.data(), raw.data(), row * (size_t) n);
        } else {
            ggml_get_type_traits(e->type)->to_float(raw.data(), x.data(), th * n);
        }
        std::fill(x.begin() + th * n, x.end(), 0.0f);
        for (int64_t i = 0; i < C; ++i) {
            ix[i] = i < n ? r0 + i : V;  // padded rows into the scratch row
        }
        ggml_backend_tensor_set(se, x.data(), 0, ggml_nbytes(se));
        ggml_backend_tensor_set(idx, ix.data(), 0, ggml_nbytes(idx));
        if (ggml_backend_graph_compute(W->backend, gf) != GGML_STATUS_SUCCESS) {
            r = -3;
        }
    }
    std::fclose(f);
    if (r != 0) {
        W->free_table();
        return r;
    }
    W->n_vocab = V;
    return 0;
}

static int32_t weaver_dartree(tfm_weaver * W, const float * h_target, const float * h_drafter, int32_t n_depth,
                              int32_t top_k, const int32_t * cand, const float * cand_logit, int32_t root, int32_t width,
                              int32_t budget, float beta, int32_t * live, float * live_score, int32_t * sel,
                              float * sel_score) {
    if (W == nullptr || W->table == nullptr || h_target == nullptr || h_drafter == nullptr || cand == nullptr ||
        cand_logit == nullptr || live == nullptr || live_score == nullptr || sel == nullptr || sel_score == nullptr ||
        n_depth < 1 || n_depth > W->depth || top_k < 1 || width < 1 || budget < 1 || !(beta <= 0.0f) ||
        root < 0 || root >= W->n_vocab) {
        return -1;
    }
    if (width > TFM_DARTREE_MAX_WIDTH || top_k > TFM_DARTREE_MAX_TOP_K) {
        return -4;  // the graph's masks grow as width^2 a round, its scores as top_k * width
    }
    const std::vector<int64_t> R = dartree_rows(n_depth, top_k, width);
    int64_t n_total = 0;
    for (int64_t r : R) {
        n_total += top_k * r;
    }
    if (n_total > TFM_DARTREE_MAX_NODES) {
        return -4;  // a flat child index must fit int32 (ggml_top_k's indices), with room to spare
    }
    for (int64_t i = 0; i < (int64_t) n_depth * top_k; ++i) {
        if (cand[i] < 0 || cand[i] >= W->n_vocab) {
            return -1;
        }
    }
    tfm_dartree_graph * g = dartree_graph(W, n_depth, top_k, width, std::min<int64_t>(budget, n_total), beta);
    if (g == nullptr) {
        return -2;
    }
    ggml_backend_tensor_set(g->ht, h_target, 0, ggml_nbytes(g->ht));
    ggml_backend_tensor_set(g->hdr, h_drafter, 0, ggml_nbytes(g->hdr));
    ggml_backend_tensor_set(g->cand, cand, 0, ggml_nbytes(g->cand));
    ggml_backend_tensor_set(g->clog, cand_logit, 0, ggml_nbytes(g->clog));
    ggml_backend_tensor_set(g->root, &root, 0, sizeof(int32_t));
    if (ggml_backend_graph_compute(W->backend, g->gf) != GGML_STATUS_SUCCESS) {
        return -3;
    }
    std::vector<int32_t> oi(g->n_live + g->B);
    std::vector<float> of(g->n_live + g->B);
    ggml_backend_tensor_get(g->out_i, oi.data(), 0, ggml_nbytes(g->out_i));
    ggml_backend_tensor_get(g->out_f, of.data(), 0, ggml_nbytes(g->out_f));
    std::copy(oi.begin(), oi.begin() + g->n_live, live);
    std::copy(of.begin(), of.begin() + g->n_live, live_score);
    std::copy(oi.begin() + g->n_live, oi.end(), sel);
    std::copy(of.begin() + g->n_live, of.end(), sel_score);
    return (int32_t) g->B;
}

// the C API's two: no C++ exception (std::bad_alloc of a graph's host-side constants) crosses into C
int32_t tfm_weaver_attach_target(tfm_weaver * W, const char * target_path) {
    try {
        return weaver_attach_target(W, target_path);
    } catch (const std::exception &) {
        if (W != nullptr) {
            W->free_table();
        }
        return -2;
    }
}

int32_t tfm_weaver_dartree(tfm_weaver * W, const float * h_target, const float * h_drafter, int32_t n_depth,
                           int32_t top_k, const int32_t * cand, const float * cand_logit, int32_t root, int32_t width,
                           int32_t budget, float beta, int32_t * live, float * live_score, int32_t * sel,
                           float * sel_score) {
    try {
        return weaver_dartree(W, h_target, h_drafter, n_depth, top_k, cand, cand_logit, root, width, budget, beta,
                              live, live_score, sel, sel_score);
    } catch (const std::exception &) {
        return -2;
    }
}

int32_t tfm_weaver_dartree_graphs(const tfm_weaver * W) {
    return W == nullptr ? -1 : (int32_t) W->dartree_graphs.size();
}
