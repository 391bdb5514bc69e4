#pragma once
// Plain CPU references of cuda/ops_fused.cuh, same signatures (host memory, no stream), written as the
// composition of the CPU ops (cpu/ops.h) the fused kernels replace. tests/cuda/test_ops_fused.cu checks
// that they equal cpu::rmsnorm + cpu::rope_neox + cpu::kv_store bit for bit and compares the GPU with them.
#include <cstdint>

#include "cuda/ops_fused.cuh"

namespace strata::cuda::ops::ref {

// cs: [n_tok][n_rot/2][2], the angles of cpu::rope_neox (std::cos/std::sin of the f32 angle).
void rope_cos_sin(const int32_t* pos, int64_t n_tok, int n_rot, float base, float* cs);

// As ops::attn_prep; refs point into host KV caches.
void attn_prep(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
               const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
               int layer, const AttnPrepShape& shape, float* q_out);

// As ops::router_route without the counter: logits[t][e] = sum_c w[e][c] * x[t][c] in f32 (c in order),
// then cpu::moe_route.
void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights);

// As ops::norm_router_route without the counter: cpu::rmsnorm of x into xn (if not null), q8ref::quantize of
// it into xq/xds (if not null), then router_route on it.
void norm_router_route(const float* x, const float* norm_w, float eps, const float* w, int n_expert, int64_t cols,
                       int64_t n_tok, int k, bool norm, float* xn, int8_t* xq, float2* xds, float* logits,
                       int32_t* ids, float* weights);

}  // namespace strata::cuda::ops::ref
