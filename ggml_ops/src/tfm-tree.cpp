// tfm-local: tree mode of tfm-ext.h (tfm_tree_set, tfm_tree_commit): a draft tree decoded in one batch,
// then the accepted path kept. The attention KV caches mask and free the tree's cells (patch 0003); the
// conv and recurrent states of a hybrid's Gated DeltaNet layers are stashed during the tree batch
// (tfm-tree-rs.h, patch 0006) and advanced along the accepted path here by a small ggml graph.
#include "tfm-ext.h"
#include "llama-context.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"
#include "llama-model.h"

#include "ggml-cpp.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <map>
#include <vector>

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
