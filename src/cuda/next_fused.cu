// Fused small ops of qwen3next's fast GPU decode (contract: next_fused.cuh). The f32 arithmetic of each
// part is copied from cuda/gdn.cu (same expressions, same order, same warp reductions), so the values are
// those of the op chain it replaces; the quantization is q8_kernels.cu's (q8c::quantize_warp).
#include "cuda/next_fused.cuh"

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/q8_common.cuh"

namespace strata::cuda::nextf {
namespace {

constexpr int kWarp = 32;
constexpr int kRowWarps = 4;  // warps (rows) per block, as gdn.cu's row kernels
constexpr int kMaxPerLane = 8;  // D <= 256

// As gdn.cu.
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per head row of D (D % 32 == 0): the sum of squares as gdn.cu gated_rms_norm_kernel (lane i sums
// i, i+32, ... in order, then the xor butterfly), then each 32-value block quantized by the warp.
//   x: [n_rows][D]  z: row r = (t, h) at z + t * z_ld + h * D  w: [D]  q: [n_rows][D]  ds: [n_rows][D/32]
__global__ void gated_norm_quantize_kernel(const float* __restrict__ x, const float* __restrict__ z, int64_t z_ld,
                                           int64_t n_heads, const float* __restrict__ w, int64_t n_rows, int64_t D,
                                           float eps, int8_t* __restrict__ q, float2* __restrict__ ds) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;  // whole warps leave together (row is uniform across the warp)
  const float* xr = x + row * D;
  const float* zr = z + (row / n_heads) * z_ld + (row % n_heads) * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += kWarp) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  const float scale = 1.0f / sqrtf(ss / float(D) + eps);
  for (int64_t b = 0; b < D / kWarp; ++b) {
    const int64_t i = b * kWarp + lane;
    const float y = xr[i] * scale * w[i] * silu_f(zr[i]);
    q8c::quantize_warp(y, q + row * D + b * kWarp, ds + row * (D / kWarp) + b);
  }
}

// One warp per 32-value block (grid-stride), as q8_kernels.cu quantize_kernel.
//   x, gate: [blocks][32]  q: [blocks][32]  ds: [blocks]
__global__ void mul_sigmoid_quantize_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                            int64_t blocks, int8_t* __restrict__ q, float2* __restrict__ ds) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t b = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; b < blocks;
       b += int64_t(gridDim.x) * kRowWarps) {
    const int64_t i = 32 * b + lane;
    float y = x[i];
    y *= sigmoid_f(gate[i]);  // gdn.cu mul_sigmoid_kernel's expression
    q8c::quantize_warp(y, q + 32 * b, ds + b);
  }
}

// One block of 256 threads per token: a strided dot product, the warps' sums in a fixed order.
//   w: [cols]  x: [n][cols]  y: [n]
__global__ void dot_sigmoid_kernel(const float* __restrict__ w, const float* __restrict__ x, int64_t cols,
                                   float* __restrict__ y) {
  __shared__ float sh[32];
  const float* xr = x + int64_t(blockIdx.x) * cols;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) acc = fmaf(w[i], xr[i], acc);
  acc = warp_sum(acc);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < int(blockDim.x / kWarp); ++i) s += sh[i];
    y[blockIdx.x] = sigmoid_f(s);
  }
}

