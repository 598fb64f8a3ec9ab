// tfm-local: a small C API over llama.cpp internals that the Python driver needs.
//
// llama-ext.h exposes these with C++ linkage (mangled names that differ per
// compiler); this header gives them stable C names that cffi can bind in ABI
// mode. Every function here is a thin forwarder; tfm_api_version() lets the
// Python side refuse a library built from another patch series. The op test/bench harness that the
// tests and benchmarks bind as well (tfm_test_op, tfm_bench_op) is declared in tfm-op-harness.h.
#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Version of this API; bumped whenever a function is added or changed.
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

// The Weaver (Trees from Marginals; API versions 12, 13, 14). tfm_weaver_load reads a Weaver GGUF (architecture
// tfm-weaver, tfm_convert.weaver_gguf) onto the CPU (device 0, n_threads threads) or the first GPU
// (device 1), every tensor (the codes table, read there for DARTree's use only, below); NULL for a missing
// or malformed file or no such device.
// tfm_weaver_shape writes its 9 sizes (target_hidden, drafter_hidden, depth, top_k, width, layers,
// heads, ffn, rank) and returns 9. tfm_weaver_q: for n_paths paths over n_drafts drafts, q of each
// path's last step, [n_paths, rank] float32 into q_out. h_target [n_drafts, target_hidden] (the
// target's final hidden state, after its output norm), h_drafter [n_drafts, depth, drafter_hidden] (the
// drafter's block states after its final norm), path_draft[p] the draft of path p, path_len[p] its
// steps (1..depth: the root, then the tokens at depths 1..len-1), step_emb [sum path_len, target_hidden]
// the target's embeddings of those tokens, paths one after another. Returns n_paths, -1 on bad
// arguments, -2 when the graph cannot be allocated, -3 when the backend fails. It is
// tfm_weaver_prefix then tfm_weaver_steps (API version 13): tfm_weaver_prefix computes the drafts'
// prefix keys and values of every layer and keeps them on the backend (0, or -1 / -2 / -3 as above);
// tfm_weaver_steps computes q for paths over the kept prefix (the arguments of tfm_weaver_q without
// the prefix; -1 as well when no prefix is kept or a path's draft is beyond it), so that the rounds of
// one tree's heap compute only their paths' steps.
struct tfm_weaver;
LLAMA_API struct tfm_weaver * tfm_weaver_load(const char * path, int32_t device, int32_t n_threads);
LLAMA_API void tfm_weaver_free(struct tfm_weaver * w);
LLAMA_API int32_t tfm_weaver_shape(const struct tfm_weaver * w, int32_t * out);
LLAMA_API int32_t tfm_weaver_q(struct tfm_weaver * w, int32_t n_drafts, const float * h_target, const float * h_drafter,
                               int32_t n_paths, const int32_t * path_draft, const int32_t * path_len,
                               const float * step_emb, float * q_out);
LLAMA_API int32_t tfm_weaver_prefix(struct tfm_weaver * w, int32_t n_drafts, const float * h_target, const float * h_drafter);
LLAMA_API int32_t tfm_weaver_steps(struct tfm_weaver * w, int32_t n_paths, const int32_t * path_draft,
                                   const int32_t * path_len, const float * step_emb, float * q_out);

// One draft's tree node by node (API version 14): tfm_weaver_nodes_begin computes and keeps the draft's
// prefix (tfm_weaver_prefix of one draft; h_target [target_hidden], h_drafter [depth, drafter_hidden])
// and empties a store of max_nodes nodes; tfm_weaver_nodes_add appends n nodes, node i a child of
// parent[i] (an earlier node of this tree, this call's included, or -1: a step after the prefix alone,
// the tree's root token), step_emb [n, target_hidden] the target's embeddings of their tokens, and
// writes each node's q [n, rank] into q_out. A node attends to the prefix, its ancestors and itself,
// at RoPE position depth + 1 (the root's 1), so its q is tfm_weaver_steps' q of the path ending at it;
// each node's keys and values are kept, so a call computes its own n rows only (the heap's rounds
// before cost a whole path each), in a graph kept for each padded row count (a power of two up to 16).
// Returns n; -1 on bad arguments (no tree begun, its prefix replaced since by tfm_weaver_prefix or
// tfm_weaver_q, the store full, a parent out of range, a path longer than depth), -2 / -3 as above.
LLAMA_API int32_t tfm_weaver_nodes_begin(struct tfm_weaver * w, const float * h_target, const float * h_drafter,
                                         int32_t max_nodes);
