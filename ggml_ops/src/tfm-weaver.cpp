// tfm-local: the Weaver's runtime (tfm-weaver.h): tfm_weaver_api_version, its own GGUF loader and
// allocator (tfm_weaver_load, every tensor on the CPU or the first GPU), q for batches of paths over a
// kept prefix (tfm_weaver_prefix, tfm_weaver_steps, tfm_weaver_q) and the node store that computes one
// draft's tree node by node (tfm_weaver_nodes_begin, tfm_weaver_nodes_add). Its layers' graph pieces are
// in tfm-weaver-graph.cpp, DARTree in tfm-dartree.cpp.
#include "tfm-weaver-impl.h"

#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

using namespace tfm;  // the Weaver's graph pieces (tfm-weaver-impl.h)

int32_t tfm_weaver_api_version(void) {
    return TFM_WEAVER_API_VERSION;
}

namespace {

bool weaver_read_u32(const gguf_context * g, const char * key, int32_t & out) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_UINT32) {
        return false;
    }
    out = (int32_t) gguf_get_val_u32(g, id);
    return out > 0;
}

bool weaver_read_f32(const gguf_context * g, const char * key, float & out) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_FLOAT32) {
        return false;
    }
    out = gguf_get_val_f32(g, id);
    return true;
}

} // namespace

tfm_weaver * tfm_weaver_load(const char * path, int32_t device, int32_t n_threads) {
    if (path == nullptr || device < 0 || device > 1) {
        return nullptr;
    }
    auto W = std::make_unique<tfm_weaver>();
    gguf_init_params gp = { /*.no_alloc =*/ true, /*.ctx =*/ &W->ctx_w };
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        return nullptr;
    }
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> g_guard(g, gguf_free);
    const int64_t arch = gguf_find_key(g, "general.architecture");
    if (arch < 0 || gguf_get_kv_type(g, arch) != GGUF_TYPE_STRING || std::strcmp(gguf_get_val_str(g, arch), "tfm-weaver") != 0) {
        return nullptr;
    }
    const bool ok = weaver_read_u32(g, "tfm-weaver.target_hidden", W->target_hidden) &&
                    weaver_read_u32(g, "tfm-weaver.drafter_hidden", W->drafter_hidden) &&
                    weaver_read_u32(g, "tfm-weaver.depth", W->depth) && weaver_read_u32(g, "tfm-weaver.top_k", W->top_k) &&
                    weaver_read_u32(g, "tfm-weaver.width", W->width) && weaver_read_u32(g, "tfm-weaver.layers", W->layers) &&
                    weaver_read_u32(g, "tfm-weaver.heads", W->heads) && weaver_read_u32(g, "tfm-weaver.ffn", W->ffn) &&
                    weaver_read_u32(g, "tfm-weaver.rank", W->rank) &&
                    weaver_read_f32(g, "tfm-weaver.rope_theta", W->rope_theta) && weaver_read_f32(g, "tfm-weaver.eps", W->eps);
    if (!ok || W->width % W->heads != 0 || (W->width / W->heads) % 2 != 0) {
        return nullptr;
    }
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(device == 0 ? GGML_BACKEND_DEVICE_TYPE_CPU : GGML_BACKEND_DEVICE_TYPE_GPU);
    if (dev == nullptr || (W->backend = ggml_backend_dev_init(dev, nullptr)) == nullptr) {
        return nullptr;
    }
    if (device == 0) {
        auto * set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
        if (set_threads != nullptr) {
            set_threads(W->backend, std::max(1, n_threads));
        }
    }
    // every tensor on the backend; the codes table is kept apart (DARTree's, tfm_weaver_attach_target), read
    // here with the rest so that the Weaver's file is not opened again
    for (ggml_tensor * t = ggml_get_first_tensor(W->ctx_w); t != nullptr; t = ggml_get_next_tensor(W->ctx_w, t)) {
        W->w[ggml_get_name(t)] = t;
    }
    W->codes = W->get("codes");
    if (W->codes != nullptr) {
        W->w.erase("codes");
    }
    W->buf_w = ggml_backend_alloc_ctx_tensors(W->ctx_w, W->backend);
    if (W->buf_w == nullptr) {
        return nullptr;
    }
    FILE * f = std::fopen(path, "rb");
    if (f == nullptr) {
        return nullptr;
    }
    std::vector<uint8_t> data;
    bool read_ok = true;
    for (int64_t i = 0; i < gguf_get_n_tensors(g) && read_ok; ++i) {
        const char * name = gguf_get_tensor_name(g, i);
        ggml_tensor * t = std::strcmp(name, "codes") == 0 ? W->codes : W->get(name);
        if (t == nullptr) {
            continue;
        }
        const size_t n = ggml_nbytes(t);
        data.resize(n);
        read_ok = std::fseek(f, (long) (gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i)), SEEK_SET) == 0 &&
                  std::fread(data.data(), 1, n, f) == n;
        if (read_ok) {
            ggml_backend_tensor_set(t, data.data(), 0, n);
        }
    }
    std::fclose(f);
    if (!read_ok) {
        return nullptr;
    }
    const char * needed[] = {"target_norm.weight", "target_proj.weight", "drafter_norm.weight", "drafter_proj.weight",
                             "step_norm.weight", "step_proj.weight", "norm.weight", "out.weight"};
    for (const char * n : needed) {
        if (W->get(n) == nullptr) {
            return nullptr;
        }
    }
    for (int32_t l = 0; l < W->layers; ++l) {
        for (const char * n : {"attn_norm", "prefix_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"}) {
            if (W->get("blk." + std::to_string(l) + "." + n + ".weight") == nullptr) {
                return nullptr;
            }
        }
    }
    W->galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(W->backend));
    return W->galloc == nullptr ? nullptr : W.release();
}

