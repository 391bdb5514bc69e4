#pragma once
// Fused small ops of qwen3next's fast GPU decode (qwen3next_cuda.cpp), declarations only. Each replaces a
// chain of cuda/gdn.cuh ops (plus an activation quantization of cuda/q8_kernels.cuh) by one launch and
// computes the same f32 values as that chain (the same expressions in the same order); the quantized
// output is q8::quantize's of those values. CPU references with the same signatures:
// host/next_fused_ref.h; tests: tests/cuda/test_next_fused.cu. All pointers device; enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::nextf {

// gdn::gated_rms_norm followed by q8::quantize, without the f32 output:
//   y = x / sqrt(mean(x^2) + eps) * w * silu(z) per head row of D,  (q, ds) = Q8 activations of y
//   x: [n_tok][n_heads][D] f32   z: token t's [n_heads][D] at z + t * z_ld (z_ld >= n_heads * D: z may be
//   a part of a wider projection output)   w: [D] f32   q: [n_tok][n_heads][D] int8
//   ds: [n_tok][n_heads * D / 32] float2
// D % 32 == 0 (strata::Error otherwise); q 16-byte aligned for q8::matvec (the caller's buffer).
void gated_norm_quantize(const float* x, const float* z, int64_t z_ld, const float* w, int64_t n_tok,
                         int64_t n_heads, int64_t D, float eps, int8_t* q, float2* ds, cudaStream_t stream);

// gdn::mul_sigmoid followed by q8::quantize, without the f32 output (the gated attention's output before
// attn_output):  y = x * sigmoid(gate),  (q, ds) = Q8 activations of y
//   x, gate: [n][cols] f32 (cols % 32 == 0)   q: [n][cols] int8 (16-byte aligned)   ds: [n][cols/32] float2
void mul_sigmoid_quantize(const float* x, const float* gate, int64_t n, int64_t cols, int8_t* q, float2* ds,
                          cudaStream_t stream);

// y[t] = sigmoid(w . x[t]) = 1 / (1 + exp(-(w . x[t]))) for t < n: the shared expert's gate (a one-row
// F32 ffn_gate_inp_shexp) as the weight of a one-expert q8::moe_down, in one launch.
//   w: [cols] f32   x: [n][cols] f32   y: [n] f32
void dot_sigmoid(const float* w, const float* x, int64_t n, int64_t cols, float* y, cudaStream_t stream);

// One run of a sequence's tokens through the first GDN ops (gdn::conv1d_silu, gdn::split_qkv and
// gdn::gates for the run's tokens), in one launch, for short runs (n_tok <= kConvSplitMaxTokens: decode):
//   conv = silu(conv1d(state ++ x)), state <- last K-1 rows of (state ++ x),
//   q, k = L2-normalised head rows of conv (eps as ggml_l2_norm), v = its value head rows,
//   g = a * softplus(alpha + dt_bias), beta = sigmoid(b) from ba
//   x: token t's [C] at x + t * x_ld, C = (2*Hk + Hv)*D, x_ld >= C   state: [K-1][C] (in place)   w: [C][K]
//   q, k: [n_tok][Hk][D]  v: [n_tok][Hv][D]   ba: token t's [2*Hv] at ba + t * ba_ld (ba_ld >= 2*Hv)
//   a, dt_bias: [Hv]  g, beta: [n_tok][Hv]
// (x and ba may be parts of wider projection outputs.) Same values as the three ops on contiguous copies.
// Throws strata::Error for a bad shape or n_tok > kConvSplitMaxTokens.
constexpr int64_t kConvSplitMaxTokens = 16;
void conv_split_gates(const float* x, int64_t x_ld, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D,
                      int K, float* state, const float* w, float eps, float* q, float* k, float* v, const float* ba,
                      int64_t ba_ld, const float* a, const float* dt_bias, float* g, float* beta, cudaStream_t stream);

}  // namespace strata::cuda::nextf
