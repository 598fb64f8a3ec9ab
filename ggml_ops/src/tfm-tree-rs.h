// tfm-local: tree mode of the Gated DeltaNet layers (qwen35, qwen35moe): graph pieces (patch 0006).
//
// When the ubatch is the pending draft tree (llama_memory_recurrent::tree_n, set by tfm_tree_set), a
// DeltaNet layer reads its conv and recurrent states as usual but does not advance them: every node sees
// the recurrence along its own root-to-node path (ggml_ssm_conv_tree, ggml_gated_delta_net_tree), and the
// layer stashes what the commit needs (the conv input, and u | gamma | k of the tree op) in persistent
// per-layer buffers of the memory. tfm_tree_commit (tfm-tree.cpp) then advances both states along the
// accepted path with ggml_ssm_conv_tree_commit / ggml_gated_delta_net_tree_commit. Shapes in ggml order
// (ne[0] first); one sequence (n_seqs = 1), N tree nodes.
#pragma once

#include "llama-graph.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <memory>

// The recurrent memory context behind a graph's memory context (hybrid or recurrent), or nullptr.
static inline const llama_memory_recurrent_context * tfm_tree_recr_ctx(const llama_memory_context_i * mctx) {
    if (const auto * h = dynamic_cast<const llama_memory_hybrid_context *>(mctx)) {
        return h->get_recr();
    }
    return dynamic_cast<const llama_memory_recurrent_context *>(mctx);
}

// Graph input holding the tree's parent indices, I32 [N, 1]. Every graph of a model with tree support
// has one, in plain mode too (n = 0, no tensor), so that a graph is never reused across the two modes
// or across trees of another size or another stash allocation.
class tfm_tree_input : public llm_graph_input_i {
public:
    tfm_tree_input(llama_memory_recurrent * mem, uint32_t n) : mem(mem), n(n), gen(mem->tree_gen) {}

    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        if (parent != nullptr) {
            GGML_ASSERT(mem->tree_parent.size() == n);
            ggml_backend_tensor_set(parent, mem->tree_parent.data(), 0, n*sizeof(int32_t));
            mem->tree_ran = true;
        }
    }

    bool can_reuse(const llm_graph_params & params) override {
        const auto * rc = tfm_tree_recr_ctx(params.mctx);
        return rc != nullptr && rc->get_mem() == mem && mem->tree_n(params.ubatch) == n &&
               (n == 0 || mem->tree_gen == gen);
    }

    llama_memory_recurrent * mem;
    uint32_t      n;                 // tree nodes (0: plain mode)
    uint32_t      gen;               // mem->tree_gen when built
    ggml_tensor * parent = nullptr;  // I32 [n, 1] when n > 0
};

// The graph's tree input (added on first use by the first DeltaNet layer).
static inline tfm_tree_input * tfm_tree_get_input(llm_graph_context & g, const llama_memory_recurrent_context * mctx) {
    for (auto & in : g.res->inputs) {
        if (auto * t = dynamic_cast<tfm_tree_input *>(in.get())) {
            return t;
        }
    }
    llama_memory_recurrent * mem = mctx->get_mem();
    const uint32_t n = mem->tree_n(g.ubatch);
    auto inp = std::make_unique<tfm_tree_input>(mem, n);
    if (n > 0) {
        GGML_ASSERT(n <= mem->tree_cap && "tree larger than the stash allocated by tfm_tree_set");
        inp->parent = ggml_new_tensor_2d(g.ctx0, GGML_TYPE_I32, n, 1);
        ggml_set_input(inp->parent);
        ggml_set_name(inp->parent, "tfm_tree_parent");
    }
    return (tfm_tree_input *) g.res->add_input(std::move(inp));
}

