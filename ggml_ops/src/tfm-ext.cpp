// tfm-local: C forwarders over llama-ext.h, a backend top-k sampler, a backend token sampler and the
// Weaver (its q, node store and DARTree graph; see tfm-ext.h).
// The op test/bench harness (tfm_test_op, tfm_bench_op) is in tfm-op-harness.cpp.
#include "tfm-ext.h"
#include "llama-context.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"
#include "llama-model.h"

#include "ggml-cpp.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

int32_t tfm_api_version(void) {
    return 18;
}

bool tfm_context_keep_graphs(llama_context * ctx, bool on) {
    return ctx != nullptr && ctx->set_keep_graphs(on) && ctx->get_keep_graphs() == on;
}

void tfm_set_layer_inp(llama_context * ctx, uint32_t il, bool value) {
    llama_set_embeddings_layer_inp(ctx, il, value);
}

const float * tfm_get_layer_inp(llama_context * ctx, uint32_t il) {
    return llama_get_embeddings_layer_inp(ctx, il);
}

const int32_t * tfm_model_target_layers(const llama_model * model, uint32_t * n) {
    const uint32_t count = llama_model_target_layer_ids_n(model);
    if (n) {
        *n = count;
    }
    return count > 0 ? llama_model_target_layer_ids(model) : nullptr;
}

int32_t tfm_model_selector_top_k(const llama_model * model) {
    return llama_model_dflash_selector_top_k(model);
}

void tfm_lattice_enable(llama_context * ctx, bool on) {
    llama_set_embeddings_nextn(ctx, on, /*masked =*/ false);
}

const float * tfm_lattice_get(llama_context * ctx) {
    return llama_get_embeddings_nextn(ctx);
}

int32_t tfm_batch_tokens(llama_batch_ext * batch, int32_t n, const int32_t * tokens, const int32_t * pos,
                         const int32_t * seq_ids, const int8_t * outputs) {
    if (batch == nullptr || n < 0 || (n > 0 && (tokens == nullptr || pos == nullptr))) {
        return -4;
    }
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, seq_ids ? seq_ids[i] : 0, tokens[i]);
        if (idx < 0) {
            return idx;
        }
        const llama_pos p[4] = {pos[i], 0, 0, 0};
        if (!llama_batch_ext_set_pos(batch, idx, p) ||
            ((outputs == nullptr || outputs[i]) && !llama_batch_ext_set_output_logits(batch, idx, true))) {
            return -4;
        }
    }
    return n;
}

int32_t tfm_batch_embd(llama_batch_ext * batch, int32_t n, const float * rows, int32_t width, int32_t pos0) {
    if (batch == nullptr || n < 0 || width < 1 || (n > 0 && rows == nullptr)) {
        return -4;
    }
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const llama_embd e = {rows + (size_t) i*width, 1, (size_t) width};
        const int32_t idx = llama_batch_ext_add_embd(batch, 0, e);
        if (idx < 0) {
            return idx;
        }
        const llama_pos p[4] = {pos0 + i, pos0 + i, pos0 + i, 0};
        if (!llama_batch_ext_set_pos(batch, idx, p)) {
            return -4;
        }
    }
    return n;
}

// every attention KV cache of the context's memory (one, base + SWA, or a hybrid's)
static std::vector<llama_kv_cache *> attention_caches(llama_context * ctx) {
    llama_memory_i * mem = llama_get_memory(ctx);
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        return {kv};
    }
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return {iswa->get_base(), iswa->get_swa()};
    }
    if (auto * hybrid = dynamic_cast<llama_memory_hybrid *>(mem)) {
        return {hybrid->get_mem_attn()};
    }
    return {};
}

// -- tree mode of the recurrent (Gated DeltaNet) layers of a hybrid (patch 0006, tfm-tree-rs.h) ---

namespace {

// The recurrent memory of ctx's hybrid memory, or nullptr (no recurrent layers).
llama_memory_recurrent * recurrent_memory(llama_context * ctx) {
    if (auto * hybrid = dynamic_cast<llama_memory_hybrid *>(llama_get_memory(ctx))) {
        return hybrid->get_mem_recr();
    }
    return nullptr;
}

// Architectures whose graph has the tree mode of tfm-tree-rs.h.
bool tree_rs_arch(const llama_model & model) {
    return model.arch == LLM_ARCH_QWEN35 || model.arch == LLM_ARCH_QWEN35MOE || model.arch == LLM_ARCH_QWEN3NEXT;
}

// (Re)allocate the per-layer stash for trees of up to cap nodes, each layer's next to its states:
//   gdn  F32 [cap*(2*S_v + 1)*H_v]       u [S_v, H_v, N] | gamma [1, H_v, N] | k [S_v, H_k <= H_v, N]
//   conv F32 [(d_conv-1 + cap)*channels] sx [d_conv-1+N, channels] of ggml_ssm_conv_tree
bool tree_rs_alloc(const llama_hparams & hp, llama_memory_recurrent * rs, uint32_t cap) {
    rs->tree_bufs.clear();
    const size_t n_layer = rs->s_l.size();
    rs->tree_gdn_l.assign(n_layer, nullptr);
    rs->tree_conv_l.assign(n_layer, nullptr);
    rs->tree_hk_l.assign(n_layer, 0);
    rs->tree_cap = 0;
    ++rs->tree_gen;

    const int64_t S_v = hp.ssm_d_state, H_v = hp.ssm_dt_rank, K = hp.ssm_d_conv;
    if (K < 2 || hp.n_embd_r() % (K - 1) != 0) {
        return false;
    }
    const int64_t channels = hp.n_embd_r() / (K - 1);

    std::map<ggml_backend_buffer_type_t, ggml_context *> ctxs;
    for (size_t il = 0; il < n_layer; ++il) {
        if (rs->s_l[il] == nullptr || rs->r_l[il] == nullptr) {
            continue; // not a recurrent layer
        }
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(rs->s_l[il]->buffer);
        ggml_context * & c = ctxs[buft];
        if (c == nullptr) {
            ggml_init_params params = { 2*n_layer*ggml_tensor_overhead(), nullptr, true };
            c = ggml_init(params);
            rs->tree_bufs.emplace_back(ggml_context_ptr(c), nullptr);
        }
        rs->tree_gdn_l[il]  = ggml_new_tensor_1d(c, GGML_TYPE_F32, (int64_t) cap*(2*S_v + 1)*H_v);
        rs->tree_conv_l[il] = ggml_new_tensor_1d(c, GGML_TYPE_F32, (K - 1 + (int64_t) cap)*channels);
        ggml_format_name(rs->tree_gdn_l[il],  "tfm_tree_gdn_l%zu",  il);
        ggml_format_name(rs->tree_conv_l[il], "tfm_tree_conv_l%zu", il);
    }
    for (auto & [buft, c] : ctxs) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(c, buft);
        if (buf == nullptr) {
            rs->tree_bufs.clear();
            return false;
        }
        for (auto & cb : rs->tree_bufs) {
            if (cb.first.get() == c) {
                cb.second.reset(buf);
            }
        }
    }
    rs->tree_cap = cap;
    return true;
}

