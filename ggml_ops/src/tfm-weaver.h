// tfm-local: the Weaver and its DARTree graph, a C API of their own next to tfm-ext.h (as llama.cpp keeps
// tools/mtmd apart from libllama), built into libllama (patch 0001).
//
// The Weaver scores the candidates of a draft tree from the target's and the drafter's states (TfM, Trees
// from Marginals): its own GGUF loader and allocator, q for batches of paths over a kept prefix, a node
// store that computes one tree node by node, and DARTree built whole on the Weaver's backend.
// tfm_weaver_api_version() lets the Python side (tfm_local/llama/weaver_native.py) refuse a library built
// from other sources; TFM_WEAVER_API_VERSION is bumped whenever a function here is added or changed. Until
// tfm-ext.h's API version 18 these functions were part of tfm-ext.h and its version.
// Implementation: tfm-weaver.cpp (load, q, node store), tfm-dartree.cpp (DARTree), tfm-weaver-impl.h.
#pragma once

#include "llama.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TFM_WEAVER_API_VERSION 1

// Version of this API (TFM_WEAVER_API_VERSION of the library's build).
LLAMA_API int32_t tfm_weaver_api_version(void);

// The Weaver (Trees from Marginals). tfm_weaver_load reads a Weaver GGUF (architecture
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
// tfm_weaver_prefix then tfm_weaver_steps: tfm_weaver_prefix computes the drafts'
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

// One draft's tree node by node: tfm_weaver_nodes_begin computes and keeps the draft's
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

// DARTree on the backend (arXiv 2608.13524; tfm_local/decode/tree.py build_dartree is the
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
// a token out of range, beta > 0), -4 for a size above the limits below (width above
// TFM_DARTREE_MAX_WIDTH, top_k above TFM_DARTREE_MAX_TOP_K, more than TFM_DARTREE_MAX_NODES children in
// all), -2 / -3 as above (-2 also for host memory that runs out: no C++ exception leaves either call).
// The graphs are kept per shape (n_depth, top_k, width, B, beta), at most TFM_DARTREE_GRAPHS of them: a new
// shape frees the least recently used one's; tfm_weaver_dartree_graphs returns how many
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