LLAMA_API int32_t tfm_weaver_nodes_add(struct tfm_weaver * w, int32_t n, const int32_t * parent, const float * step_emb,
                                       float * q_out);

// DARTree on the backend (API versions 17, 18; arXiv 2608.13524; tfm_local/decode/tree.py build_dartree is the
// reference). The codes table is read onto the Weaver's backend by tfm_weaver_load (the file is not read
// again); tfm_weaver_attach_target computes every token's step input (step_proj of the normed row of the target GGUF's token_embd.weight) into a table kept
// there: 0, -1 for a target whose embeddings do not fit the Weaver (width, vocabulary) or an unreadable file,
// -2 / -3 as above. tfm_weaver_dartree then builds one draft's DARTree in one graph (kept per shape): the
// prefix (h_target [target_hidden], h_drafter [depth, drafter_hidden]), then n_depth rounds (1..depth); round
// d scores the top_k candidates cand[d] (int32 [n_depth, top_k], target ids) of each live branch, logits
// cand_logit[d] + codes[c] . q, log-softmax over top_k (z - max - log sum exp(z - max): finite however
// unlikely the candidate), plus the branch's path score; round 0 has the root
// (token root) as its one branch, round d + 1 the `width` best children of round d (fewer when round d has
// fewer children). Then one top-budget over every child of every round by path score + beta * depth
// (beta <= 0). Out: live [n_live], int32, for rounds 1..n_depth-1 in order, each branch's flat index
// r * top_k + k into the children of the round before (r the parent's row in that round, k the candidate),
// in no particular order within a round; live_score [n_live] its path score; sel [B] the selected nodes'
// indices into the concatenated children of all rounds (round 0's first), in no particular order, and
// sel_score [B] their path scores, B = min(budget, all children). n_live = sum over rounds 1..n_depth-1 of
// min(width, top_k * the round before's branches). Returns B; -1 on bad arguments (no target attached,
// a token out of range, beta > 0), -4 for a size above the limits below (API version 18: width above
// TFM_DARTREE_MAX_WIDTH, top_k above TFM_DARTREE_MAX_TOP_K, more than TFM_DARTREE_MAX_NODES children in
// all), -2 / -3 as above (-2 also for host memory that runs out: no C++ exception leaves either call).
// The graphs are kept per shape (n_depth, top_k, width, B, beta), at most TFM_DARTREE_GRAPHS of them: a new
// shape frees the least recently used one's (API version 18); tfm_weaver_dartree_graphs returns how many
// are kept (-1 for no Weaver).
#define TFM_DARTREE_MAX_WIDTH 256
#define TFM_DARTREE_MAX_TOP_K 1024
#define TFM_DARTREE_MAX_NODES (1 << 22)
#define TFM_DARTREE_GRAPHS 8
LLAMA_API int32_t tfm_weaver_attach_target(struct tfm_weaver * w, const char * target_path);
LLAMA_API int32_t tfm_weaver_dartree(struct tfm_weaver * w, const float * h_target, const float * h_drafter,
                                     int32_t n_depth, int32_t top_k, const int32_t * cand, const float * cand_logit,
                                     int32_t root, int32_t width, int32_t budget, float beta, int32_t * live,
                                     float * live_score, int32_t * sel, float * sel_score);
LLAMA_API int32_t tfm_weaver_dartree_graphs(const struct tfm_weaver * w);

#ifdef __cplusplus
}
#endif