// Advance the conv and recurrent states of sequence 0 along the accepted path[0..L) (root first, batch
// rows of the last tree) with one small graph per buffer type, on the context's backend for it.
bool tree_rs_commit(llama_context * ctx, llama_memory_recurrent * rs, const int32_t * path, uint32_t L) {
    const llama_hparams & hp = llama_get_model(ctx)->hparams;
    const int32_t cell = rs->cells.empty() ? -1 : rs->cells[0].tail;
    if (cell < 0 || rs->n_rs_seq != 0 || (L > 0 && !rs->tree_ran)) { // the tree batch did not run in tree mode
        return false;
    }
    const int64_t N = (int64_t) rs->tree_parent.size();
    const int64_t S_v = hp.ssm_d_state, H_v = hp.ssm_dt_rank, K = hp.ssm_d_conv;
    const int64_t channels = hp.n_embd_r() / (K - 1);

    std::map<ggml_backend_buffer_type_t, std::vector<size_t>> groups; // buffer type -> its layers
    for (size_t il = 0; il < rs->tree_gdn_l.size() && L > 0; ++il) {
        if (rs->tree_gdn_l[il] != nullptr) {
            if (rs->tree_hk_l[il] <= 0) {
                return false; // no tree graph was ever built for this stash
            }
            groups[ggml_backend_buffer_get_type(rs->s_l[il]->buffer)].push_back(il);
        }
    }
    ggml_backend_sched_t sched = ctx->get_sched();
    for (auto & [buft, layers] : groups) { // none when L = 0: nothing accepted, the states stay
        ggml_backend_t backend = nullptr;
        for (int i = 0; i < ggml_backend_sched_get_n_backends(sched) && backend == nullptr; ++i) {
            ggml_backend_t b = ggml_backend_sched_get_backend(sched, i);
            if (ggml_backend_supports_buft(b, buft)) {
                backend = b;
            }
        }
        if (backend == nullptr) {
            return false;
        }
        const size_t max_nodes = 16*layers.size() + 8;
        ggml_init_params params = { max_nodes*ggml_tensor_overhead() + ggml_graph_overhead_custom(max_nodes, false),
                                    nullptr, true };
        ggml_context_ptr gctx(ggml_init(params));
        ggml_context * c = gctx.get();
        ggml_cgraph * gf = ggml_new_graph_custom(c, max_nodes, false);

        ggml_tensor * p = ggml_new_tensor_2d(c, GGML_TYPE_I32, L, 1); // [L, 1]
        ggml_set_input(p);
        for (size_t il : layers) {
            ggml_tensor * s_all = rs->s_l[il];
            ggml_tensor * r_all = rs->r_l[il];
            ggml_tensor * gdn   = rs->tree_gdn_l[il];
            const int64_t H_k   = rs->tree_hk_l[il];
            // S_0 of the sequence's cell: [S_v, S_v, H_v, 1]
            ggml_tensor * s0 = ggml_view_4d(c, s_all, S_v, S_v, H_v, 1, S_v*4, S_v*S_v*4, S_v*S_v*H_v*4, cell*s_all->nb[1]);
            ggml_tensor * u  = ggml_view_4d(c, gdn, S_v, H_v, N, 1, S_v*4, S_v*H_v*4, S_v*H_v*N*4, 0);          // [S_v, H_v, N, 1]
            ggml_tensor * y  = ggml_view_4d(c, gdn, 1, H_v, N, 1, 4, H_v*4, H_v*N*4, S_v*H_v*N*4);               // [1, H_v, N, 1]
            ggml_tensor * k  = ggml_view_4d(c, gdn, S_v, H_k, N, 1, S_v*4, S_v*H_k*4, S_v*H_k*N*4, (S_v + 1)*H_v*N*4); // [S_v, H_k, N, 1]
            ggml_build_forward_expand(gf, ggml_cpy(c, ggml_gated_delta_net_tree_commit(c, s0, k, u, y, p), s0));
            // conv: sx [K-1+N, channels, 1] -> the state [K-1, channels, 1] of the cell
            ggml_tensor * sx = ggml_view_3d(c, rs->tree_conv_l[il], K - 1 + N, channels, 1, (K - 1 + N)*4, (K - 1 + N)*channels*4, 0);
            ggml_tensor * r0 = ggml_view_1d(c, r_all, (K - 1)*channels, cell*r_all->nb[1]);
            ggml_build_forward_expand(gf, ggml_cpy(c, ggml_ssm_conv_tree_commit(c, sx, p, (int) K), r0));
        }
        ggml_gallocr_t galloc = ggml_gallocr_new(buft);
        bool ok = ggml_gallocr_alloc_graph(galloc, gf);
        if (ok) {
            ggml_backend_tensor_set(p, path, 0, L*sizeof(int32_t));
            ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
        }
        ggml_gallocr_free(galloc);
        if (!ok) {
            return false;
        }
    }
    rs->cells[cell].pos = rs->tree_pos0 + (llama_pos) L - 1;
    return true;
}

} // namespace

bool tfm_tree_set(llama_context * ctx, const int32_t * parents, uint32_t n_nodes) {
    const auto caches = attention_caches(ctx);
    const uint32_t n = parents ? n_nodes : 0;
    for (uint32_t i = 0; i < n; ++i) {
        if (parents[i] < -1 || parents[i] >= (int32_t) i) {
            return false;
        }
    }
    if (llama_memory_recurrent * rs = recurrent_memory(ctx)) {
        if (!tree_rs_arch(llama_get_model(ctx)[0]) || rs->n_rs_seq != 0) {
            return false; // a hybrid whose graph has no tree mode: refuse rather than advance the states
        }
        if (n > rs->tree_cap && !tree_rs_alloc(llama_get_model(ctx)->hparams, rs, (n + 15) & ~15u)) {
            return false;
        }
        rs->tree_parent.assign(parents, parents + n);
        rs->tree_ran  = false;
        rs->tree_pos0 = rs->seq_pos_max(0) + 1;
    }
    for (auto * kv : caches) {
        kv->tree_set(parents, n);
    }
    return !caches.empty();
}

bool tfm_tree_commit(llama_context * ctx, const int32_t * keep, uint32_t n_keep) {
    const auto caches = attention_caches(ctx);
    bool ok = !caches.empty();
    if (llama_memory_recurrent * rs = recurrent_memory(ctx)) {
        // the recurrent states advance along a path: keep must be root first, each node the child of the last
        const auto & par = rs->tree_parent;
        for (uint32_t m = 0; m < n_keep && ok; ++m) {
            ok = keep[m] >= 0 && (size_t) keep[m] < par.size() && par[keep[m]] == (m == 0 ? -1 : keep[m - 1]);
        }
        ok = ok && (par.empty() ? n_keep == 0 : tree_rs_commit(ctx, rs, keep, n_keep));
        rs->tree_parent.clear();
        if (!ok) {
            return false;
        }
    }
    for (auto * kv : caches) {
        ok = kv->tree_commit(keep, n_keep) && ok;
    }
    return ok;
}

