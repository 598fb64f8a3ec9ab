// tfm-local: C forwarders over llama-ext.h, and a backend top-k sampler (see tfm-ext.h).
#include "tfm-ext.h"
#include "llama-context.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

int32_t tfm_api_version(void) {
    return 4;
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

// every attention KV cache of the context's memory (one, or base + SWA)
static std::vector<llama_kv_cache *> attention_caches(llama_context * ctx) {
    llama_memory_i * mem = llama_get_memory(ctx);
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        return {kv};
    }
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return {iswa->get_base(), iswa->get_swa()};
    }
    return {};
}

bool tfm_tree_set(llama_context * ctx, const int32_t * parents, uint32_t n_nodes) {
    const auto caches = attention_caches(ctx);
    for (auto * kv : caches) {
        kv->tree_set(parents, parents ? n_nodes : 0);
    }
    return !caches.empty();
}

bool tfm_tree_commit(llama_context * ctx, const int32_t * keep, uint32_t n_keep) {
    const auto caches = attention_caches(ctx);
    bool ok = !caches.empty();
    for (auto * kv : caches) {
        ok = kv->tree_commit(keep, n_keep) && ok;
    }
    return ok;
}

// -- backend top-k log-probabilities ------------------------------------------------------
//
// A llama_sampler whose backend interface adds, per output row, a full-vocabulary softmax and
// a top-k to the decode graph; llama.cpp (build_sampling) calls backend_apply once per output
// row with a view of that row's logits and copies the k ids and k log-probs it returns.

namespace {

struct topk_config {
    int32_t k;          // candidates per row
    int64_t n_vocab;    // row length (for the support probe)
    bool    on_backend; // verdict of backend_init
};

// One row's graph: ids = top-k of the logits x, and their log-probs x_i - lse with
// lse = x_a - log p_a at the most likely candidate a (p = softmax over the full row).
// Taking lse there keeps log-probs exact for candidates whose p underflows float32.
void topk_build(ggml_context * ctx, const topk_config & cfg, llama_sampler_data * data) {
    ggml_tensor * x = ggml_reshape_1d(ctx, data->logits, ggml_nelements(data->logits));
    const int64_t n = x->ne[0];
    const int     k = (int) std::min<int64_t>(cfg.k, n);

    ggml_tensor * ids = ggml_top_k(ctx, x, k);                                   // [k] unordered
    ggml_tensor * p   = ggml_soft_max(ctx, x);                                   // [n]
    ggml_tensor * xk  = ggml_get_rows(ctx, ggml_reshape_2d(ctx, x, 1, n), ids);  // [1, k]
    ggml_tensor * pk  = ggml_get_rows(ctx, ggml_reshape_2d(ctx, p, 1, n), ids);  // [1, k]
    ggml_tensor * a   = ggml_argmax(ctx, ggml_reshape_2d(ctx, pk, k, 1));        // [1]
    ggml_tensor * lse = ggml_sub(ctx, ggml_get_rows(ctx, xk, a),
                                 ggml_log(ctx, ggml_get_rows(ctx, pk, a)));       // [1, 1]
    ggml_set_name(ids, "tfm_topk_ids");

    data->logits = ggml_sub(ctx, xk, lse);
    ggml_set_name(data->logits, "tfm_topk_logp");
    data->candidates = data->candidates
        ? ggml_get_rows(ctx, ggml_reshape_2d(ctx, data->candidates, 1, n), ids)
        : ids;
}

// True when the device behind buft runs every op of topk_build on a full-vocabulary row.
bool topk_supported(const topk_config & cfg, ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr) {
        return true; // plain host memory: the CPU backend runs these ops
    }
    const size_t max_nodes = 64;
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
    llama_sampler_data data = { ggml_new_tensor_1d(ctx, GGML_TYPE_F32, cfg.n_vocab), nullptr, nullptr, nullptr };
    topk_build(ctx, cfg, &data);
    ggml_build_forward_expand(gf, data.logits);
    ggml_build_forward_expand(gf, data.candidates);
    bool ok = true;
    for (int i = 0; ok && i < ggml_graph_n_nodes(gf); ++i) {
        ok = ggml_backend_dev_supports_op(dev, ggml_graph_node(gf, i));
    }
    ggml_free(ctx);
    return ok;
}

