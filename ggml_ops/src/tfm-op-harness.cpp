// tfm-local: the op test/bench harness (tfm_test_op, tfm_bench_op; declared in tfm-op-harness.h).
//
// Not part of the runtime C API of tfm-ext.h: nothing in the inference path calls it. It builds a
// one-op ggml graph (the tree ops of patch 0005, the plain ops they extend, ggml_top_k, ggml_argmax)
// on the CPU or the first GPU, so that the tests (tests/test_tree_gdn_ops.py, test_top_k_op.py, ...)
// and tfm-bench-gdn can run and time single ops of the installed library through
// tfm_local/testing/op_harness.py (run_op, bench_op). It lives in libllama because the tests run against the
// installed wheel.
#include "tfm-op-harness.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace {

// float parameters of the ops that take some (tfm_test_op_set_fparams)
float test_op_fparams[4] = {1.0f, 1.0f, 0.0f, 0.0f};

// the op's result tensor for the given sources (argument order as in tfm-op-harness.h), or nullptr
ggml_tensor * test_op_build(ggml_context * ctx, int32_t op, const std::vector<ggml_tensor *> & s, int32_t iparam) {
    const size_t n = s.size();
    switch (op) {
        case TFM_OP_GDN:
            return n == 6 ? ggml_gated_delta_net(ctx, s[0], s[1], s[2], s[3], s[4], s[5], 1) : nullptr;
        case TFM_OP_GDN_TREE:
            return n == 7 ? ggml_gated_delta_net_tree(ctx, s[0], s[1], s[2], s[3], s[4], s[5], s[6]) : nullptr;
        case TFM_OP_GDN_COMMIT:
            return n == 5 ? ggml_gated_delta_net_tree_commit(ctx, s[0], s[1], s[2], s[3], s[4]) : nullptr;
        case TFM_OP_CONV:
            return n == 2 ? ggml_ssm_conv(ctx, s[0], s[1]) : nullptr;
        case TFM_OP_CONV_TREE:
            return n == 3 ? ggml_ssm_conv_tree(ctx, s[0], s[1], s[2]) : nullptr;
        case TFM_OP_CONV_COMMIT:
            return n == 2 ? ggml_ssm_conv_tree_commit(ctx, s[0], s[1], iparam) : nullptr;
        case TFM_OP_TOP_K:
            return n == 1 && s[0]->type == GGML_TYPE_F32 && iparam >= 1 && iparam <= s[0]->ne[0]
                ? ggml_top_k(ctx, s[0], iparam) : nullptr;
        case TFM_OP_ARGMAX:
            return n == 1 && s[0]->type == GGML_TYPE_F32 && ggml_is_matrix(s[0]) ? ggml_argmax(ctx, s[0]) : nullptr;
        case TFM_OP_SAMPLE_TOKENS:
            return n == 2 && s[0]->type == GGML_TYPE_F32 && s[1]->type == GGML_TYPE_I32 && ggml_is_matrix(s[0]) &&
                   s[1]->ne[0] == 2 && s[1]->ne[1] == s[0]->ne[1] && test_op_fparams[0] > 0.0f
                ? ggml_sample_tokens(ctx, s[0], s[1], test_op_fparams[0], iparam, test_op_fparams[1], test_op_fparams[2])
                : nullptr;
        default:
            return nullptr;
    }
}

// A one-op graph with its sources and result allocated on a backend (see tfm-op-harness.h, tfm_test_op).
struct op_graph {
    ggml_context *             ctx     = nullptr;
    ggml_backend_t             backend = nullptr;
    ggml_backend_buffer_t      buf     = nullptr;
    ggml_cgraph *              gf      = nullptr;
    std::vector<ggml_tensor *> srcs;
    ggml_tensor *              res     = nullptr;

    ~op_graph() {
        if (buf != nullptr) {
            ggml_backend_buffer_free(buf);
        }
        if (backend != nullptr) {
            ggml_backend_free(backend);
        }
        if (ctx != nullptr) {
            ggml_free(ctx);
        }
    }
};