// -- backend top-k log-probabilities ------------------------------------------------------
//
// A llama_sampler whose backend interface adds the top-k and their log-probabilities to the decode
// graph. llama.cpp (build_sampling) calls backend_apply once per output row with a view of that
// row's logits; the first call of a graph builds the ops once for every row of the logits matrix the
// views point into (a handful of kernels instead of a handful per row), and each row's outputs are
// views of that result. A row that is not such a view (or one whose candidates an earlier sampler
// already narrowed) gets the same ops on its own.

namespace {

struct topk_config {
    int32_t k;          // candidates per row
    int64_t n_vocab;    // row length (for the support probe)
    bool    on_backend; // verdict of backend_init
    // the graph being built (cleared by backend_reset): the logits matrix and its rows' results
    const ggml_tensor * rows_src  = nullptr; // [n_vocab, n_rows] f32
    ggml_tensor *       rows_ids  = nullptr; // [k, n_rows] i32
    ggml_tensor *       rows_logp = nullptr; // [k, n_rows] f32
    int64_t             rows_real = 0;       // rows of the batch (llama.cpp pads the matrix with one)
};

struct topk_rows {
    ggml_tensor * ids;  // [k, R] i32, unordered
    ggml_tensor * logp; // [k, R] f32 (k = 1: the argmax's raw logit)
};

// The k best of each column of x [n, R] and their log-probs x_i - lse, lse = x_a - log p_a at the
// most likely candidate a (p = softmax over the full row: exact where p_i underflows float32).
// k = 1 (the target's greedy top-1): an argmax, and the raw logit of it in place of a log-prob:
// greedy verification reads only the id, and the softmax would be one more pass over every row.
topk_rows topk_build_rows(ggml_context * ctx, ggml_tensor * x, int k) {
    const int64_t n  = x->ne[0];
    const int64_t R  = x->ne[1];
    ggml_tensor * x3 = ggml_reshape_3d(ctx, x, 1, n, R); // rows of one element, per column of x
    if (k == 1) {
        ggml_tensor * ids = ggml_reshape_2d(ctx, ggml_argmax(ctx, x), 1, R);                 // [1, R]
        return {ids, ggml_reshape_2d(ctx, ggml_get_rows(ctx, x3, ids), 1, R)};
    }
    ggml_tensor * ids = ggml_top_k(ctx, x, k);                                               // [k, R]
    ggml_tensor * xk  = ggml_reshape_2d(ctx, ggml_get_rows(ctx, x3, ids), k, R);
    ggml_tensor * pk  = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, ggml_soft_max(ctx, x), 1, n, R), ids), k, R);
    ggml_tensor * a   = ggml_reshape_2d(ctx, ggml_argmax(ctx, pk), 1, R);                    // [1, R]
    ggml_tensor * xa  = ggml_get_rows(ctx, ggml_reshape_3d(ctx, xk, 1, k, R), a);          // [1, 1, R]
    ggml_tensor * pa  = ggml_get_rows(ctx, ggml_reshape_3d(ctx, pk, 1, k, R), a);
    ggml_tensor * lse = ggml_reshape_2d(ctx, ggml_sub(ctx, xa, ggml_log(ctx, pa)), 1, R);
    return {ids, ggml_sub(ctx, xk, lse)};
}

// One row on its own: outputs mapped through the row's earlier candidate ids when a previous
// sampler set them.
void topk_build_row(ggml_context * ctx, const topk_config & cfg, llama_sampler_data * data) {
    const int64_t n    = ggml_nelements(data->logits);
    const int     k    = (int) std::min<int64_t>(cfg.k, n);
    topk_rows     r    = topk_build_rows(ctx, ggml_reshape_2d(ctx, data->logits, n, 1), k);
    ggml_tensor * ids  = ggml_reshape_1d(ctx, r.ids, k);
    data->logits       = ggml_reshape_1d(ctx, r.logp, k);
    data->candidates   = data->candidates
        ? ggml_get_rows(ctx, ggml_reshape_2d(ctx, data->candidates, 1, n), ids)
        : ids;
}

// Row of src that the row view points at.
// Rows of a logits matrix without the row of zeros llama.cpp appends to it (build_sampling pads the
// logits with one row to keep a one-output graph static).
int64_t batch_rows(const ggml_tensor * src) {
    const bool padded = src->op == GGML_OP_PAD && src->ne[1] >= 2 && src->src[0] != nullptr &&
                        src->src[0]->ne[1] == src->ne[1] - 1;
    return padded ? src->ne[1] - 1 : src->ne[1];
}

// The logits matrix without llama.cpp's pad row: the pad's own source when src is that pad, else src.
// Ops built over it leave the pad out of the graph (on the CPU the pad is a copy of the whole matrix
// with per-element indexing: ~1 ms a plain step of the 1.5B target's 151,936 logits on the 2-core
// development CPU, docs/cpu.md).
ggml_tensor * unpadded(const ggml_tensor * src) {
    return const_cast<ggml_tensor *>(batch_rows(src) < src->ne[1] ? src->src[0] : src);
}

size_t row_index(const ggml_tensor * row, const ggml_tensor * src) {
    return row->view_offs / src->nb[1];
}

// The logits matrix data->logits is a row view of, or nullptr when it is not one.
const ggml_tensor * row_source(const llama_sampler_data * data) {
    const ggml_tensor * row = data->logits;
    const ggml_tensor * src = row->view_src;
    const bool ok = src != nullptr && data->candidates == nullptr && src->type == GGML_TYPE_F32 &&
                    ggml_n_dims(row) == 1 && row->ne[0] == src->ne[0] && ggml_is_contiguous(src) &&
                    row->view_offs % src->nb[1] == 0;
    return ok ? src : nullptr;
}