const char * topk_name(const llama_sampler * /*smpl*/) {
    return "tfm-topk";
}

// Host form (llama_sampler_apply): keep the k best candidates, sorted, logit := log-prob.
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
    const float  lse = m + (float) std::log(s);
    const size_t k   = std::min<size_t>((size_t) cfg->k, cur_p->size);
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

void topk_backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph * /*gf*/, llama_sampler_data * data) {
    topk_build(ctx, *(const topk_config *) smpl->ctx, data);
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
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

llama_sampler * topk_new(int32_t k, int64_t n_vocab) {
    return llama_sampler_init(&topk_iface, new topk_config{k, n_vocab, false});
}

// The sampler chain attached to each context by tfm_topk_attach (llama.cpp keeps a raw pointer).
std::mutex                                 topk_mutex;
std::map<const llama_context *, llama_sampler *> topk_chains;

// Detach and free ctx's chain, if any; the caller holds topk_mutex.
void topk_detach(llama_context * ctx) {
    auto it = topk_chains.find(ctx);
    if (it == topk_chains.end()) {
        return;
    }
    llama_set_sampler(ctx, 0, nullptr);
    llama_sampler_free(it->second);
    topk_chains.erase(it);
}

// k of ctx's attached sampler, 0 when none; the caller holds topk_mutex.
int32_t topk_attached_k(const llama_context * ctx) {
    auto it = topk_chains.find(ctx);
    if (it == topk_chains.end()) {
        return 0;
    }
    return ((const topk_config *) llama_sampler_chain_get(it->second, 0)->ctx)->k;
}

} // namespace

int32_t tfm_topk_attach(llama_context * ctx, int32_t k, int32_t n_rows) {
    const int64_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    if (k < 0 || k > n_vocab || n_rows < 1) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(topk_mutex);
    topk_detach(ctx);
    if (k == 0) {
        return 0;
    }
    ctx->set_n_outputs_max_per_seq((uint32_t) n_rows);
    auto params = llama_sampler_chain_default_params();
    params.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(params);
    llama_sampler * smpl  = topk_new(k, n_vocab);
    llama_sampler_chain_add(chain, smpl);
    // set_sampler runs backend_init (our support probe) but accepts the chain either way
    if (!llama_set_sampler(ctx, 0, chain) || !((const topk_config *) smpl->ctx)->on_backend) {
        llama_set_sampler(ctx, 0, nullptr);
        llama_sampler_free(chain);
        return 0;
    }
    topk_chains[ctx] = chain;
    return 1;
}

