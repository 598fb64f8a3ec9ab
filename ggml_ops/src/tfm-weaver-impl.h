// tfm-local: the Weaver's state and graph pieces, shared by tfm-weaver.cpp (load, q, node store),
// tfm-weaver-graph.cpp (the layers as ggml graph pieces) and tfm-dartree.cpp (DARTree); internal to
// libllama (the C API is tfm-weaver.h).
//
// The Weaver (Trees from Marginals; tfm_local/train/weaver.py is the reference, convert/weaver_gguf.py
// the file format). tfm_weaver_q computes q for a batch of paths in one graph on the CPU or the first
// GPU: prefix rows (each draft's target state at RoPE position 0, its drafter states at 1..D) and the
// steps of every path (position s + 1); a step attends to its own draft's prefix and to the earlier
// steps of its own path (the mask). The prefix's keys and values of every layer are computed once a
// tree (tfm_weaver_prefix) and kept on the backend; each round of the tree's heap then computes only its
// paths' steps (tfm_weaver_steps). The candidates' scores (drafter logit + <codes[c], q>) are the
// caller's: K rows of the codes table, on the host (the backend's copy serves DARTree only).
#pragma once

#include "tfm-weaver.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

struct tfm_dartree_graph;  // DARTree on the backend, defined in tfm-dartree.cpp
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

namespace tfm {

// a metadata-only context for one Weaver graph of at most n_nodes nodes (nullptr when out of memory)
std::unique_ptr<ggml_context, void (*)(ggml_context *)> weaver_graph_ctx(size_t n_nodes);

// a step row's input: the token's target embedding [target_hidden, n] normalised and projected to [W, n]
ggml_tensor * weaver_step_in(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * se);

// layer l's queries and keys [hd, H, n] (RoPE at pos) and values [W, n] of rows x [W, n]
void weaver_qkv(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * pos,
                ggml_tensor *& q, ggml_tensor *& k, ggml_tensor *& v);

// the rest of layer l for rows x [W, n]: attention of q [hd, H, n] over keys k [hd, H, Tk] and values
// v [W, Tk] under mask [Tk, n] (0 or -inf), the output projection, then the SwiGLU MLP; both residual
ggml_tensor * weaver_attend_mlp(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * q,
                                ggml_tensor * k, ggml_tensor * v, ggml_tensor * mask);

// q [rank, n] of the last layer's rows x [W, n]
ggml_tensor * weaver_q_out(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * x);

// the prefix's keys [hd, H, P] and values [W, P] of every layer: the target states ht [target_hidden, n],
// then the drafter states hdr [drafter_hidden, n * depth], each row at RoPE position pos [P]
void weaver_prefix_kv(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * ht, ggml_tensor * hdr, ggml_tensor * pos,
                      std::vector<ggml_tensor *> & keys, std::vector<ggml_tensor *> & vals);

} // namespace tfm
