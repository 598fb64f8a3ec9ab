// tfm-local: the C API over llama.cpp internals that the Python driver binds (tfm_local/llama/native.py).
//
// Stable C names that cffi binds in ABI mode: forwarders over llama-ext.h, whose C++ linkage gives
// mangled names that differ per compiler (tfm-forward.cpp), tree mode (tfm-tree.cpp), the backend top-k
// sampler (tfm-topk.cpp) and the backend token sampler (tfm-sample.cpp). tfm_api_version() lets the
// Python side refuse a library built from another patch series; it covers this header and the op
// test/bench harness of tfm-op-harness.h (tfm_test_op, tfm_bench_op: tests and benchmarks only). The
// Weaver and DARTree are a unit of their own, with their own version: tfm-weaver.h.
#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Version of this API; bumped whenever a function is added, changed or removed (19: the Weaver's
// functions moved to tfm-weaver.h).
LLAMA_API int32_t tfm_api_version(void);

// Turn on/off the extraction of the input of layer `il` (the residual stream
// entering block il) for every token of the following batches.
// Call before the first decode of the context: it forces a scheduler reserve.
LLAMA_API void tfm_set_layer_inp(struct llama_context * ctx, uint32_t il, bool value);

// Input features of layer `il` for every token of the last batch, row-major
// [n_tokens, n_embd] float32, or NULL when extraction is off for that layer.
LLAMA_API const float * tfm_get_layer_inp(struct llama_context * ctx, uint32_t il);

// Layer-input indices a DFlash drafter reads from its target (GGUF key
// dflash.target_layers); *n receives their count. NULL for other models.
LLAMA_API const int32_t * tfm_model_target_layers(const struct llama_model * model, uint32_t * n);

// DFlash2 selector top-k (0 when the drafter has no path selector).
LLAMA_API int32_t tfm_model_selector_top_k(const struct llama_model * model);

// DFlash2 (API version 16). tfm_lattice_enable: copy the path selector's lattice of every following
// token batch to the host (llama_set_embeddings_nextn, one row per token, not only the output rows).
// tfm_lattice_get: the lattice of the last token batch, [n_tokens, n_embd] float32, or NULL when off.
// Row j of a block [anchor, MASK, ...] (the pinned src/models/dflash.cpp, build_dflash2_selector):
// row 0 zeros; row j >= 1: the K candidate ids of block position j (the drafter's top-K by logit, in
// no particular order, as floats),
// then K x K scores, predecessor-major: score[p*K + s] = the score of candidate s at position j after
// candidate p of position j-1 (row 1: after the anchor, the K rows equal). K = tfm_model_selector_top_k.
LLAMA_API void tfm_lattice_enable(struct llama_context * ctx, bool on);
LLAMA_API const float * tfm_lattice_get(struct llama_context * ctx);

// Batch filling in one call (API version 9; the per-token llama_batch_ext_* calls cost ~2 us each
// from Python). Both clear the batch first.
// tfm_batch_tokens: n tokens, token i at position pos[i] in sequence seq_ids[i] (seq_ids NULL: 0),
// an output row when outputs[i] != 0 (outputs NULL: every token).
// tfm_batch_embd: n embedding rows of sequence 0, row i = rows[i*width .. +width) (copied into the
// batch) at position pos0 + i.
// Return n, or the negative code of llama_batch_ext_add_token / _add_embd for the first entry it
// refused (-1 batch full, -2 invalid token or embedding, -3 invalid sequence), -4 on bad arguments
// or a refused position or output flag.
LLAMA_API int32_t tfm_batch_tokens(struct llama_batch_ext * batch, int32_t n, const int32_t * tokens,
                                   const int32_t * pos, const int32_t * seq_ids, const int8_t * outputs);
LLAMA_API int32_t tfm_batch_embd(struct llama_batch_ext * batch, int32_t n, const float * rows, int32_t width,
                                 int32_t pos0);

// Tree mode (single sequence). Declare that the next decode is a draft tree of n_nodes
// tokens: node i at position P + depth(i), parents[i] < i (-1 = child of the committed
// prefix, i.e. a root); each node attends to the committed cells and to its ancestors only.
// The tree must fit in one ubatch. parents = NULL or n_nodes = 0 clears tree mode.
// Hybrid memories (attention + Gated DeltaNet layers; qwen35, qwen35moe, qwen3next): the recurrent
// layers run the tree ops of patch 0005 (every node sees the recurrence along its own path; the conv and
// recurrent states are not advanced) and stash per layer what tfm_tree_commit needs (patch 0006).
// Returns false when the context's memory has no attention KV cache, on a parent outside -1..i-1, for a
// hybrid of another architecture or with n_rs_seq > 0, or when the stash cannot be allocated.
LLAMA_API bool tfm_tree_set(struct llama_context * ctx, const int32_t * parents, uint32_t n_nodes);

// After a tree decode: keep the KV cells of nodes keep[0..n_keep) (the accepted root-to-node
// path) and free every other node's cell by cell index, so that the cache holds exactly what
// decoding the path alone would have stored. Clears tree mode. Returns false on a bad index.
// Hybrid memories: keep must be a root-to-node path, root first (parent[keep[0]] = -1, parent[keep[m]]
// = keep[m-1]); the conv and recurrent states of sequence 0 are then advanced along it by a small ggml
// graph on the context's backend for their buffers (ggml_ssm_conv_tree_commit,
// ggml_gated_delta_net_tree_commit on the stashed tree values: no model re-run, no host copy), and the
// recurrent cell's position becomes the path's last. n_keep = 0 leaves the states as they were.
LLAMA_API bool tfm_tree_commit(struct llama_context * ctx, const int32_t * keep, uint32_t n_keep);