// Tree form of llm_build_delta_net_base::build_conv_state. qkv_mixed: [channels, N, 1]; returns
// conv_input [K-1+N, channels, 1] (conv state, then the node inputs), for ggml_ssm_conv_tree. The conv
// state is written back unchanged to the sequence's cell (it may have been read from another cell) and
// conv_input is stashed whole: it is the sx of ggml_ssm_conv_tree_commit.
static inline ggml_tensor * tfm_tree_conv_input(llm_graph_context & g, llm_graph_input_rs * inp,
        ggml_tensor * conv_states_all, ggml_tensor * qkv_mixed, int64_t K, int64_t channels, int il) {
    const auto * mctx = inp->mctx;
    ggml_context * ctx0 = g.ctx0;
    const int64_t n_embd_r = g.hparams.n_embd_r();

    ggml_tensor * conv_states = g.build_rs(inp, conv_states_all, n_embd_r, 1);                 // [n_embd_r, 1]
    ggml_build_forward_expand(g.gf, ggml_cpy(ctx0, conv_states,
        ggml_view_1d(ctx0, conv_states_all, n_embd_r, mctx->get_head()*conv_states_all->nb[1])));
    conv_states = ggml_reshape_3d(ctx0, conv_states, K - 1, channels, 1);                      // [K-1, channels, 1]

    ggml_tensor * conv_input = ggml_concat(ctx0, conv_states, ggml_transpose(ctx0, qkv_mixed), 0); // [K-1+N, channels, 1]
    g.cb(conv_input, "tree_conv_input", il);

    ggml_tensor * stash = mctx->get_mem()->tree_conv_l[il];
    GGML_ASSERT(stash != nullptr && ggml_nelements(conv_input) <= ggml_nelements(stash));
    ggml_build_forward_expand(g.gf, ggml_cpy(ctx0, conv_input, ggml_view_1d(ctx0, stash, ggml_nelements(conv_input), 0)));
    return conv_input;
}

// Tree form of llm_build_delta_net_base::build_recurrent_attn. q, k: [S_v, H_k, N, 1] (H_v % H_k == 0,
// tiled broadcast), v: [S_v, H_v, N, 1], g, beta: [1, H_v, N, 1], state: [S_v, S_v, H_v, 1] (read by
// build_rs). Returns o [S_v, H_v, N, 1]. The state is written back unchanged to the sequence's cell and
// u | gamma | k of the tree op ([S_v, H_v, N] | [1, H_v, N] | [S_v, H_k, N]) are stashed for the commit.
static inline ggml_tensor * tfm_tree_delta_net(llm_graph_context & g, llm_graph_input_rs * inp, tfm_tree_input * tree,
        ggml_tensor * ssm_states_all, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * gate,
        ggml_tensor * beta, ggml_tensor * state, int il) {
    ggml_context * ctx0 = g.ctx0;
    const int64_t S_v = v->ne[0];
    const int64_t H_v = v->ne[1];
    const int64_t N   = v->ne[2];
    GGML_ASSERT(v->ne[3] == 1 && N == (int64_t) tree->n && gate->ne[0] == 1);

    ggml_tensor * res = ggml_gated_delta_net_tree(ctx0, q, k, v, gate, beta, state, tree->parent); // [o | u | gamma | k]
    g.cb(res, "tree_gdn", il);

    const size_t  es = ggml_element_size(res);
    ggml_tensor * o  = ggml_view_4d(ctx0, res, S_v, H_v, N, 1, S_v*es, S_v*H_v*es, S_v*H_v*N*es, 0);

    llama_memory_recurrent * mem = inp->mctx->get_mem();
    ggml_tensor * stash = mem->tree_gdn_l[il];
    const int64_t n_tail = ggml_nelements(res) - S_v*H_v*N;  // u | gamma | k
    GGML_ASSERT(stash != nullptr && n_tail <= ggml_nelements(stash));
    mem->tree_hk_l[il] = k->ne[1];
    ggml_build_forward_expand(g.gf, ggml_cpy(ctx0, ggml_view_1d(ctx0, res, n_tail, S_v*H_v*N*es),
                                             ggml_view_1d(ctx0, stash, n_tail, 0)));

    const int64_t n_embd_s = g.hparams.n_embd_s();
    ggml_build_forward_expand(g.gf, ggml_cpy(ctx0, state,
        ggml_view_1d(ctx0, ssm_states_all, n_embd_s, inp->mctx->get_head()*ssm_states_all->nb[1])));
    return o;
}