// A row of a logits matrix: the whole matrix's top-k once per graph (added to gf). With several
// output rows (a verification, a drafter block: every row an output) tfm_topk_get reads the matrix's
// results in one copy per tensor, and llama.cpp copies nothing per row (it copied each row's two
// results on its own: 2 x 17 copies in a 17-node verify, 2 x 16 in a drafter block). With one output
// row (a prefill's last, a plain step) the row's results stay its outputs, which llama.cpp maps to
// the row's batch index. Any other row: its own top-k as the row's outputs (topk_build_row).
void topk_build(ggml_context * ctx, ggml_cgraph * gf, topk_config & cfg, llama_sampler_data * data) {
    const ggml_tensor * src = row_source(data);
    if (src == nullptr) {
        topk_build_row(ctx, cfg, data);
        return;
    }
    const int k = (int) std::min<int64_t>(cfg.k, src->ne[0]);
    if (cfg.rows_src != src) {
        topk_rows r    = topk_build_rows(ctx, unpadded(src), k);
        cfg.rows_src   = src;
        cfg.rows_ids   = r.ids;
        cfg.rows_logp  = r.logp;
        cfg.rows_real  = batch_rows(src);
        ggml_set_name(cfg.rows_ids, "tfm_topk_ids");
        ggml_set_name(cfg.rows_logp, "tfm_topk_logp");
        ggml_set_output(cfg.rows_ids);   // read after the decode by tfm_topk_get
        ggml_set_output(cfg.rows_logp);
        if (gf != nullptr) {
            ggml_build_forward_expand(gf, cfg.rows_ids);
            ggml_build_forward_expand(gf, cfg.rows_logp);
        }
    }
    if (cfg.rows_real == 1) {
        const size_t i = row_index(data->logits, src);
        data->candidates = ggml_view_1d(ctx, cfg.rows_ids, k, i * cfg.rows_ids->nb[1]);
        data->logits     = ggml_view_1d(ctx, cfg.rows_logp, k, i * cfg.rows_logp->nb[1]);
        return;
    }
    data->logits     = nullptr;
    data->probs      = nullptr;
    data->sampled    = nullptr;
    data->candidates = nullptr;
}

// True when the device behind buft runs every op that build adds to a graph (of at most 128 nodes,
// in a context without data): the support probe of the backend samplers.
bool device_runs(ggml_backend_buffer_type_t buft, const std::function<void(ggml_context *, ggml_cgraph *)> & build) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr) {
        return true; // plain host memory: the CPU backend runs these ops
    }
    const size_t max_nodes = 128;
    ggml_init_params params = {
        /*.mem_size   =*/ max_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(max_nodes, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        return false;
    }
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, max_nodes, false);
    build(ctx, gf);
    bool ok = true;
    for (int i = 0; ok && i < ggml_graph_n_nodes(gf); ++i) {
        ok = ggml_backend_dev_supports_op(dev, ggml_graph_node(gf, i));
    }
    ggml_free(ctx);
    return ok;
}

// True when the device behind buft runs every op of topk_build, for one row and for a matrix of rows.
bool topk_supported(const topk_config & cfg, ggml_backend_buffer_type_t buft) {
    return device_runs(buft, [&](ggml_context * ctx, ggml_cgraph * gf) {
        ggml_tensor * mat   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cfg.n_vocab, 2);
        topk_config   probe = { cfg.k, cfg.n_vocab, cfg.on_backend, nullptr, nullptr, nullptr, 0 };
        llama_sampler_data one  = { ggml_new_tensor_1d(ctx, GGML_TYPE_F32, cfg.n_vocab), nullptr, nullptr, nullptr };
        llama_sampler_data rows = { ggml_view_1d(ctx, mat, cfg.n_vocab, mat->nb[1]), nullptr, nullptr, nullptr };
        for (llama_sampler_data * d : { &one, &rows }) {
            topk_build(ctx, gf, probe, d);
            if (d->logits != nullptr) { // the single row's own outputs (a matrix's went into gf)
                ggml_build_forward_expand(gf, d->logits);
                ggml_build_forward_expand(gf, d->candidates);
            }
        }
    });
}

const char * topk_name(const llama_sampler * /*smpl*/) {
    return "tfm-topk";
}

// Host form (llama_sampler_apply): keep the k best candidates, sorted, logit := log-prob (k = 1:
// the raw logit, as topk_build).
void topk_apply(llama_sampler * smpl, llama_token_data_array * cur_p) {
    const auto * cfg = (const topk_config *) smpl->ctx;
    if (cur_p->size == 0) {
        return;
    }
    float m = -INFINITY;
    for (size_t i = 0; i < cur_p->size; ++i) {
        m = std::max(m, cur_p->data[i].logit);
    }
    double s = 0.0;
    for (size_t i = 0; i < cur_p->size; ++i) {
        s += std::exp((double) cur_p->data[i].logit - m);
    }
    const size_t k   = std::min<size_t>((size_t) cfg->k, cur_p->size);
    const float  lse = cfg->k == 1 ? 0.0f : m + (float) std::log(s);
    std::partial_sort(cur_p->data, cur_p->data + k, cur_p->data + cur_p->size,
                      [](const llama_token_data & a, const llama_token_data & b) { return a.logit > b.logit; });
    cur_p->size = k;
    for (size_t i = 0; i < k; ++i) {
        cur_p->data[i].logit -= lse;
        cur_p->data[i].p = std::exp(cur_p->data[i].logit);
    }
    cur_p->sorted = true;
}

llama_sampler * topk_new(int32_t k, int64_t n_vocab);

llama_sampler * topk_clone(const llama_sampler * smpl) {
    const auto * cfg = (const topk_config *) smpl->ctx;
    return topk_new(cfg->k, cfg->n_vocab);
}

void topk_free(llama_sampler * smpl) {
    delete (topk_config *) smpl->ctx;
}

bool topk_backend_init(llama_sampler * smpl, ggml_backend_buffer_type_t buft, uint32_t /*n_outputs_max_per_seq*/) {
    auto * cfg = (topk_config *) smpl->ctx;
    cfg->on_backend = topk_supported(*cfg, buft);
    return cfg->on_backend;
}

void topk_backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph * gf, llama_sampler_data * data) {
    topk_build(ctx, gf, *(topk_config *) smpl->ctx, data);
}

void topk_backend_reset(llama_sampler * smpl) {
    auto * cfg = (topk_config *) smpl->ctx;
    cfg->rows_src  = nullptr;
    cfg->rows_ids  = nullptr;
    cfg->rows_logp = nullptr;
    cfg->rows_real = 0;
}

llama_sampler_i topk_iface = {
    /* .name              = */ topk_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ topk_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ topk_clone,
    /* .free              = */ topk_free,
    /* .backend_init      = */ topk_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ topk_backend_apply,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ topk_backend_reset,
    /* .copy_state        = */ nullptr,
};

llama_sampler * topk_new(int32_t k, int64_t n_vocab) {
    return llama_sampler_init(&topk_iface, new topk_config{k, n_vocab, false, nullptr, nullptr, nullptr, 0});
}

// The sampler chain attached to sequence 0 of each context by tfm_topk_attach or tfm_sample_attach
// (llama.cpp keeps a raw pointer), and which of the two it is.
enum attached_kind { ATTACHED_TOPK, ATTACHED_SAMPLE };
struct attached_chain {
    llama_sampler * chain;
    attached_kind   kind;
};
std::mutex                                        attached_mutex;
std::map<const llama_context *, attached_chain>   attached_chains;

