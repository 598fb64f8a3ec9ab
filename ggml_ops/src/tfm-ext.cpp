// tfm-local: C forwarders over llama-ext.h (see tfm-ext.h).
#include "tfm-ext.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"

#include <vector>

int32_t tfm_api_version(void) {
    return 2;
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
