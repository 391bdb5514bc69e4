#pragma once
// CPU references of cuda/next_fused.cuh (same signatures, host pointers; Q8Ds for CUDA's float2): each is
// the op chain the fused kernel replaces, written with the CPU ops of cpu/gdn.h and the Q8 quantization
// of q8_reference.h. tests/cuda/test_next_fused.cu compares the kernels with these and, bit for bit, with
// the GPU op chains.
#include <cstdint>

#include "cuda/host/q8_reference.h"

namespace strata::cuda::nextf_ref {

// y = gated_rms_norm(x, z, w), (q, ds) = q8ref::quantize(y)   x: [n_tok][n_heads][D]  z: token t's
// [n_heads][D] at z + t * z_ld   q: [n_tok][n_heads][D]
void gated_norm_quantize(const float* x, const float* z, int64_t z_ld, const float* w, int64_t n_tok,
                         int64_t n_heads, int64_t D, float eps, int8_t* q, q8ref::Q8Ds* ds);
// y = x * sigmoid(gate), (q, ds) = q8ref::quantize(y)   x, gate: [n][cols]
void mul_sigmoid_quantize(const float* x, const float* gate, int64_t n, int64_t cols, int8_t* q, q8ref::Q8Ds* ds);
// y[t] = 1 / (1 + exp(-(w . x[t])))   w: [cols]  x: [n][cols]  y: [n]
void dot_sigmoid(const float* w, const float* x, int64_t n, int64_t cols, float* y);
// gdn_conv1d_silu + gdn_split_qkv + gdn_gates (shapes: cuda/next_fused.cuh conv_split_gates)
void conv_split_gates(const float* x, int64_t x_ld, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D,
                      int K, float* state, const float* w, float eps, float* q, float* k, float* v, const float* ba,
                      int64_t ba_ld, const float* a, const float* dt_bias, float* g, float* beta);

}  // namespace strata::cuda::nextf_ref