void tfm_weaver_free(tfm_weaver * W) {
    delete W;
}

int32_t tfm_weaver_shape(const tfm_weaver * W, int32_t * out) {
    if (W == nullptr || out == nullptr) {
        return -1;
    }
    const int32_t v[9] = {W->target_hidden, W->drafter_hidden, W->depth, W->top_k, W->width, W->layers, W->heads,
                          W->ffn, W->rank};
    std::memcpy(out, v, sizeof(v));
    return 9;
}

int32_t tfm_weaver_prefix(tfm_weaver * W, int32_t n_drafts, const float * h_target, const float * h_drafter) {
    if (W == nullptr || n_drafts < 1 || h_target == nullptr || h_drafter == nullptr) {
        return -1;
    }
    const int32_t D = W->depth, Wd = W->width, H = W->heads, hd = Wd / H, P = n_drafts * (1 + D);
    W->prefix_ok = false;  // until this prefix is computed
    if (n_drafts != W->n_drafts) {  // the kept keys and values: [hd, H, P] and [Wd, P] a layer
        W->free_prefix();
        if (!W->pkv.alloc(W->backend, W->layers, {hd, H, P}, {Wd, P})) {
            return -2;
        }
        W->n_drafts = n_drafts;
    }
    const size_t n_nodes = 32 + 16 * (size_t) W->layers;
    auto ctx_guard = weaver_graph_ctx(n_nodes);
    ggml_context * ctx = ctx_guard.get();
    if (ctx == nullptr) {
        return -2;
    }
    ggml_tensor * ht    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->target_hidden, n_drafts);
    ggml_tensor * hdr   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->drafter_hidden, (int64_t) n_drafts * D);
    ggml_tensor * pos_p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, P);
    for (ggml_tensor * t : {ht, hdr, pos_p}) {
        ggml_set_input(t);
    }
    // prefix rows: the n_drafts target states, then the drafts' drafter states (draft-major)
    std::vector<ggml_tensor *> kp, vp;
    weaver_prefix_kv(ctx, W, ht, hdr, pos_p, kp, vp);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, n_nodes, false);
    for (int32_t l = 0; l < W->layers; ++l) {
        ggml_build_forward_expand(gf, ggml_cpy(ctx, kp[l], W->pkv.k[l]));
        ggml_build_forward_expand(gf, ggml_cpy(ctx, vp[l], W->pkv.v[l]));
    }
    if (!ggml_gallocr_alloc_graph(W->galloc, gf)) {
        return -2;
    }
    std::vector<int32_t> pp(P);
    for (int32_t n = 0; n < n_drafts; ++n) {
        pp[n] = 0;
        for (int32_t i = 0; i < D; ++i) {
            pp[n_drafts + n * D + i] = i + 1;
        }
    }
    ggml_backend_tensor_set(ht, h_target, 0, ggml_nbytes(ht));
    ggml_backend_tensor_set(hdr, h_drafter, 0, ggml_nbytes(hdr));
    ggml_backend_tensor_set(pos_p, pp.data(), 0, ggml_nbytes(pos_p));
    if (ggml_backend_graph_compute(W->backend, gf) != GGML_STATUS_SUCCESS) {
        return -3;
    }
    W->prefix_ok = true;
    W->prefix_gen++;
    return 0;
}