// Blocks [0, row_blocks): one warp per head row hr of the conv channels (q heads, k heads, v heads), lane
// holding channels hr*D + lane + 32*j; per token: the conv of gdn.cu conv1d_silu_kernel for each of its
// channels, then split_qkv_kernel's L2 norm over the warp; after the last token, conv_roll_state_kernel's
// update of its channels (only this lane reads or writes them). Blocks from row_blocks: one thread per
// (token, value head), gdn.cu gates_kernel.
template <int E>  // channels per lane = D / 32
__global__ void conv_split_gates_kernel(const float* __restrict__ x, int64_t x_ld, int64_t n_tok, int64_t n_k_heads,
                                        int64_t n_v_heads, int K, float* state, const float* __restrict__ w,
                                        float eps, float* __restrict__ q, float* __restrict__ k,
                                        float* __restrict__ v, const float* __restrict__ ba, int64_t ba_ld,
                                        const float* __restrict__ a, const float* __restrict__ dt_bias,
                                        float* __restrict__ g, float* __restrict__ beta, int64_t row_blocks) {
  constexpr int64_t D = int64_t(E) * kWarp;
  if (int64_t(blockIdx.x) >= row_blocks) {
    const int64_t idx = (int64_t(blockIdx.x) - row_blocks) * blockDim.x + threadIdx.x;
    if (idx >= n_tok * n_v_heads) return;
    const int64_t r = n_v_heads / n_k_heads;
    const int64_t t = idx / n_v_heads, h = idx % n_v_heads;
    const int64_t j = h / r, i = h % r;
    const float* bt = ba + t * ba_ld;
    beta[idx] = sigmoid_f(bt[j * 2 * r + i]);
    g[idx] = a[h] * softplus_f(bt[j * 2 * r + r + i] + dt_bias[h]);
    return;
  }
  const int64_t heads = 2 * n_k_heads + n_v_heads;
  const int64_t C = heads * D;
  const int64_t hr = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (hr >= heads) return;  // uniform across the warp
  float* dst_base;
  int64_t dst_stride;  // values between one token's row and the next
  bool norm = true;
  if (hr < n_k_heads) {
    dst_base = q + hr * D;
    dst_stride = n_k_heads * D;
  } else if (hr < 2 * n_k_heads) {
    dst_base = k + (hr - n_k_heads) * D;
    dst_stride = n_k_heads * D;
  } else {
    dst_base = v + (hr - 2 * n_k_heads) * D;
    dst_stride = n_v_heads * D;
    norm = false;
  }
  for (int64_t t = 0; t < n_tok; ++t) {
    float y[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t c = hr * D + lane + int64_t(e) * kWarp;
      const float* wc = w + c * K;
      float acc = 0.0f;
      for (int kk = 0; kk < K; ++kk) {
        const int64_t r = t + kk;  // row of xx = state ++ x
        const float xv = r < K - 1 ? state[r * C + c] : x[(r - (K - 1)) * x_ld + c];
        acc = fmaf(wc[kk], xv, acc);
      }
      y[e] = silu_f(acc);
    }
    float scale = 1.0f;
    if (norm) {
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) ss = fmaf(y[e], y[e], ss);
      ss = warp_sum(ss);
      scale = 1.0f / fmaxf(sqrtf(ss), eps);  // ggml_l2_norm
    }
    float* dst = dst_base + t * dst_stride;
#pragma unroll
    for (int e = 0; e < E; ++e) dst[lane + e * kWarp] = y[e] * scale;
  }
  // The state's update, oldest row first (the shift case n_tok < K-1 reads row i + n_tok before it is
  // overwritten), as conv_roll_state_kernel.
  const int64_t keep = K - 1;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t c = hr * D + lane + int64_t(e) * kWarp;
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t r = n_tok + i;
      state[i * C + c] = r < keep ? state[r * C + c] : x[(r - keep) * x_ld + c];
    }
  }
}

}  // namespace

void gated_norm_quantize(const float* x, const float* z, int64_t z_ld, const float* w, int64_t n_tok,
                         int64_t n_heads, int64_t D, float eps, int8_t* q, float2* ds, cudaStream_t stream) {
  STRATA_REQUIRE(n_tok >= 0 && n_heads > 0 && D > 0 && D % kWarp == 0 && z_ld >= n_heads * D,
                 "cuda gated_norm_quantize: bad shape (tokens {}, heads {}, D {}: a positive multiple of 32, z_ld {})",
                 n_tok, n_heads, D, z_ld);
  const int64_t n_rows = n_tok * n_heads;
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(q) % 16 == 0, "cuda gated_norm_quantize: q must be 16-byte aligned");
  if (n_rows == 0) return;
  const int64_t blocks = (n_rows + kRowWarps - 1) / kRowWarps;
  STRATA_REQUIRE(blocks <= INT32_MAX, "cuda gated_norm_quantize: {} rows is too many", n_rows);
  gated_norm_quantize_kernel<<<unsigned(blocks), kRowWarps * kWarp, 0, stream>>>(x, z, z_ld, n_heads, w, n_rows, D,
                                                                                 eps, q, ds);
  CUDA_CHECK_LAUNCH();
}