// Detach and free ctx's chain, if any; the caller holds attached_mutex.
void chain_detach(llama_context * ctx) {
    auto it = attached_chains.find(ctx);
    if (it == attached_chains.end()) {
        return;
    }
    llama_set_sampler(ctx, 0, nullptr);
    llama_sampler_free(it->second.chain);
    attached_chains.erase(it);
}

// The first sampler of ctx's chain when it is of this kind, else nullptr; the caller holds attached_mutex.
llama_sampler * attached_sampler(const llama_context * ctx, attached_kind kind) {
    auto it = attached_chains.find(ctx);
    if (it == attached_chains.end() || it->second.kind != kind) {
        return nullptr;
    }
    return llama_sampler_chain_get(it->second.chain, 0);
}

// k of ctx's attached top-k sampler, 0 when none; the caller holds attached_mutex.
int32_t topk_attached_k(const llama_context * ctx) {
    const llama_sampler * smpl = attached_sampler(ctx, ATTACHED_TOPK);
    return smpl == nullptr ? 0 : ((const topk_config *) smpl->ctx)->k;
}

// Attach smpl (in a new chain) on sequence 0 for batches of up to n_rows output rows; false (nothing
// attached, smpl freed) when the backend cannot run it (on_backend: backend_init's verdict).
bool chain_attach(llama_context * ctx, llama_sampler * smpl, const bool & on_backend, attached_kind kind, int32_t n_rows) {
    ctx->set_n_outputs_max_per_seq((uint32_t) n_rows);
    auto params = llama_sampler_chain_default_params();
    params.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(params);
    llama_sampler_chain_add(chain, smpl);
    // set_sampler runs backend_init (the support probe) but accepts the chain either way
    if (!llama_set_sampler(ctx, 0, chain) || !on_backend) {
        llama_set_sampler(ctx, 0, nullptr);
        llama_sampler_free(chain);
        return false;
    }
    attached_chains[ctx] = { chain, kind };
    return true;
}

} // namespace

int32_t tfm_topk_attach(llama_context * ctx, int32_t k, int32_t n_rows) {
    const int64_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    if (k < 0 || k > n_vocab || n_rows < 1) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(attached_mutex);
    chain_detach(ctx);
    if (k == 0) {
        return 0;
    }
    llama_sampler * smpl = topk_new(k, n_vocab);
    return chain_attach(ctx, smpl, ((const topk_config *) smpl->ctx)->on_backend, ATTACHED_TOPK, n_rows) ? 1 : 0;
}

int32_t tfm_topk_get(llama_context * ctx, int32_t i0, int32_t n, int32_t k, int32_t * ids, float * logp) {
    ggml_tensor * t_ids  = nullptr;
    ggml_tensor * t_logp = nullptr;
    int64_t       n_real = 0;
    {
        std::lock_guard<std::mutex> lock(attached_mutex);
        if (k < 1 || topk_attached_k(ctx) != k || i0 < 0 || n < 0) {
            return -1;
        }
        const auto * cfg = (const topk_config *) attached_sampler(ctx, ATTACHED_TOPK)->ctx;
        t_ids  = cfg->rows_ids;
        t_logp = cfg->rows_logp;
        n_real = cfg->rows_real;
    }
    // one synchronisation for all rows: llama.cpp's llama_get_sampled_*_ith each synchronise every
    // backend, four calls a row (a 65-node verify made ~190 stream synchronisations on the H200)
    ctx->synchronize();
    // the last batch's rows were a logits matrix (topk_build): its results in one copy per tensor
    std::vector<int32_t> all_ids;
    std::vector<float>   all_logp;
    // (still the tensors the sampler built: a graph built without the sampler could reuse their memory)
    const bool matrix = n_real > 1 && t_ids != nullptr && t_ids->buffer != nullptr && t_logp->buffer != nullptr &&
                        strcmp(ggml_get_name(t_ids), "tfm_topk_ids") == 0 && strcmp(ggml_get_name(t_logp), "tfm_topk_logp") == 0;
    if (matrix) {
        if (t_ids->ne[0] != k || (int64_t) i0 + n > n_real) {
            return -1;
        }
        all_ids.resize((size_t) k * n);
        all_logp.resize((size_t) k * n);
        ggml_backend_tensor_get(t_ids,  all_ids.data(),  (size_t) i0 * t_ids->nb[1],  all_ids.size() * sizeof(int32_t));
        ggml_backend_tensor_get(t_logp, all_logp.data(), (size_t) i0 * t_logp->nb[1], all_logp.size() * sizeof(float));
    }
    std::vector<std::pair<float, int32_t>> row((size_t) k);
    for (int32_t r = 0; r < n; ++r) {
        const int32_t i = i0 + r;
        const llama_token * cand = nullptr;
        const float       * lp   = nullptr;
        if (matrix) {
            cand = all_ids.data() + (size_t) r * k;
            lp   = all_logp.data() + (size_t) r * k;
        } else {
            if (ctx->get_sampled_candidates_count(i) != (size_t) k || ctx->get_sampled_logits_count(i) != (size_t) k) {
                return -1;
            }
            cand = ctx->get_sampled_candidates_ith(i);
            lp   = ctx->get_sampled_logits_ith(i);
        }
        if (cand == nullptr || lp == nullptr) {
            return -1;
        }
        for (int32_t j = 0; j < k; ++j) {
            row[j] = {lp[j], cand[j]};
        }
        std::sort(row.begin(), row.end(), [](const std::pair<float, int32_t> & a, const std::pair<float, int32_t> & b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        for (int32_t j = 0; j < k; ++j) {
            logp[(size_t) r * k + j] = row[j].first;
            ids [(size_t) r * k + j] = row[j].second;
        }
    }
    return k;
}

// -- backend token sampler ----------------------------------------------------------------
//
// A llama_sampler whose backend interface adds ggml_sample_tokens (patch 0011) over the whole logits
// matrix of the batch: one token id per output row, drawn with a key per row derived from the seed
// and the position the token is drawn for (tfm_sample_set_positions before each decode). The rows'
// own sampler outputs stay empty, so llama.cpp copies nothing; tfm_sample_get reads the result
// tensor, two ints per row, in one copy.

namespace {

struct sample_config {
    float    temp;
    int32_t  top_k;
    float    top_p;
    float    min_p;
    uint64_t seed;
    int64_t  n_vocab;
    bool     on_backend = false;
    std::vector<int64_t> positions; // per output row of the next batch
    // the graph being built (cleared by backend_reset; kept while llama.cpp reuses the graph)
    const ggml_tensor * rows_src = nullptr; // [n_vocab, R] f32
    ggml_tensor *       keys     = nullptr; // [2, R] i32 input
    ggml_tensor *       out      = nullptr; // [2, R] i32 (id, kept-set size)
};

uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void sample_build(ggml_context * ctx, ggml_cgraph * gf, sample_config & cfg, llama_sampler_data * data) {
    const ggml_tensor * src = row_source(data);
    if (src == nullptr) { // not a row of a logits matrix: a matrix of this one row
        src = ggml_reshape_2d(ctx, data->logits, ggml_nelements(data->logits), 1);
    }
    if (cfg.rows_src != src) {
        cfg.rows_src = src;
        // leave llama.cpp's pad row out: a row of 151,936 tied logits is the slowest input of every
        // filter, and the pad itself a copy of the matrix
        ggml_tensor * rows = unpadded(src);
        cfg.keys = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, rows->ne[1]);
        ggml_set_name(cfg.keys, "tfm_sample_keys");
        ggml_set_input(cfg.keys);
        cfg.out = ggml_sample_tokens(ctx, rows, cfg.keys, cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p);
        ggml_set_name(cfg.out, "tfm_sample_out");
        ggml_set_output(cfg.out);
        if (gf != nullptr) {
            ggml_build_forward_expand(gf, cfg.out);
        }
    }
    // nothing per row for llama.cpp to copy (neither these logits nor the raw ones)
    data->logits     = nullptr;
    data->probs      = nullptr;
    data->sampled    = nullptr;
    data->candidates = nullptr;
}

bool sample_supported(const sample_config & cfg, ggml_backend_buffer_type_t buft) {
    return device_runs(buft, [&](ggml_context * ctx, ggml_cgraph * gf) {
        ggml_tensor * logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cfg.n_vocab, 2);
        ggml_tensor * keys   = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 2);
        ggml_build_forward_expand(gf, ggml_sample_tokens(ctx, logits, keys, cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p));
    });
}