// Backend top-k log-probabilities (sequence 0; meant for the DFlash drafter's block rows).
// Attach to ctx a backend sampler that, for every output row of the following token batches,
// computes inside the ggml graph (on the device that holds the logits) the full-vocabulary
// log-softmax and the k most likely tokens, so only k ids + k floats per row reach the host;
// the raw logits of sequence 0 are then no longer copied. A batch may have at most n_rows
// output rows (patch 0004 raises llama.cpp's per-sequence limit, 1 by default, to n_rows).
// k = 0 detaches (raw logits again). Changing k re-attaches (a scheduler reserve at the next
// decode). Returns 1 when attached, 0 when the backend cannot run the ops (nothing attached:
// use the host path), -1 for k outside 0..n_vocab or n_rows < 1. k = 1 is a greedy argmax: its
// "log-prob" is the argmax's raw logit (no softmax over the row is computed).
LLAMA_API int32_t tfm_topk_attach(struct llama_context * ctx, int32_t k, int32_t n_rows);

// After a token batch decoded with the top-k sampler attached: the top-k of batch rows
// i0 .. i0+n-1 (every row must have been an output), each row sorted by descending log-prob
// (ties by ascending id). ids / logp receive n*k values, row-major; k must be the attached
// sampler's. One synchronisation, and one device-to-host copy per result tensor when the batch's
// rows were one logits matrix (every row an output). Returns k, or -1 when no sampler with this k
// is attached or a row has no result.
LLAMA_API int32_t tfm_topk_get(struct llama_context * ctx, int32_t i0, int32_t n, int32_t k,
                               int32_t * ids, float * logp);

// Backend token sampling (API version 11; the op of patch 0011): attaches to sequence 0 of ctx a
// sampler that computes, inside the ggml graph, one token per output row drawn from the row's
// processed distribution (ggml_sample_tokens: top-k, top-p, min-p, then temperature temp > 0; top_k
// <= 0, top_p >= 1, min_p <= 0 switch a filter off) with Gumbel noise keyed by
// tfm_sample_key(seed, position) per row and the token id. Only two ints per row reach the host
// (tfm_sample_get); the raw logits of sequence 0 are no longer copied. A batch may have at most
// n_rows output rows. Replaces whatever tfm_topk_attach or tfm_sample_attach attached
// (tfm_topk_attach(ctx, 0, 1) detaches either). Returns 1 when attached, 0 when the backend cannot
// run the op (nothing attached), -1 for bad arguments (temp not finite and > 0, NaN top_p / min_p,
// n_rows < 1).
LLAMA_API int32_t tfm_sample_attach(struct llama_context * ctx, float temp, int32_t top_k, float top_p,
                                    float min_p, uint64_t seed, int32_t n_rows);

// The seed of the attached token sampler's draws from the next batch on (API version 15): the keys are
// a graph input (tfm_sample_key(seed, position) per row), so unlike tfm_sample_attach this changes no
// graph and costs llama.cpp no scheduler reserve (a new random seed per request re-attached the sampler:
// ~8 ms on the H200 before the prompt's first token). Returns 0, or -1 when no token sampler is attached.
LLAMA_API int32_t tfm_sample_set_seed(struct llama_context * ctx, uint64_t seed);

// The positions the next batch's output rows draw their tokens for (row r's token is the one at
// position pos[r]); rows beyond n get key 0. Kept until set again. Returns n, or -1 when no token
// sampler is attached.
LLAMA_API int32_t tfm_sample_set_positions(struct llama_context * ctx, const int64_t * pos, int32_t n);

// After a batch decoded with the token sampler attached: the tokens of output rows i0 .. i0+n-1 (the
// batch's outputs in order, not its token indices)
// into ids, and (when n_kept is not NULL) the size of each row's kept set. Waits for the batch
// (llama_synchronize). Returns n, or -1 when no token sampler is attached, nothing was decoded with
// it, or the rows are out of range.
LLAMA_API int32_t tfm_sample_get(struct llama_context * ctx, int32_t i0, int32_t n, int32_t * ids, int32_t * n_kept);

// The 64-bit key of the draw for position pos under seed: splitmix64's output function of
// seed XOR (that function of pos + 0x9E3779B97F4A7C15).
LLAMA_API uint64_t tfm_sample_key(uint64_t seed, int64_t pos);

// Graph reuse for a context that alternates batches without outputs and batches with outputs
// (API version 10; patch 0010; meant for the DFlash drafter: KV injection, then the block pass).
// llama.cpp keeps the last graph of each kind but reuses one only if it is the last graph its
// scheduler allocated, so such a context rebuilds and re-allocates both graphs at every step.
// on = true gives the graphs without outputs a second scheduler of their own (a second compute
// buffer, grown to the largest such batch), so both graphs stay allocated and are reused while
// their shape holds; on = false frees it. Returns whether the switch is now on as asked (false:
// the context has no backends). Counted reuses: llama_perf_context(ctx).n_reused.
LLAMA_API bool tfm_context_keep_graphs(struct llama_context * ctx, bool on);

#ifdef __cplusplus
}
#endif
