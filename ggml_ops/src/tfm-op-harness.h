// tfm-local: the op test/bench harness (tfm-op-harness.cpp), for tests and benchmarks only.
//
// C entry points that run or time one ggml op on host buffers; tfm_local/testing/op_harness.py binds
// them (run_op, bench_op), apart from the runtime API of tfm-ext.h, whose tfm_api_version covers both.
#pragma once

#include "llama.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Test entry point of the tree ops of patch 0005 (and of the plain ops they extend): builds a
// one-op ggml graph on a backend, runs it on host buffers and copies the result back.
//   op     : one of TFM_OP_* below
//   src    : n_src host buffers, contiguous; src i has shape ne[4*i .. 4*i+3] (ggml order,
//            ne[0] fastest) and type types[i] (0 = F32, 1 = I32), in the op's argument order:
//              GDN         q, k, v, g, beta, state          (ggml_gated_delta_net, K = 1)
//              GDN_TREE    q, k, v, g, beta, state, parent  (ggml_gated_delta_net_tree)
//              GDN_COMMIT  state, k, u, gamma, path         (ggml_gated_delta_net_tree_commit)
//              CONV        sx, c                            (ggml_ssm_conv)
//              CONV_TREE   sx, c, parent                    (ggml_ssm_conv_tree)
//              CONV_COMMIT sx, path; iparam = d_conv        (ggml_ssm_conv_tree_commit)
//              TOP_K       x; iparam = k                    (ggml_top_k; the result is int32 ids,
//                                                            copied bit for bit into out)
//              ARGMAX      x (a matrix)                     (ggml_argmax; int32 ids, as TOP_K)
//              SAMPLE_TOKENS logits, keys; iparam = top_k       (ggml_sample_tokens, patch 0011; temp, top_p
//                                                            and min_p from tfm_test_op_set_fparams;
//                                                            int32 (id, kept) pairs, as TOP_K)
//   device : 0 = CPU backend (n_threads threads), 1 = the first GPU device
//   out    : receives the result, out_n floats (must equal its element count); the result
//            tensor is filled with NaN before the run, so elements the op leaves unwritten show.
// Returns 0 on success, -1 on bad arguments, -2 when there is no such device, -3 when the
// device does not support the op with these shapes. Shapes the op rejects abort (GGML_ASSERT).
enum {
    TFM_OP_GDN         = 0,
    TFM_OP_GDN_TREE    = 1,
    TFM_OP_GDN_COMMIT  = 2,
    TFM_OP_CONV        = 3,
    TFM_OP_CONV_TREE   = 4,
    TFM_OP_CONV_COMMIT = 5,
    TFM_OP_TOP_K       = 6,
    TFM_OP_ARGMAX      = 7,
    TFM_OP_SAMPLE_TOKENS = 8,
};
// The float parameters of the ops that take some, for the following tfm_test_op / tfm_bench_op
// calls (API version 11): SAMPLE_TOKENS p = (temp, top_p, min_p); n <= 4 values are copied.
LLAMA_API void tfm_test_op_set_fparams(const float * p, int32_t n);
LLAMA_API int32_t tfm_test_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                              const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                              float * out, int64_t out_n);

// Timing entry point (API version 9): the graph of tfm_test_op (same op, sources, iparam, device,
// n_threads; sources uploaded once, the first result NaN-filled once), holding n_repeat independent
// copies of the op over the same sources (1..TFM_BENCH_MAX_REPEAT; each its own result, computed one
// after another in one graph), computed n_warmup + n_iter times, each followed by
// ggml_backend_synchronize; ms_out receives the n_iter measured wall times in milliseconds
// (std::chrono::steady_clock around compute + synchronize; the warm-up runs are not recorded).
// With two repeat counts R1 < R2, (t(R2) - t(R1)) / (R2 - R1) is the op's own time, without the
// graph launch and synchronize that every computation pays once (the copies read the same inputs,
// so they run cache-warm). Each copy has its own result buffer: n_repeat times the result's memory.
// Nothing is copied back. Returns 0 on success, -1 on bad arguments (also n_repeat, n_warmup < 0,
// n_iter < 1, ms_out NULL), a failed allocation or a failed compute, -2 / -3 as tfm_test_op.
#define TFM_BENCH_MAX_REPEAT 64
LLAMA_API int32_t tfm_bench_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                               const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                               int32_t n_repeat, int32_t n_warmup, int32_t n_iter, float * ms_out);

#ifdef __cplusplus
}
#endif
