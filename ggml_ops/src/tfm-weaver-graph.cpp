// tfm-local: the Weaver's layers as ggml graph pieces (declared in tfm-weaver-impl.h), shared by its q and
// node-store graphs (tfm-weaver.cpp) and by DARTree's (tfm-dartree.cpp): the prefix's keys and values, a
// step row's input, a layer's attention and MLP, q.
#include "tfm-weaver-impl.h"

#include <cmath>

namespace {

ggml_tensor * weaver_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

// NEOX RoPE of a Weaver layer's keys or queries [hd, H, n] at positions pos (the prefix and the steps alike)
ggml_tensor * weaver_rope(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * a, ggml_tensor * pos) {
    return ggml_rope_ext(ctx, a, pos, nullptr, W->width / W->heads, GGML_ROPE_TYPE_NEOX, 0, W->rope_theta,
                         1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
}

} // namespace

namespace tfm {

// (each function is described in tfm-weaver-impl.h)

std::unique_ptr<ggml_context, void (*)(ggml_context *)> weaver_graph_ctx(size_t n_nodes) {
    ggml_init_params params = {n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
    return {ggml_init(params), ggml_free};
}

ggml_tensor * weaver_step_in(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * se) {
    return ggml_mul_mat(ctx, W->get("step_proj.weight"), weaver_norm(ctx, se, W->get("step_norm.weight"), W->eps));
}

void weaver_qkv(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * pos,
                ggml_tensor *& q, ggml_tensor *& k, ggml_tensor *& v) {
    const int32_t H = W->heads, hd = W->width / H;
    const int64_t n = x->ne[1];
    auto L = [&](const char * name) { return W->get("blk." + std::to_string(l) + "." + name + ".weight"); };
    ggml_tensor * h = weaver_norm(ctx, x, L("attn_norm"), W->eps);
    q = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("q"), h), hd, H, n), pos);
    k = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("k"), h), hd, H, n), pos);
    v = ggml_mul_mat(ctx, L("v"), h);
}

ggml_tensor * weaver_attend_mlp(ggml_context * ctx, const tfm_weaver * W, int32_t l, ggml_tensor * x, ggml_tensor * q,
                                ggml_tensor * k, ggml_tensor * v, ggml_tensor * mask) {
    const int32_t Wd = W->width, H = W->heads, hd = Wd / H;
    const int64_t n = x->ne[1], Tk = k->ne[2];
    auto L = [&](const char * name) { return W->get("blk." + std::to_string(l) + "." + name + ".weight"); };
    ggml_tensor * kq = ggml_mul_mat(ctx, ggml_permute(ctx, k, 0, 2, 1, 3), ggml_permute(ctx, q, 0, 2, 1, 3));  // [Tk, n, H]
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / std::sqrt((float) hd), 0.0f);
    ggml_tensor * vt  = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, H, Tk), 1, 2, 0, 3));  // [Tk, hd, H]
    ggml_tensor * kqv = ggml_mul_mat(ctx, vt, kq);                                                         // [hd, n, H]
    ggml_tensor * o   = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3)), Wd, n);
    x = ggml_add(ctx, x, ggml_mul_mat(ctx, L("o"), o));
    ggml_tensor * m = weaver_norm(ctx, x, L("mlp_norm"), W->eps);
    ggml_tensor * g = ggml_silu(ctx, ggml_mul_mat(ctx, L("gate"), m));
    return ggml_add(ctx, x, ggml_mul_mat(ctx, L("down"), ggml_mul(ctx, g, ggml_mul_mat(ctx, L("up"), m))));
}

ggml_tensor * weaver_q_out(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * x) {
    return ggml_mul_mat(ctx, W->get("out.weight"), weaver_norm(ctx, x, W->get("norm.weight"), W->eps));
}

void weaver_prefix_kv(ggml_context * ctx, const tfm_weaver * W, ggml_tensor * ht, ggml_tensor * hdr, ggml_tensor * pos,
                      std::vector<ggml_tensor *> & keys, std::vector<ggml_tensor *> & vals) {
    const int32_t H = W->heads, hd = W->width / H;
    ggml_tensor * t = ggml_mul_mat(ctx, W->get("target_proj.weight"), weaver_norm(ctx, ht, W->get("target_norm.weight"), W->eps));
    ggml_tensor * d = ggml_mul_mat(ctx, W->get("drafter_proj.weight"), weaver_norm(ctx, hdr, W->get("drafter_norm.weight"), W->eps));
    ggml_tensor * prefix = ggml_concat(ctx, t, d, 1);                                   // [W, P]
    const int64_t P = prefix->ne[1];
    keys.assign(W->layers, nullptr);
    vals.assign(W->layers, nullptr);
    for (int32_t l = 0; l < W->layers; ++l) {
        auto L = [&](const char * n) { return W->get("blk." + std::to_string(l) + "." + n + ".weight"); };
        ggml_tensor * p = weaver_norm(ctx, prefix, L("prefix_norm"), W->eps);
        keys[l] = weaver_rope(ctx, W, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L("k"), p), hd, H, P), pos);
        vals[l] = ggml_mul_mat(ctx, L("v"), p);
    }
}

} // namespace tfm
