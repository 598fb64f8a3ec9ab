// tfm-local: the backend token sampler of tfm-ext.h (tfm_sample_attach, tfm_sample_set_seed,
// tfm_sample_set_positions, tfm_sample_get, tfm_sample_key): one token per output row drawn in the decode
// graph by ggml_sample_tokens (patch 0011), so that two ints a row reach the host.
#include "tfm-ext.h"
#include "tfm-sampler-chain.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cmath>
#include <mutex>
#include <vector>

using tfm::ATTACHED_SAMPLE;
using tfm::attached_mutex;
using tfm::attached_sampler;
using tfm::chain_attach;
using tfm::chain_detach;
using tfm::device_runs;
using tfm::row_source;
using tfm::unpadded;

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
