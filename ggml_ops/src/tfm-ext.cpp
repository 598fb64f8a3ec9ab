// tfm-local: C forwarders over llama-ext.h (see tfm-ext.h).
#include "tfm-ext.h"
#include "llama-ext.h"

int32_t tfm_api_version(void) {
    return 1;
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