int32_t tfm_topk_get(llama_context * ctx, int32_t i0, int32_t n, int32_t k, int32_t * ids, float * logp) {
    {
        std::lock_guard<std::mutex> lock(topk_mutex);
        if (k < 1 || topk_attached_k(ctx) != k || i0 < 0 || n < 0) {
            return -1;
        }
    }
    std::vector<std::pair<float, int32_t>> row((size_t) k);
    for (int32_t r = 0; r < n; ++r) {
        const int32_t i = i0 + r;
        if (llama_get_sampled_candidates_count_ith(ctx, i) != (uint32_t) k ||
            llama_get_sampled_logits_count_ith(ctx, i) != (uint32_t) k) {
            return -1;
        }
        const llama_token * cand = llama_get_sampled_candidates_ith(ctx, i);
        const float       * lp   = llama_get_sampled_logits_ith(ctx, i);
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

// -- test entry point of the tree ops (patch 0005) ----------------------------------------------

namespace {

// the op's result tensor for the given sources (argument order as in tfm-ext.h), or nullptr
ggml_tensor * test_op_build(ggml_context * ctx, int32_t op, const std::vector<ggml_tensor *> & s, int32_t iparam) {
    const size_t n = s.size();
    switch (op) {
        case TFM_OP_GDN:
            return n == 6 ? ggml_gated_delta_net(ctx, s[0], s[1], s[2], s[3], s[4], s[5], 1) : nullptr;
        case TFM_OP_GDN_TREE:
            return n == 7 ? ggml_gated_delta_net_tree(ctx, s[0], s[1], s[2], s[3], s[4], s[5], s[6]) : nullptr;
        case TFM_OP_GDN_COMMIT:
            return n == 5 ? ggml_gated_delta_net_tree_commit(ctx, s[0], s[1], s[2], s[3], s[4]) : nullptr;
        case TFM_OP_CONV:
            return n == 2 ? ggml_ssm_conv(ctx, s[0], s[1]) : nullptr;
        case TFM_OP_CONV_TREE:
            return n == 3 ? ggml_ssm_conv_tree(ctx, s[0], s[1], s[2]) : nullptr;
        case TFM_OP_CONV_COMMIT:
            return n == 2 ? ggml_ssm_conv_tree_commit(ctx, s[0], s[1], iparam) : nullptr;
        default:
            return nullptr;
    }
}

} // namespace

int32_t tfm_test_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                    const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                    float * out, int64_t out_n) {
    if (n_src < 1 || n_src > GGML_MAX_SRC || src == nullptr || ne == nullptr || types == nullptr || out == nullptr) {
        return -1;
    }
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(device == 0 ? GGML_BACKEND_DEVICE_TYPE_CPU
                                                                   : GGML_BACKEND_DEVICE_TYPE_GPU);
    if (dev == nullptr || device < 0 || device > 1) {
        return -2;
    }

    ggml_init_params params = {
        /*.mem_size   =*/ (size_t) (n_src + 1) * ggml_tensor_overhead() + ggml_graph_overhead_custom(8, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        return -1;
    }
    std::vector<ggml_tensor *> srcs;
    for (int32_t i = 0; i < n_src; ++i) {
        if (types[i] != 0 && types[i] != 1) {
            ggml_free(ctx);
            return -1;
        }
        srcs.push_back(ggml_new_tensor_4d(ctx, types[i] == 0 ? GGML_TYPE_F32 : GGML_TYPE_I32,
                                          ne[4*i], ne[4*i + 1], ne[4*i + 2], ne[4*i + 3]));
    }
    ggml_tensor * res = test_op_build(ctx, op, srcs, iparam);
    if (res == nullptr || res->type != GGML_TYPE_F32 || ggml_nelements(res) != out_n) {
        ggml_free(ctx);
        return -1;
    }
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 8, false);
    ggml_build_forward_expand(gf, res);

    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    if (backend == nullptr) {
        ggml_free(ctx);
        return -2;
    }
    int32_t rc = 0;
    ggml_backend_buffer_t buf = nullptr;
    if (!ggml_backend_supports_op(backend, res)) {
        rc = -3;
    } else if ((buf = ggml_backend_alloc_ctx_tensors(ctx, backend)) == nullptr) {
        rc = -1;
    } else {
        if (device == 0) {
            auto * set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
                ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
            if (set_threads != nullptr) {
                set_threads(backend, std::max(1, n_threads));
            }
        }
        for (int32_t i = 0; i < n_src; ++i) {
            ggml_backend_tensor_set(srcs[i], src[i], 0, ggml_nbytes(srcs[i]));
        }
        const std::vector<float> poison((size_t) out_n, NAN);
        ggml_backend_tensor_set(res, poison.data(), 0, ggml_nbytes(res));
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            rc = -1;
        } else {
            ggml_backend_tensor_get(res, out, 0, ggml_nbytes(res));
        }
    }
    if (buf != nullptr) {
        ggml_backend_buffer_free(buf);
    }
    ggml_backend_free(backend);
    ggml_free(ctx);
    return rc;
}