const char * sample_name(const llama_sampler * /*smpl*/) {
    return "tfm-sample";
}

// Host form (llama_sampler_apply, unused by tfm-local): leave the candidates as they are.
void sample_apply(llama_sampler * /*smpl*/, llama_token_data_array * /*cur_p*/) {
}

llama_sampler * sample_new(const sample_config & cfg);

llama_sampler * sample_clone(const llama_sampler * smpl) {
    return sample_new(*(const sample_config *) smpl->ctx);
}

void sample_free(llama_sampler * smpl) {
    delete (sample_config *) smpl->ctx;
}

bool sample_backend_init(llama_sampler * smpl, ggml_backend_buffer_type_t buft, uint32_t /*n_outputs_max_per_seq*/) {
    auto * cfg = (sample_config *) smpl->ctx;
    cfg->on_backend = sample_supported(*cfg, buft);
    return cfg->on_backend;
}

void sample_backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph * gf, llama_sampler_data * data) {
    sample_build(ctx, gf, *(sample_config *) smpl->ctx, data);
}

void sample_backend_set_input(llama_sampler * smpl) {
    auto * cfg = (sample_config *) smpl->ctx;
    if (cfg->keys == nullptr) {
        return;
    }
    const int64_t R = cfg->keys->ne[1];
    std::vector<int32_t> buf((size_t) (2 * R), 0);
    for (int64_t r = 0; r < R && r < (int64_t) cfg->positions.size(); ++r) {
        const uint64_t key = tfm_sample_key(cfg->seed, cfg->positions[r]);
        buf[2 * r]     = (int32_t) (uint32_t) key;
        buf[2 * r + 1] = (int32_t) (uint32_t) (key >> 32);
    }
    ggml_backend_tensor_set(cfg->keys, buf.data(), 0, buf.size() * sizeof(int32_t));
}

void sample_backend_reset(llama_sampler * smpl) {
    auto * cfg = (sample_config *) smpl->ctx;
    cfg->rows_src = nullptr;
    cfg->keys     = nullptr;
    cfg->out      = nullptr;
}

llama_sampler_i sample_iface = {
    /* .name              = */ sample_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ sample_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ sample_clone,
    /* .free              = */ sample_free,
    /* .backend_init      = */ sample_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ sample_backend_apply,
    /* .backend_set_input = */ sample_backend_set_input,
    /* .backend_reset     = */ sample_backend_reset,
    /* .copy_state        = */ nullptr,
};

llama_sampler * sample_new(const sample_config & cfg) {
    auto * c = new sample_config{cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p, cfg.seed, cfg.n_vocab};
    return llama_sampler_init(&sample_iface, c);
}

} // namespace

uint64_t tfm_sample_key(uint64_t seed, int64_t pos) {
    return mix64(seed ^ mix64((uint64_t) pos + 0x9E3779B97F4A7C15ull));
}

int32_t tfm_sample_attach(llama_context * ctx, float temp, int32_t top_k, float top_p, float min_p, uint64_t seed,
                          int32_t n_rows) {
    if (ctx == nullptr || !(temp > 0.0f) || !std::isfinite(temp) || std::isnan(top_p) || std::isnan(min_p) || n_rows < 1) {
        return -1;
    }
    const int64_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    std::lock_guard<std::mutex> lock(attached_mutex);
    chain_detach(ctx);
    llama_sampler * smpl = sample_new(sample_config{temp, top_k, top_p, min_p, seed, n_vocab});
    return chain_attach(ctx, smpl, ((const sample_config *) smpl->ctx)->on_backend, ATTACHED_SAMPLE, n_rows) ? 1 : 0;
}

int32_t tfm_sample_set_seed(llama_context * ctx, uint64_t seed) {
    std::lock_guard<std::mutex> lock(attached_mutex);
    llama_sampler * smpl = attached_sampler(ctx, ATTACHED_SAMPLE);
    if (smpl == nullptr) {
        return -1;
    }
    ((sample_config *) smpl->ctx)->seed = seed; // read by sample_backend_set_input at every decode
    return 0;
}

int32_t tfm_sample_set_positions(llama_context * ctx, const int64_t * pos, int32_t n) {
    std::lock_guard<std::mutex> lock(attached_mutex);
    llama_sampler * smpl = attached_sampler(ctx, ATTACHED_SAMPLE);
    if (smpl == nullptr || n < 0 || (n > 0 && pos == nullptr)) {
        return -1;
    }
    auto * cfg = (sample_config *) smpl->ctx;
    cfg->positions.assign(pos, pos + n);
    return n;
}

int32_t tfm_sample_get(llama_context * ctx, int32_t i0, int32_t n, int32_t * ids, int32_t * n_kept) {
    ggml_tensor * out = nullptr;
    {
        std::lock_guard<std::mutex> lock(attached_mutex);
        llama_sampler * smpl = attached_sampler(ctx, ATTACHED_SAMPLE);
        if (smpl == nullptr || i0 < 0 || n < 0 || ids == nullptr) {
            return -1;
        }
        out = ((const sample_config *) smpl->ctx)->out;
    }
    if (out == nullptr || out->buffer == nullptr || (int64_t) i0 + n > out->ne[1]) {
        return -1;
    }
    llama_synchronize(ctx);
    std::vector<int32_t> buf((size_t) (2 * (i0 + n)));
    ggml_backend_tensor_get(out, buf.data(), 0, buf.size() * sizeof(int32_t));
    for (int32_t r = 0; r < n; ++r) {
        ids[r] = buf[2 * (i0 + r)];
        if (n_kept != nullptr) {
            n_kept[r] = buf[2 * (i0 + r) + 1];
        }
    }
    return n;
}

