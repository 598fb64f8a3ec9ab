// tfm-local: what the two backend samplers (tfm-topk.cpp, tfm-sample.cpp) share (tfm-sampler-chain.h): the
// logits-row helpers, the support probe, and the registry of the sampler chain attached to sequence 0 of
// each context (llama.cpp keeps a raw pointer to it; this file owns it).
#include "tfm-sampler-chain.h"
#include "llama-context.h"

#include <map>

namespace tfm {

// (each function is described in tfm-sampler-chain.h)

int64_t batch_rows(const ggml_tensor * src) {
    const bool padded = src->op == GGML_OP_PAD && src->ne[1] >= 2 && src->src[0] != nullptr &&
                        src->src[0]->ne[1] == src->ne[1] - 1;
    return padded ? src->ne[1] - 1 : src->ne[1];
}

ggml_tensor * unpadded(const ggml_tensor * src) {
    return const_cast<ggml_tensor *>(batch_rows(src) < src->ne[1] ? src->src[0] : src);
}

const ggml_tensor * row_source(const llama_sampler_data * data) {
    const ggml_tensor * row = data->logits;
    const ggml_tensor * src = row->view_src;
    const bool ok = src != nullptr && data->candidates == nullptr && src->type == GGML_TYPE_F32 &&
                    ggml_n_dims(row) == 1 && row->ne[0] == src->ne[0] && ggml_is_contiguous(src) &&
                    row->view_offs % src->nb[1] == 0;
    return ok ? src : nullptr;
}

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

std::mutex attached_mutex;

namespace {

struct attached_chain {
    llama_sampler * chain;
    attached_kind   kind;
};

// the chain of each context that has one
std::map<const llama_context *, attached_chain> attached_chains;

} // namespace

void chain_detach(llama_context * ctx) {
    auto it = attached_chains.find(ctx);
    if (it == attached_chains.end()) {
        return;
    }
    llama_set_sampler(ctx, 0, nullptr);
    llama_sampler_free(it->second.chain);
    attached_chains.erase(it);
}

llama_sampler * attached_sampler(const llama_context * ctx, attached_kind kind) {
    auto it = attached_chains.find(ctx);
    if (it == attached_chains.end() || it->second.kind != kind) {
        return nullptr;
    }
    return llama_sampler_chain_get(it->second.chain, 0);
}

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

} // namespace tfm