int32_t tfm_weaver_steps(tfm_weaver * W, int32_t n_paths, const int32_t * path_draft, const int32_t * path_len,
                         const float * step_emb, float * q_out) {
    if (W == nullptr || !W->prefix_ok || n_paths < 1 || path_draft == nullptr || path_len == nullptr ||
        step_emb == nullptr || q_out == nullptr) {
        return -1;
    }
    const int32_t n_drafts = W->n_drafts, D = W->depth;
    int32_t T = 0;
    for (int32_t p = 0; p < n_paths; ++p) {
        if (path_draft[p] < 0 || path_draft[p] >= n_drafts || path_len[p] < 1 || path_len[p] > D) {
            return -1;
        }
        T += path_len[p];
    }
    const int32_t P = n_drafts * (1 + D), Tk = P + T;
    const size_t n_nodes = 32 + 48 * (size_t) W->layers;
    auto ctx_guard = weaver_graph_ctx(n_nodes);
    ggml_context * ctx = ctx_guard.get();
    if (ctx == nullptr) {
        return -2;
    }
    ggml_tensor * se    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->target_hidden, T);
    ggml_tensor * pos_s = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    ggml_tensor * mask  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Tk, T);
    ggml_tensor * sel   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_paths);
    for (ggml_tensor * t : {se, pos_s, mask, sel}) {
        ggml_set_input(t);
    }
    ggml_tensor * x = weaver_step_in(ctx, W, se);
    for (int32_t l = 0; l < W->layers; ++l) {
        ggml_tensor * q, * ks, * vs;
        weaver_qkv(ctx, W, l, x, pos_s, q, ks, vs);
        ggml_tensor * k = ggml_concat(ctx, W->pkv.k[l], ks, 2);                            // [hd, H, Tk]
        ggml_tensor * v = ggml_concat(ctx, W->pkv.v[l], vs, 1);                            // [Wd, Tk]
        x = weaver_attend_mlp(ctx, W, l, x, q, k, v, mask);
    }
    ggml_tensor * res = ggml_get_rows(ctx, weaver_q_out(ctx, W, x), sel);
    ggml_set_output(res);                                                                // [r, n_paths]
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, n_nodes, false);
    ggml_build_forward_expand(gf, res);
    if (!ggml_gallocr_alloc_graph(W->galloc, gf)) {
        return -2;
    }
    std::vector<int32_t> ps(T), sl(n_paths), row_draft(T), row_step(T);
    for (int32_t p = 0, r = 0; p < n_paths; ++p) {
        for (int32_t s = 0; s < path_len[p]; ++s, ++r) {
            ps[r] = s + 1;
            row_draft[r] = path_draft[p];
            row_step[r] = s;
        }
        sl[p] = r - 1;
    }
    std::vector<ggml_fp16_t> m((size_t) Tk * T, ggml_fp32_to_fp16(-INFINITY));
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
    for (int32_t r = 0; r < T; ++r) {
        ggml_fp16_t * row = m.data() + (size_t) r * Tk;
        const int32_t n = row_draft[r];
        row[n] = zero;                                              // its draft's target state
        for (int32_t i = 0; i < D; ++i) {
            row[n_drafts + n * D + i] = zero;                       // its draft's drafter states
        }
        for (int32_t c = r - row_step[r]; c <= r; ++c) {
            row[P + c] = zero;                                      // its path's steps up to itself
        }
    }
    ggml_backend_tensor_set(se, step_emb, 0, ggml_nbytes(se));
    ggml_backend_tensor_set(pos_s, ps.data(), 0, ggml_nbytes(pos_s));
    ggml_backend_tensor_set(mask, m.data(), 0, ggml_nbytes(mask));
    ggml_backend_tensor_set(sel, sl.data(), 0, ggml_nbytes(sel));
    if (ggml_backend_graph_compute(W->backend, gf) != GGML_STATUS_SUCCESS) {
        return -3;
    }
    ggml_backend_tensor_get(res, q_out, 0, ggml_nbytes(res));
    return n_paths;
}

