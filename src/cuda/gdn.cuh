#pragma once
// Gated DeltaNet ops of qwen3next on the GPU (issue 10's GPU path), declarations only. Each mirrors the
// CPU op of the same name in cpu/gdn.h (same shapes, same semantics: llama.cpp's qwen3next graph);
// tests/cuda/test_gdn_kernels.cu compares each with the CPU reference at Qwen3-Next-80B-A3B sizes.
// All pointers are device memory; every call is enqueued on `stream`; nothing allocates.
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::gdn {

// Causal depthwise conv1d + SiLU with the rolling per-sequence state (cpu/gdn.h gdn_conv1d_silu).
//   x: [n_tok][C]  state: [K-1][C] (updated: the last K-1 inputs)  w: [C][K]  y: [n_tok][C], y != x
void conv1d_silu(const float* x, int64_t n_tok, int64_t C, int K, float* state, const float* w, float* y,
                 cudaStream_t stream);

// g = a * softplus(alpha + dt_bias), beta = sigmoid(b)   (cpu/gdn.h gdn_gates; ba layout there)
//   ba: [n_tok][2*Hv]  a, dt_bias: [Hv]  g, beta: [n_tok][Hv]
void gates(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, const float* a,
           const float* dt_bias, float* g, float* beta, cudaStream_t stream);

// conv [n_tok][2*Hk*D + Hv*D] -> q, k [n_tok][Hk][D] L2-normalised (eps as ggml_l2_norm), v [n_tok][Hv][D]
void split_qkv(const float* conv, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D, float eps,
               float* q, float* k, float* v, cudaStream_t stream);

// The gated delta rule over n_tok tokens of one sequence, token after token (the recurrent form of
// cpu/gdn.h; exact up to f32 summation order). Each block keeps a slice of rows of one value head's
// [D][D] state in registers for the whole call (state rows are independent; grid = Hv x row slices).
// head_dim <= 256 (strata::Error otherwise).
//   q, k: [n_tok][Hk][D]  v: [n_tok][Hv][D]  g, beta: [n_tok][Hv]  state: [Hv][D][D] (in place)
//   out: [n_tok][Hv][D]
void delta_rule(int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim, const float* q,
                const float* k, const float* v, const float* g, const float* beta, float q_scale,
                float* state, float* out, cudaStream_t stream);

// y = x / sqrt(mean(x^2) + eps) * w * silu(z)   x, z, y: [n_rows][D], w: [D], y may alias x
void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D, float eps,
                    float* y, cudaStream_t stream);

// qg [n_tok][H][2*D] -> q, gate [n_tok][H][D]
void split_q_gate(const float* qg, int64_t n_tok, int64_t n_head, int64_t D, float* q, float* gate,
                  cudaStream_t stream);
// x[i] *= sigmoid(gate[i])
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
// y[t] += sigmoid(logit[t]) * x[t]   y, x: [n_tok][n], logit: [n_tok]
void add_sigmoid_scaled(float* y, const float* x, const float* logit, int64_t n_tok, int64_t n,
                        cudaStream_t stream);

}  // namespace strata::cuda::gdn
