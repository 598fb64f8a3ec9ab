// tfm-local: what the two backend samplers of tfm-ext.h (tfm-topk.cpp, tfm-sample.cpp) share, internal to
// libllama: the rows of the logits matrix a sampler's row view points into, the support probe, and the
// one sampler chain that tfm_topk_attach or tfm_sample_attach attaches to sequence 0 of a context.
// Defined in tfm-sampler-chain.cpp.
#pragma once

#include "llama.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>

namespace tfm {

// Rows of a logits matrix without the row of zeros llama.cpp appends to it (build_sampling pads the
// logits with one row to keep a one-output graph static).
int64_t batch_rows(const ggml_tensor * src);

// The logits matrix without llama.cpp's pad row: the pad's own source when src is that pad, else src.
// Ops built over it leave the pad out of the graph (on the CPU the pad is a copy of the whole matrix
// with per-element indexing: ~1 ms a plain step of the 1.5B target's 151,936 logits on the 2-core
// development CPU, docs/cpu.md).
ggml_tensor * unpadded(const ggml_tensor * src);

// The logits matrix data->logits is a row view of, or nullptr when it is not one.
const ggml_tensor * row_source(const llama_sampler_data * data);

// True when the device behind buft runs every op that build adds to a graph (of at most 128 nodes,
// in a context without data): the support probe of the backend samplers.
bool device_runs(ggml_backend_buffer_type_t buft, const std::function<void(ggml_context *, ggml_cgraph *)> & build);

// Which sampler a context's attached chain holds.
enum attached_kind { ATTACHED_TOPK, ATTACHED_SAMPLE };

// Held by every caller of the three functions below (and while reading an attached sampler's state).
extern std::mutex attached_mutex;

// Detach and free ctx's chain, if any.
void chain_detach(llama_context * ctx);

// The first sampler of ctx's chain when it is of this kind, else nullptr.
llama_sampler * attached_sampler(const llama_context * ctx, attached_kind kind);

// Attach smpl (in a new chain) on sequence 0 for batches of up to n_rows output rows; false (nothing
// attached, smpl freed) when the backend cannot run it (on_backend: backend_init's verdict, read after
// llama_set_sampler has run it).
bool chain_attach(llama_context * ctx, llama_sampler * smpl, const bool & on_backend, attached_kind kind, int32_t n_rows);

} // namespace tfm