int32_t tfm_weaver_q(tfm_weaver * W, int32_t n_drafts, const float * h_target, const float * h_drafter,
                     int32_t n_paths, const int32_t * path_draft, const int32_t * path_len, const float * step_emb,
                     float * q_out) {
    if (W == nullptr || n_paths < 1 || path_draft == nullptr || path_len == nullptr || step_emb == nullptr ||
        q_out == nullptr) {
        return -1;
    }
    for (int32_t p = 0; p < n_paths; ++p) {  // checked before the kept prefix is replaced
        if (path_draft[p] < 0 || path_draft[p] >= n_drafts || path_len[p] < 1 || path_len[p] > W->depth) {
            return -1;
        }
    }
    const int32_t r = tfm_weaver_prefix(W, n_drafts, h_target, h_drafter);
    return r < 0 ? r : tfm_weaver_steps(W, n_paths, path_draft, path_len, step_emb, q_out);
}

int32_t tfm_weaver_nodes_begin(tfm_weaver * W, const float * h_target, const float * h_drafter, int32_t max_nodes) {
    if (W == nullptr || h_target == nullptr || h_drafter == nullptr || max_nodes < 1) {
        return -1;
    }
    W->nodes_ok = false;
    const int32_t r = tfm_weaver_prefix(W, 1, h_target, h_drafter);
    if (r < 0) {
        return r;
    }
    if (max_nodes != W->max_nodes) {  // the store: keys [hd*H, S] and values [W, S] a layer, zeroed once
        W->free_nodes();
        const int64_t S = (int64_t) max_nodes + TFM_WEAVER_PAD;
        if (!W->nkv.alloc(W->backend, W->layers, {W->width, S}, {W->width, S})) {
            return -2;
        }
        // rows of no node are masked out, but a masked score times a NaN is still NaN
        ggml_backend_buffer_clear(W->nkv.buf, 0);
        W->max_nodes = max_nodes;
    }
    W->n_nodes = 0;
    W->node_parent.clear();
    W->node_depth.clear();
    W->nodes_gen = W->prefix_gen;
    W->nodes_ok = true;
    return 0;
}

namespace {

// the graph of R rows over the prefix and the node store (built once per R and store; its own allocator)
tfm_weaver_node_graph * weaver_node_graph(tfm_weaver * W, int32_t R) {
    auto it = W->node_graphs.find(R);
    if (it != W->node_graphs.end()) {
        return it->second.get();
    }
    const int32_t D = W->depth, Wd = W->width, H = W->heads, hd = Wd / H, P = 1 + D;
    const int64_t S = (int64_t) W->max_nodes + TFM_WEAVER_PAD, Tk = P + S;
    const size_t n_nodes = 32 + 64 * (size_t) W->layers;
    auto g = std::make_unique<tfm_weaver_node_graph>();
    ggml_init_params params = {n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
    if ((g->ctx = ggml_init(params)) == nullptr) {
        return nullptr;
    }
    ggml_context * ctx = g->ctx;
    g->se   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W->target_hidden, R);
    g->pos  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, R);
    g->mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Tk, R);
    g->idx  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, R);
    for (ggml_tensor * t : {g->se, g->pos, g->mask, g->idx}) {
        ggml_set_input(t);
    }
    ggml_tensor * x = weaver_step_in(ctx, W, g->se);
    for (int32_t l = 0; l < W->layers; ++l) {
        ggml_tensor * q, * ks, * vs;
        weaver_qkv(ctx, W, l, x, g->pos, q, ks, vs);
        // the rows' keys and values into their store rows, then attention over the prefix and the store
        ggml_tensor * kn = ggml_set_rows(ctx, W->nkv.k[l], ggml_reshape_2d(ctx, ks, Wd, R), g->idx);
        ggml_tensor * vn = ggml_set_rows(ctx, W->nkv.v[l], vs, g->idx);
        ggml_tensor * k  = ggml_concat(ctx, W->pkv.k[l], ggml_reshape_3d(ctx, kn, hd, H, S), 2);   // [hd, H, Tk]
        ggml_tensor * v  = ggml_concat(ctx, W->pkv.v[l], vn, 1);                                   // [Wd, Tk]
        x = weaver_attend_mlp(ctx, W, l, x, q, k, v, g->mask);
    }
    g->res = weaver_q_out(ctx, W, x);                                                         // [r, R]
    ggml_set_output(g->res);
    g->gf = ggml_new_graph_custom(ctx, n_nodes, false);
    ggml_build_forward_expand(g->gf, g->res);
    g->galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(W->backend));
    if (g->galloc == nullptr || !ggml_gallocr_alloc_graph(g->galloc, g->gf)) {
        return nullptr;
    }
    return (W->node_graphs[R] = std::move(g)).get();
}

} // namespace