void mul_sigmoid_quantize(const float* x, const float* gate, int64_t n, int64_t cols, int8_t* q, float2* ds,
                          cudaStream_t stream) {
  STRATA_REQUIRE(n >= 0 && cols > 0 && cols % kWarp == 0,
                 "cuda mul_sigmoid_quantize: bad shape (n {}, cols {}: a positive multiple of 32)", n, cols);
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(q) % 16 == 0, "cuda mul_sigmoid_quantize: q must be 16-byte aligned");
  const int64_t blocks = n * (cols / kWarp);
  if (blocks == 0) return;
  const int64_t grid = std::min<int64_t>((blocks + kRowWarps - 1) / kRowWarps, 65535);
  mul_sigmoid_quantize_kernel<<<unsigned(grid), kRowWarps * kWarp, 0, stream>>>(x, gate, blocks, q, ds);
  CUDA_CHECK_LAUNCH();
}

void dot_sigmoid(const float* w, const float* x, int64_t n, int64_t cols, float* y, cudaStream_t stream) {
  STRATA_REQUIRE(n >= 0 && n <= 0x7FFFFFFF && cols > 0, "cuda dot_sigmoid: bad shape (n {}, cols {})", n, cols);
  if (n == 0) return;
  dot_sigmoid_kernel<<<unsigned(n), 256, 0, stream>>>(w, x, cols, y);
  CUDA_CHECK_LAUNCH();
}

void conv_split_gates(const float* x, int64_t x_ld, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D,
                      int K, float* state, const float* w, float eps, float* q, float* k, float* v, const float* ba,
                      int64_t ba_ld, const float* a, const float* dt_bias, float* g, float* beta, cudaStream_t stream) {
  STRATA_REQUIRE(n_k_heads > 0 && n_v_heads > 0 && n_v_heads % n_k_heads == 0 && K >= 1,
                 "cuda conv_split_gates: bad heads (Hk {}, Hv {}) or conv kernel {}", n_k_heads, n_v_heads, K);
  STRATA_REQUIRE(D > 0 && D % kWarp == 0 && D <= kMaxPerLane * kWarp,
                 "cuda conv_split_gates: head size {} is not a multiple of 32 up to {}", D, kMaxPerLane * kWarp);
  STRATA_REQUIRE(n_tok >= 0 && n_tok <= kConvSplitMaxTokens, "cuda conv_split_gates: {} tokens (at most {})", n_tok,
                 kConvSplitMaxTokens);
  const int64_t heads = 2 * n_k_heads + n_v_heads;
  STRATA_REQUIRE(x_ld >= heads * D && ba_ld >= 2 * n_v_heads, "cuda conv_split_gates: row strides {} / {} too small",
                 x_ld, ba_ld);
  if (n_tok == 0) return;
  const int64_t row_blocks = (heads + kRowWarps - 1) / kRowWarps;
  const int64_t threads = kRowWarps * kWarp;
  const int64_t gate_blocks = (n_tok * n_v_heads + threads - 1) / threads;
  STRATA_REQUIRE(row_blocks + gate_blocks <= INT32_MAX, "cuda conv_split_gates: {} heads is too many", heads);
  const unsigned grid = unsigned(row_blocks + gate_blocks);
  switch (D / kWarp) {
#define STRATA_CSG(E)                                                                                             \
  case E:                                                                                                        \
    conv_split_gates_kernel<E><<<grid, unsigned(threads), 0, stream>>>(x, x_ld, n_tok, n_k_heads, n_v_heads, K,   \
                                                                       state, w, eps, q, k, v, ba, ba_ld, a,      \
                                                                       dt_bias, g, beta, row_blocks);             \
    break;
    STRATA_CSG(1)
    STRATA_CSG(2)
    STRATA_CSG(3)
    STRATA_CSG(4)
    STRATA_CSG(5)
    STRATA_CSG(6)
    STRATA_CSG(7)
    STRATA_CSG(8)
#undef STRATA_CSG
    default: fail("cuda conv_split_gates: head size {}", D);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::nextf
