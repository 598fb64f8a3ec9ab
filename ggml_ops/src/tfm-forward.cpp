// tfm-local: the C forwarders of tfm-ext.h over llama-ext.h (C++ linkage there, stable C names here) and
// tfm_api_version: layer-input features, the DFlash drafter's target layers and selector lattice, batch
// filling in one call, graph keeping. Tree mode is in tfm-tree.cpp, the backend samplers in tfm-topk.cpp
// and tfm-sample.cpp.
#include "tfm-ext.h"
#include "llama-context.h"
#include "llama-ext.h"

int32_t tfm_api_version(void) {
    return 19;
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