// Source tensors and n_repeat results of the op over them (independent copies, computed one after
// another; g.res is the first) in a no-alloc context; 0, or -1 on bad arguments.
int32_t op_graph_define(op_graph & g, int32_t op, int32_t n_src, const int64_t * ne, const int32_t * types,
                        int32_t iparam, int32_t n_repeat) {
    if (n_repeat < 1 || n_repeat > TFM_BENCH_MAX_REPEAT) {
        return -1;
    }
    const size_t graph_size = 8*((size_t) n_repeat + 1);
    ggml_init_params params = {
        /*.mem_size   =*/ ((size_t) n_src + graph_size) * ggml_tensor_overhead() + ggml_graph_overhead_custom(graph_size, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    g.ctx = ggml_init(params);
    if (g.ctx == nullptr) {
        return -1;
    }
    for (int32_t i = 0; i < n_src; ++i) {
        if (types[i] != 0 && types[i] != 1) {
            return -1;
        }
        g.srcs.push_back(ggml_new_tensor_4d(g.ctx, types[i] == 0 ? GGML_TYPE_F32 : GGML_TYPE_I32,
                                            ne[4*i], ne[4*i + 1], ne[4*i + 2], ne[4*i + 3]));
    }
    g.gf = ggml_new_graph_custom(g.ctx, graph_size, false);
    for (int32_t r = 0; r < n_repeat; ++r) {
        ggml_tensor * res = test_op_build(g.ctx, op, g.srcs, iparam);
        if (res == nullptr || (res->type != GGML_TYPE_F32 && res->type != GGML_TYPE_I32)) {
            return -1;
        }
        if (r == 0) {
            g.res = res;
        }
        ggml_build_forward_expand(g.gf, res);
    }
    return 0;
}

// Backend (device 0 = CPU with n_threads threads, 1 = first GPU), tensors allocated on it, sources
// uploaded and the result NaN-filled. 0, or the tfm_test_op error codes.
int32_t op_graph_place(op_graph & g, const void * const * src, int32_t device, int32_t n_threads) {
    if (device < 0 || device > 1) {
        return -2;
    }
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(device == 0 ? GGML_BACKEND_DEVICE_TYPE_CPU
                                                                   : GGML_BACKEND_DEVICE_TYPE_GPU);
    if (dev == nullptr || (g.backend = ggml_backend_dev_init(dev, nullptr)) == nullptr) {
        return -2;
    }
    if (!ggml_backend_supports_op(g.backend, g.res)) {
        return -3;
    }
    if ((g.buf = ggml_backend_alloc_ctx_tensors(g.ctx, g.backend)) == nullptr) {
        return -1;
    }
    if (device == 0) {
        auto * set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
        if (set_threads != nullptr) {
            set_threads(g.backend, std::max(1, n_threads));
        }
    }
    for (size_t i = 0; i < g.srcs.size(); ++i) {
        ggml_backend_tensor_set(g.srcs[i], src[i], 0, ggml_nbytes(g.srcs[i]));
    }
    const std::vector<float> poison((size_t) ggml_nelements(g.res), NAN);
    ggml_backend_tensor_set(g.res, poison.data(), 0, ggml_nbytes(g.res));
    return 0;
}

// The graph of the arguments shared by tfm_test_op and tfm_bench_op, ready to compute; 0 or an error code.
int32_t op_graph_setup(op_graph & g, int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                       const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                       int32_t n_repeat = 1) {
    if (n_src < 1 || n_src > GGML_MAX_SRC || src == nullptr || ne == nullptr || types == nullptr) {
        return -1;
    }
    const int32_t rc = op_graph_define(g, op, n_src, ne, types, iparam, n_repeat);
    return rc != 0 ? rc : op_graph_place(g, src, device, n_threads);
}

} // namespace

void tfm_test_op_set_fparams(const float * p, int32_t n) {
    for (int32_t i = 0; i < n && i < 4; ++i) {
        test_op_fparams[i] = p[i];
    }
}

int32_t tfm_test_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                    const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                    float * out, int64_t out_n) {
    if (out == nullptr) {
        return -1;
    }
    op_graph g;
    int32_t rc = op_graph_setup(g, op, n_src, src, ne, types, iparam, device, n_threads);
    if (rc == 0 && ggml_nelements(g.res) != out_n) {
        rc = -1;
    }
    if (rc != 0) {
        return rc;
    }
    if (ggml_backend_graph_compute(g.backend, g.gf) != GGML_STATUS_SUCCESS) {
        return -1;
    }
    ggml_backend_tensor_get(g.res, out, 0, ggml_nbytes(g.res));
    return 0;
}

int32_t tfm_bench_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                     const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                     int32_t n_repeat, int32_t n_warmup, int32_t n_iter, float * ms_out) {
    if (ms_out == nullptr || n_warmup < 0 || n_iter < 1) {
        return -1;
    }
    op_graph g;
    const int32_t rc = op_graph_setup(g, op, n_src, src, ne, types, iparam, device, n_threads, n_repeat);
    if (rc != 0) {
        return rc;
    }
    for (int32_t it = 0; it < n_warmup + n_iter; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        if (ggml_backend_graph_compute(g.backend, g.gf) != GGML_STATUS_SUCCESS) {
            return -1;
        }
        ggml_backend_synchronize(g.backend);
        const auto t1 = std::chrono::steady_clock::now();
        if (it >= n_warmup) {
            ms_out[it - n_warmup] = std::chrono::duration<float, std::milli>(t1 - t0).count();
        }
    }
    return 0;
}