// ---------------------------------------------------------------------------------------------------
// The Weaver (Trees from Marginals; tfm_local/train/weaver.py is the reference, convert/weaver_gguf.py
// the file format). tfm_weaver_q computes q for a batch of paths in one graph on the CPU or the first
// GPU: prefix rows (each draft's target state at RoPE position 0, its drafter states at 1..D) and the
// steps of every path (position s + 1); a step attends to its own draft's prefix and to the earlier
// steps of its own path (the mask). The prefix's keys and values of every layer are computed once a
// tree (tfm_weaver_prefix) and kept on the backend; each round of the tree's heap then computes only its
// paths' steps (tfm_weaver_steps). The candidates' scores (drafter logit + <codes[c], q>) are the
// caller's: K rows of the codes table, on the host (the backend's copy serves DARTree only).

// the graph of one tfm_weaver_nodes_add row count (rows padded to a power of two up to TFM_WEAVER_PAD), kept
// with its own allocator so that a call only sets its inputs and computes
#define TFM_WEAVER_PAD 16
struct tfm_weaver_node_graph {
    ggml_context * ctx    = nullptr;
    ggml_gallocr_t galloc = nullptr;
    ggml_cgraph *  gf     = nullptr;
    ggml_tensor *  se = nullptr, * pos = nullptr, * mask = nullptr, * idx = nullptr, * res = nullptr;
    ~tfm_weaver_node_graph() {
        if (galloc != nullptr) {
            ggml_gallocr_free(galloc);
        }
        if (ctx != nullptr) {
            ggml_free(ctx);
        }
    }
};

// keys and values of every layer in a context and backend buffer of their own (a draft's prefix, a tree's
// node store): k[l] of shape k_ne, v[l] of shape v_ne, F32
struct tfm_weaver_kv {
    ggml_context *             ctx = nullptr;
    ggml_backend_buffer_t      buf = nullptr;
    std::vector<ggml_tensor *> k, v;

    bool alloc(ggml_backend_t backend, int32_t layers, const std::vector<int64_t> & k_ne, const std::vector<int64_t> & v_ne) {
        free();
        ggml_init_params pp = {(size_t) (2 * layers + 1) * ggml_tensor_overhead(), nullptr, true};
        if ((ctx = ggml_init(pp)) == nullptr) {
            return false;
        }
        for (int32_t l = 0; l < layers; ++l) {
            k.push_back(ggml_new_tensor(ctx, GGML_TYPE_F32, (int) k_ne.size(), k_ne.data()));
            v.push_back(ggml_new_tensor(ctx, GGML_TYPE_F32, (int) v_ne.size(), v_ne.data()));
        }
        if ((buf = ggml_backend_alloc_ctx_tensors(ctx, backend)) == nullptr) {
            free();
            return false;
        }
        return true;
    }

    void free() {
        if (buf != nullptr) {
            ggml_backend_buffer_free(buf);
        }
        if (ctx != nullptr) {
            ggml_free(ctx);
        }
        buf = nullptr;
        ctx = nullptr;
        k.clear();
        v.clear();
    }

    ~tfm_weaver_kv() { free(); }
};

struct tfm_dartree_graph;  // DARTree on the backend (API version 17), defined with its functions below
struct tfm_dartree_graph_free {
    void operator()(tfm_dartree_graph * g) const;
};

struct tfm_weaver {
    int32_t target_hidden = 0, drafter_hidden = 0, depth = 0, top_k = 0, width = 0, layers = 0, heads = 0,
            ffn = 0, rank = 0;
    ggml_tensor *               codes = nullptr;  // [rank, n_vocab] on the backend, read with the rest at load
    // tfm_weaver_attach_target: every token's step input (step_proj of the normed target embedding),
    // [width, n_vocab + 1] F32 (the last row a scratch row), and DARTree's graphs, one per shape: at most
    // TFM_DARTREE_GRAPHS of them, the least recently used freed first (a shape's last use in dartree_used)
    ggml_context *              table_ctx = nullptr;
    ggml_backend_buffer_t       table_buf = nullptr;
    ggml_tensor *               table = nullptr;
    int64_t                     n_vocab = 0;
    std::map<std::string, std::unique_ptr<tfm_dartree_graph, tfm_dartree_graph_free>> dartree_graphs;
    std::map<std::string, uint64_t> dartree_used;
    uint64_t                    dartree_clock = 0;
    float rope_theta = 10000.0f, eps = 1e-6f;
    ggml_context *              ctx_w   = nullptr;
    ggml_backend_t              backend = nullptr;
    ggml_backend_buffer_t       buf_w   = nullptr;
    ggml_gallocr_t              galloc  = nullptr;
    std::map<std::string, ggml_tensor *> w;
    // the prefix's keys and values of every layer (tfm_weaver_prefix), kept for the rounds of a tree
    int32_t                     n_drafts = 0;
    bool                        prefix_ok = false;  // the kept keys and values are a complete prefix
    tfm_weaver_kv               pkv;     // [hd, H, P] and [W, P] a layer
    uint64_t                    prefix_gen = 0;  // counts the prefixes computed (a node store belongs to one)
    // one draft's tree node by node (tfm_weaver_nodes_begin / tfm_weaver_nodes_add): each node's keys and
    // values of every layer in a store of max_nodes rows (+ TFM_WEAVER_PAD scratch rows for the padded
    // rows of a call), its parent and depth on the host, and a graph per padded row count, built once
    int32_t                     max_nodes = 0, n_nodes = 0;
    bool                        nodes_ok = false;
    uint64_t                    nodes_gen = 0;   // prefix_gen of the store's prefix
    std::vector<int32_t>        node_parent, node_depth;
    tfm_weaver_kv               nkv;     // [W, S] and [W, S] a layer
    std::map<int32_t, std::unique_ptr<tfm_weaver_node_graph>> node_graphs;

    void free_nodes() {
        node_graphs.clear();
        nkv.free();
        max_nodes = n_nodes = 0;
        nodes_ok = false;
        node_parent.clear();
        node_depth.clear();
    }

    void free_prefix() {
        node_graphs.clear();  // they read the prefix's tensors
        pkv.free();
        n_drafts = 0;
        prefix_ok = false;
    }

