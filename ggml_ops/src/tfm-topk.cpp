// tfm-local: the backend top-k sampler of tfm-ext.h (tfm_topk_attach, tfm_topk_get): the k most likely
// tokens of every output row and their log-probabilities computed in the decode graph, on the device that
// holds the logits, so that only k ids and k floats a row reach the host.
#include "tfm-ext.h"
#include "tfm-sampler-chain.h"
#include "llama-context.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

using tfm::ATTACHED_TOPK;
using tfm::attached_mutex;
using tfm::attached_sampler;
using tfm::batch_rows;
using tfm::chain_attach;
using tfm::chain_detach;
using tfm::device_runs;
using tfm::row_source;
using tfm::unpadded;

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
size_t row_index(const ggml_tensor * row, const ggml_tensor * src) {
    return row->view_offs / src->nb[1];
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

// k of ctx's attached top-k sampler, 0 when none; the caller holds attached_mutex.
int32_t topk_attached_k(const llama_context * ctx) {
    const llama_sampler * smpl = attached_sampler(ctx, ATTACHED_TOPK);
    return smpl == nullptr ? 0 : ((const topk_config *) smpl->ctx)->k;
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