int32_t tfm_weaver_nodes_add(tfm_weaver * W, int32_t n, const int32_t * parent, const float * step_emb, float * q_out) {
    if (W == nullptr || !W->nodes_ok || !W->prefix_ok || W->n_drafts != 1 || W->nodes_gen != W->prefix_gen ||
        n < 1 || parent == nullptr || step_emb == nullptr || q_out == nullptr || W->n_nodes + n > W->max_nodes) {
        return -1;
    }
    const int32_t N0 = W->n_nodes, D = W->depth, P = 1 + D;
    std::vector<int32_t> par(W->node_parent), dep(W->node_depth);  // with this call's nodes
    for (int32_t i = 0; i < n; ++i) {  // a parent before the node, a path of at most D steps
        if (parent[i] < -1 || parent[i] >= N0 + i) {
            return -1;
        }
        par.push_back(parent[i]);
        dep.push_back(parent[i] < 0 ? 0 : dep[parent[i]] + 1);
        if (dep.back() >= D) {
            return -1;
        }
    }
    const int32_t R = n <= TFM_WEAVER_PAD ? (int32_t) 1 << (int32_t) std::ceil(std::log2((double) n)) : n;
    tfm_weaver_node_graph * g = weaver_node_graph(W, R);
    if (g == nullptr) {
        return -2;
    }
    const int64_t S = (int64_t) W->max_nodes + TFM_WEAVER_PAD, Tk = P + S;
    std::vector<int32_t> pos(R, 1);
    std::vector<int64_t> idx(R);
    std::vector<ggml_fp16_t> m((size_t) Tk * R, ggml_fp32_to_fp16(-INFINITY));
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
    for (int32_t r = 0; r < R; ++r) {
        ggml_fp16_t * row = m.data() + (size_t) r * Tk;
        for (int32_t c = 0; c < P; ++c) {
            row[c] = zero;                                   // the draft's prefix
        }
        if (r < n) {
            const int32_t v = N0 + r;
            pos[r] = dep[v] + 1;
            idx[r] = v;
            for (int32_t a = v; a >= 0; a = par[a]) {
                row[P + a] = zero;                           // the node and its ancestors
            }
        } else {
            idx[r] = W->max_nodes + r;                       // a padded row: a scratch row of its own
        }
    }
    std::vector<float> se((size_t) W->target_hidden * R, 0.0f);
    std::memcpy(se.data(), step_emb, sizeof(float) * (size_t) W->target_hidden * n);
    ggml_backend_tensor_set(g->se, se.data(), 0, ggml_nbytes(g->se));
    ggml_backend_tensor_set(g->pos, pos.data(), 0, ggml_nbytes(g->pos));
    ggml_backend_tensor_set(g->mask, m.data(), 0, ggml_nbytes(g->mask));
    ggml_backend_tensor_set(g->idx, idx.data(), 0, ggml_nbytes(g->idx));
    if (ggml_backend_graph_compute(W->backend, g->gf) != GGML_STATUS_SUCCESS) {
        return -3;
    }
    ggml_backend_tensor_get(g->res, q_out, 0, sizeof(float) * (size_t) W->rank * n);
    W->node_parent.swap(par);
    W->node_depth.swap(dep);
    W->n_nodes = N0 + n;
    return n;
}