    void free_table() {
        dartree_graphs.clear();  // they read the table and the codes
        dartree_used.clear();
        if (table_buf != nullptr) {
            ggml_backend_buffer_free(table_buf);
        }
        if (table_ctx != nullptr) {
            ggml_free(table_ctx);
        }
        table_buf = nullptr;
        table_ctx = nullptr;
        table = nullptr;
        n_vocab = 0;
    }

    ~tfm_weaver() {
        free_table();
        free_nodes();
        free_prefix();
        if (galloc != nullptr) {
            ggml_gallocr_free(galloc);
        }
        if (buf_w != nullptr) {
            ggml_backend_buffer_free(buf_w);
        }
        if (backend != nullptr) {
            ggml_backend_free(backend);
        }
        if (ctx_w != nullptr) {
            ggml_free(ctx_w);
        }
    }

    ggml_tensor * get(const std::string & name) const {
        auto it = w.find(name);
        return it == w.end() ? nullptr : it->second;
    }
};

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

ggml_tensor * weaver_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

// NEOX RoPE of a Weaver layer's keys or queries [hd, H, n] at positions pos (the prefix and the steps alike)
ggml_tensor * weaver_rope(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * a, ggml_tensor * pos) {
    return ggml_rope_ext(ctx, a, pos, nullptr, W->width / W->heads, GGML_ROPE_TYPE_NEOX, 0, W->rope_theta,
                         1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
}

// a metadata-only context for one Weaver graph of at most n_nodes nodes (nullptr when out of memory)
std::unique_ptr<ggml_context, void (*)(ggml_context *)> weaver_graph_ctx(size_t n_nodes) {
    ggml_init_params params = {n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
    return {ggml_init(params), ggml_free};
}

// a step row's input: the token's target embedding [target_hidden, n] normalised and projected to [W, n]
ggml_tensor * weaver_step_in(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * se) {
    return ggml_mul_mat(ctx, W->get("step_proj.weight"), weaver_norm(ctx, se, W->get("step_norm.weight"), W->eps));
}

// layer l's queries and keys [hd, H, n] (RoPE at pos) and values [W, n] of rows x [W, n]
void weaver_qkv(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * pos,
                ggml_tensor *& q, ggml_tensor *& k, ggml_tensor *& v) {
    const int32_t H = W->heads, hd = W->width / H;
    const int64_t n = x->ne[1];
    auto L = [&](const char * name) { return W->get("blk." + std::to_string(l) + "." + name + ".weight"); };
    ggml_tensor * h = weaver_norm(ctx, x, L("attn_norm"), W->eps);
    q = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("q"), h), hd, H, n), pos);
    k = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("k"), h), hd, H, n), pos);
    v = ggml_mul_mat(ctx, L("v"), h);
}

// the rest of layer l for rows x [W, n]: attention of q [hd, H, n] over keys k [hd, H, Tk] and values
// v [W, Tk] under mask [Tk, n] (0 or -inf), the output projection, then the SwiGLU MLP; both residual
ggml_tensor * weaver_attend_mlp(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * q,
                                ggml_tensor * k, ggml_tensor * v, ggml_tensor * mask) {
    const int32_t Wd = W->width, H = W->heads, hd = Wd / H;
    const int64_t n = x->ne[1], Tk = k->ne[2];
    auto L = [&](const char * name) { return W->get("blk." + std::to_string(l) + "." + name + ".weight"); };
    ggml_tensor * kq = ggml_mul_mat(ctx, ggml_permute(ctx, k, 0, 2, 1, 3), ggml_permute(ctx, q, 0, 2, 1, 3));  // [Tk, n, H]
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / std::sqrt((float) hd), 0.0f);
    ggml_tensor * vt  = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, H, Tk), 1, 2, 0, 3));  // [Tk, hd, H]
    ggml_tensor * kqv = ggml_mul_mat(ctx, vt, kq);                                                         // [hd, n, H]
    ggml_tensor * o   = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3)), Wd, n);
    x = ggml_add(ctx, x, ggml_mul_mat(ctx, L("o"), o));
    ggml_tensor * m = weaver_norm(ctx, x, L("mlp_norm"), W->eps);
    ggml_tensor * g = ggml_silu(ctx, ggml_mul_mat(ctx, L("gate"), m));
    return ggml_add(ctx, x, ggml_mul_mat(ctx, L("down"), ggml_mul(ctx, g, ggml_mul_mat(ctx, L("up"), m))));
}

// q [rank, n] of the last layer's rows x [W, n]
ggml_tensor * weaver_q_out(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * x) {
    return ggml_mul_mat(ctx, W->get("out.weight"), weaver_norm(ctx, x, W->get("norm.weight"), W->eps));
}

// the prefix's keys [hd, H, P] and values [W, P] of every layer: the target states ht [target_hidden, n],
// then the drafter states hdr [drafter_hidden, n * depth], each row at RoPE position pos [P]
void weaver_prefix_kv(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * ht, ggml_tensor * hdr, ggml_tensor * pos,
                      std::vector<ggml_tensor *> & keys, std::vector<ggml_tensor *> & vals) {
    const int32_t H = W->heads, hd = W->width / H;
    ggml_tensor * t = ggml_mul_mat(ctx, W->get("target_proj.weight"), weaver_norm(ctx, ht, W->get("target_norm.weight"), W->eps));
    ggml_tensor * d = ggml_mul_mat(ctx, W->get("drafter_proj.weight"), weaver_norm(ctx, hdr, W->get("drafter_norm.weight"), W->eps));
    ggml_tensor * prefix = ggml_concat(ctx, t, d, 1);                                   // [W, P]
    const int64_t P = prefix->ne[1];
    keys.assign(W->layers, nullptr);
    vals.assign(W->layers, nullptr);
    for (int32_t l = 0; l < W->layers; ++l) {
        auto L = [&](const char * n) { return W->get("blk." + std::to_string(l) + "." + n + ".weight"); };
        ggml_tensor * p = weaver_norm(ctx, prefix, L("prefix_norm"), W->eps);
        keys[l] = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("k"), p), hd, H, P), pos);
        vals[l] = ggml_mul_mat(ctx, L("v"), p);
    }
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

// ---------------------------------------------------------------------------------------------------
// DARTree on the backend (API version 17; tfm_local/decode/tree.py build_dartree is the reference).
// One graph per shape (depth D, candidates K, live branches W, budget B, beta) builds the whole tree:
// the draft's prefix, then D rounds of the Weaver over the live branches (round 0 the root alone), each
// round's children scored (codes rows by get_rows, a product with q, plus the drafter's logits, a
// log-softmax over K, plus the parent's path score), the W best children chosen on the device as the next
// round's branches (their step inputs by get_rows from a table of every token's, their attention masks from
// their parents'), and at the end one top-B over every materialised child by path + beta * depth. The
// supertree's scores never leave the device: the host reads back each round's chosen children and the B
// selected nodes (tfm_weaver_dartree), and renumbers them (tfm_local/decode/weaver.py).

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
