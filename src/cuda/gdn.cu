// Gated DeltaNet ops of qwen3next on the GPU (declarations and semantics: cuda/gdn.cuh, cpu/gdn.h).
// Plain f32 kernels, one thread / warp per independent unit of work; the delta rule keeps the state on
// chip for the whole call. Every host wrapper checks its shape (strata::Error) before launching.
#include "cuda/gdn.cuh"

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "cuda/cuda_check.cuh"

namespace strata::cuda::gdn {

namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// ggml_softplus: log(1 + exp(x)), x itself above 20 (as cpu/gdn.cpp)
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Blocks for a grid-stride loop over n items (n > 0).
unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(std::min<int64_t>(b, 65535 * 16));
}

// ---- conv1d ----------------------------------------------------------------------------------------

constexpr int kConvThreads = 256;  // channels per block
constexpr int kConvTokens = 16;    // tokens per block (grid.y)

// One thread per (channel, tile of tokens): y[t][c] = silu(sum_k w[c][k] * xx[t + k][c]), xx = state ++ x.
// Reads the old state only; conv_roll_state (launched after, same stream) then updates it.
//   x: [n_tok][C]  state: [K-1][C]  w: [C][K]  y: [n_tok][C]
__global__ void conv1d_silu_kernel(const float* __restrict__ x, int64_t n_tok, int64_t C, int K,
                                   const float* __restrict__ state, const float* __restrict__ w,
                                   float* __restrict__ y) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t t0 = int64_t(blockIdx.y) * kConvTokens;
  const int64_t t1 = std::min<int64_t>(t0 + kConvTokens, n_tok);
  const float* wc = w + c * K;
  for (int64_t t = t0; t < t1; ++t) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int64_t r = t + k;  // row of xx
      const float xv = r < K - 1 ? state[r * C + c] : x[(r - (K - 1)) * C + c];
      acc = fmaf(wc[k], xv, acc);
    }
    y[t * C + c] = silu_f(acc);
  }
}

// One thread per channel: state <- the last K-1 rows of (state ++ x). Rows are visited oldest first, so
// the shift case (n_tok < K-1) reads row i + n_tok before this thread overwrites it.
//   x: [n_tok][C]  state: [K-1][C] (in place)
__global__ void conv_roll_state_kernel(const float* __restrict__ x, int64_t n_tok, int64_t C, int K,
                                       float* __restrict__ state) {
  const int64_t keep = K - 1;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t r = n_tok + i;  // row of xx = state ++ x
      state[i * C + c] = r < keep ? state[r * C + c] : x[(r - keep) * C + c];
    }
  }
}

// ---- gates -----------------------------------------------------------------------------------------------

// One thread per (token, value head).
//   ba: [n_tok][2*Hv] (per key head j: r beta logits, then r alpha logits)  a, dt_bias: [Hv]
//   g, beta: [n_tok][Hv]
__global__ void gates_kernel(const float* __restrict__ ba, int64_t n_tok, int64_t n_v_heads, int64_t r,
                             const float* __restrict__ a, const float* __restrict__ dt_bias,
                             float* __restrict__ g, float* __restrict__ beta) {
  const int64_t n = n_tok * n_v_heads;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / n_v_heads, h = idx % n_v_heads;
    const int64_t j = h / r, i = h % r;
    const float* bt = ba + t * 2 * n_v_heads;
    beta[idx] = sigmoid_f(bt[j * 2 * r + i]);
    g[idx] = a[h] * softplus_f(bt[j * 2 * r + r + i] + dt_bias[h]);
  }
}

// ---- split q|k|v + L2 norm -----------------------------------------------------------------------------

constexpr int kRowWarps = 4;  // warps (rows) per block of the row kernels

// One warp per (token, head row of D): q and k rows are L2-normalised, v rows copied.
//   conv: [n_tok][(2*Hk + Hv)*D]  q, k: [n_tok][Hk][D]  v: [n_tok][Hv][D]
__global__ void split_qkv_kernel(const float* __restrict__ conv, int64_t n_tok, int64_t n_k_heads,
                                 int64_t n_v_heads, int64_t D, float eps, float* __restrict__ q,
                                 float* __restrict__ k, float* __restrict__ v) {
  const int64_t heads = 2 * n_k_heads + n_v_heads;  // head rows per token
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_tok * heads) return;
  const int64_t t = row / heads, hr = row % heads;
  const float* src = conv + t * heads * D + hr * D;
  float* dst;
  bool norm = true;
  if (hr < n_k_heads) {
    dst = q + (t * n_k_heads + hr) * D;
  } else if (hr < 2 * n_k_heads) {
    dst = k + (t * n_k_heads + hr - n_k_heads) * D;
  } else {
    dst = v + (t * n_v_heads + hr - 2 * n_k_heads) * D;
    norm = false;
  }
  float scale = 1.0f;
  if (norm) {
    float ss = 0.0f;
    for (int64_t i = lane; i < D; i += kWarp) ss = fmaf(src[i], src[i], ss);
    ss = warp_sum(ss);
    scale = 1.0f / fmaxf(sqrtf(ss), eps);  // ggml_l2_norm
  }
  for (int64_t i = lane; i < D; i += kWarp) dst[i] = src[i] * scale;
}

// ---- gated delta rule ------------------------------------------------------------------------------------
//
// Rows of the state are independent: row j of head h (S[h][j][:], the value index j) needs only
//   sk_j = decay * S_j . k,  u_j = beta (v_j - sk_j),  S_j <- decay * S_j + u_j k,  o_j = S_j . q
// so a block takes kDeltaRowsPerBlock rows of one head (grid = Hv x ceil(D / rows per block)) and
// keeps them in registers for all n_tok tokens: each warp owns kDeltaRowsPerWarp rows, lane l holds
// the key elements a = l + 32 e (e < E, E = ceil(D / 32)) of each, so loads of the state, k and q are
// coalesced and each dot product is a warp reduction. State is read once and written once per call.
constexpr int kDeltaWarps = 4;
constexpr int kDeltaRowsPerWarp = 8;
constexpr int kDeltaRowsPerBlock = kDeltaWarps * kDeltaRowsPerWarp;

// One token's inputs of the delta rule as one lane holds them: its key elements of k and q, the v of
// row j0 + lane (lanes < kDeltaRowsPerWarp), the log-decay and beta of the head.
template <int E>
struct DeltaTokenIn {
  float k[E], q[E];
  float v, g, beta;
};

//   q, k: [n_tok][Hk][D]  v: [n_tok][Hv][D]  g, beta: [n_tok][Hv]
template <int E>
__device__ __forceinline__ void load_delta_token(DeltaTokenIn<E>& in, int64_t t, int64_t n_k_heads,
                                                 int64_t n_v_heads, int D, int64_t h, int64_t kh, int j0,
                                                 int lane, const float* __restrict__ q,
                                                 const float* __restrict__ k, const float* __restrict__ v,
                                                 const float* __restrict__ g, const float* __restrict__ beta) {
  const float* kt = k + (t * n_k_heads + kh) * D;
  const float* qt = q + (t * n_k_heads + kh) * D;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int a = lane + kWarp * e;
    in.k[e] = a < D ? kt[a] : 0.0f;
    in.q[e] = a < D ? qt[a] : 0.0f;
  }
  const int j = j0 + lane;
  in.v = (lane < kDeltaRowsPerWarp && j < D) ? v[(t * n_v_heads + h) * D + j] : 0.0f;
  in.g = g[t * n_v_heads + h];
  in.beta = beta[t * n_v_heads + h];
}

//   q, k: [n_tok][Hk][D]  v: [n_tok][Hv][D]  g, beta: [n_tok][Hv]  state: [Hv][D][D] (in place)
//   out: [n_tok][Hv][D];  E = ceil(D / 32) key elements per lane (template: state in registers)
template <int E>
__global__ void __launch_bounds__(kDeltaWarps * kWarp)
    delta_rule_kernel(int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int D,
                      const float* __restrict__ q, const float* __restrict__ k,
                      const float* __restrict__ v, const float* __restrict__ g,
                      const float* __restrict__ beta, float q_scale, float* __restrict__ state,
                      float* __restrict__ out) {
  const int64_t h = blockIdx.x;
  const int64_t kh = h / (n_v_heads / n_k_heads);
  const int lane = threadIdx.x % kWarp;
  const int j0 = blockIdx.y * kDeltaRowsPerBlock + (threadIdx.x / kWarp) * kDeltaRowsPerWarp;
  float* S = state + h * int64_t(D) * D;

  float s[kDeltaRowsPerWarp][E];  // s[r][e] = S[j0 + r][lane + 32 e]
#pragma unroll
  for (int r = 0; r < kDeltaRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int j = j0 + r, a = lane + kWarp * e;
      s[r][e] = (j < D && a < D) ? S[int64_t(j) * D + a] : 0.0f;
    }

  // Token t's inputs, loaded one token ahead (the loop is serial in t: this hides the load latency
  // behind the previous token's arithmetic). Lane r < kDeltaRowsPerWarp holds v of row j0 + r.
  DeltaTokenIn<E> cur{}, nxt{};
  load_delta_token(cur, 0, n_k_heads, n_v_heads, D, h, kh, j0, lane, q, k, v, g, beta);
  for (int64_t t = 0; t < n_tok; ++t) {
    if (t + 1 < n_tok) load_delta_token(nxt, t + 1, n_k_heads, n_v_heads, D, h, kh, j0, lane, q, k, v, g, beta);
    const float decay = expf(cur.g);
    float sk[kDeltaRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        s[r][e] *= decay;
        acc = fmaf(s[r][e], cur.k[e], acc);
      }
      sk[r] = acc;
    }
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r) sk[r] = warp_sum(sk[r]);
    float o[kDeltaRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r) {
      const float vj = __shfl_sync(0xffffffffu, cur.v, r);  // v of row j0 + r (0 past D)
      const float u = j0 + r < D ? cur.beta * (vj - sk[r]) : 0.0f;
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        s[r][e] = fmaf(u, cur.k[e], s[r][e]);
        acc = fmaf(s[r][e], cur.q[e], acc);
      }
      o[r] = acc;
    }
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r) o[r] = warp_sum(o[r]);
    float* ot = out + (t * n_v_heads + h) * D;
    // Lane r writes row j0 + r's output (all lanes hold every sum after the xor reduction).
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r)
      if (lane == r && j0 + r < D) ot[j0 + r] = o[r] * q_scale;
    cur = nxt;
  }

#pragma unroll
  for (int r = 0; r < kDeltaRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int j = j0 + r, a = lane + kWarp * e;
      if (j < D && a < D) S[int64_t(j) * D + a] = s[r][e];
    }
}

struct DeltaArgs {
  int64_t n_tok, n_k_heads, n_v_heads;  // tokens, Hk, Hv
  int D;                                // head size
  const float *q, *k;                   // [n_tok][Hk][D]
  const float* v;                       // [n_tok][Hv][D]
  const float *g, *beta;                // [n_tok][Hv]
  float q_scale;
  float* state;                         // [Hv][D][D], in place
  float* out;                           // [n_tok][Hv][D]
};

template <int E>
void launch_delta(const DeltaArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.n_v_heads), unsigned((a.D + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock));
  delta_rule_kernel<E><<<grid, kDeltaWarps * kWarp, 0, stream>>>(a.n_tok, a.n_k_heads, a.n_v_heads, a.D, a.q,
                                                                 a.k, a.v, a.g, a.beta, a.q_scale, a.state,
                                                                 a.out);
  CUDA_CHECK_LAUNCH();
}

// ---- gated RMSNorm ---------------------------------------------------------------------------------------

// One warp per row; each lane re-reads x[i] and writes y[i] for the same i after the reduction, so y
// may alias x.   x, z, y: [n_rows][D]  w: [D]
__global__ void gated_rms_norm_kernel(const float* x, const float* __restrict__ z,
                                      const float* __restrict__ w, int64_t n_rows, int64_t D, float eps,
                                      float* y) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n_rows) return;
  const float* xr = x + row * D;
  const float* zr = z + row * D;
  float* yr = y + row * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += kWarp) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  const float scale = 1.0f / sqrtf(ss / float(D) + eps);
  for (int64_t i = lane; i < D; i += kWarp) yr[i] = xr[i] * scale * w[i] * silu_f(zr[i]);
}

// ---- gated attention, shared expert gate -----------------------------------------------------------------

// One thread per output element.   qg: [n_tok*H][2*D]  q, gate: [n_tok*H][D]
__global__ void split_q_gate_kernel(const float* __restrict__ qg, int64_t n_rows, int64_t D,
                                    float* __restrict__ q, float* __restrict__ gate) {
  const int64_t n = n_rows * D;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / D, i = idx % D;
    q[idx] = qg[r * 2 * D + i];
    gate[idx] = qg[r * 2 * D + D + i];
  }
}

// x[i] *= sigmoid(gate[i])   x, gate: [n]
__global__ void mul_sigmoid_kernel(float* __restrict__ x, const float* __restrict__ gate, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= sigmoid_f(gate[i]);
}

// y[t][i] += sigmoid(logit[t]) * x[t][i]   y, x: [n_tok][n]  logit: [n_tok]
__global__ void add_sigmoid_scaled_kernel(float* __restrict__ y, const float* __restrict__ x,
                                          const float* __restrict__ logit, int64_t n_tok, int64_t n) {
  const int64_t total = n_tok * n;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x)
    y[idx] = fmaf(sigmoid_f(logit[idx / n]), x[idx], y[idx]);
}

constexpr int kThreads = 256;  // elementwise kernels

void check_heads(const char* op, int64_t n_k_heads, int64_t n_v_heads, int64_t D) {
  STRATA_REQUIRE(n_k_heads > 0 && n_v_heads > 0 && D > 0,
                 "cuda gdn {}: bad shape (Hk {}, Hv {}, D {})", op, n_k_heads, n_v_heads, D);
  STRATA_REQUIRE(n_v_heads % n_k_heads == 0, "cuda gdn {}: {} value heads is not a multiple of {} key heads",
                 op, n_v_heads, n_k_heads);
}

}  // namespace

void conv1d_silu(const float* x, int64_t n_tok, int64_t C, int K, float* state, const float* w, float* y,
                 cudaStream_t stream) {
  STRATA_REQUIRE(K >= 1 && C > 0 && n_tok >= 0, "cuda conv1d: bad shape (K {}, C {}, n_tok {})", K, C, n_tok);
  STRATA_REQUIRE(x != y, "cuda conv1d: y must not alias x");
  if (n_tok == 0) return;
  const int64_t tiles = (n_tok + kConvTokens - 1) / kConvTokens;
  STRATA_REQUIRE(tiles <= 65535, "cuda conv1d: {} tokens in one call is more than {}", n_tok,
                 int64_t(65535) * kConvTokens);
  const dim3 grid(unsigned((C + kConvThreads - 1) / kConvThreads), unsigned(tiles));
  conv1d_silu_kernel<<<grid, kConvThreads, 0, stream>>>(x, n_tok, C, K, state, w, y);
  CUDA_CHECK_LAUNCH();
  if (K > 1) {
    conv_roll_state_kernel<<<blocks_for(C, kConvThreads), kConvThreads, 0, stream>>>(x, n_tok, C, K, state);
    CUDA_CHECK_LAUNCH();
  }
}

void gates(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, const float* a,
           const float* dt_bias, float* g, float* beta, cudaStream_t stream) {
  check_heads("gates", n_k_heads, n_v_heads, 1);
  STRATA_REQUIRE(n_tok >= 0, "cuda gdn gates: n_tok {} < 0", n_tok);
  if (n_tok == 0) return;
  gates_kernel<<<blocks_for(n_tok * n_v_heads, kThreads), kThreads, 0, stream>>>(
      ba, n_tok, n_v_heads, n_v_heads / n_k_heads, a, dt_bias, g, beta);
  CUDA_CHECK_LAUNCH();
}

void split_qkv(const float* conv, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D, float eps,
               float* q, float* k, float* v, cudaStream_t stream) {
  check_heads("split_qkv", n_k_heads, n_v_heads, D);
  STRATA_REQUIRE(n_tok >= 0, "cuda gdn split_qkv: n_tok {} < 0", n_tok);
  if (n_tok == 0) return;
  const int64_t rows = n_tok * (2 * n_k_heads + n_v_heads);
  const int64_t blocks = (rows + kRowWarps - 1) / kRowWarps;
  STRATA_REQUIRE(blocks <= INT32_MAX, "cuda gdn split_qkv: {} rows is too many", rows);
  split_qkv_kernel<<<unsigned(blocks), kRowWarps * kWarp, 0, stream>>>(conv, n_tok, n_k_heads, n_v_heads, D,
                                                                        eps, q, k, v);
  CUDA_CHECK_LAUNCH();
}

void delta_rule(int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim, const float* q,
                const float* k, const float* v, const float* g, const float* beta, float q_scale,
                float* state, float* out, cudaStream_t stream) {
  check_heads("delta_rule", n_k_heads, n_v_heads, head_dim);
  STRATA_REQUIRE(n_tok >= 0, "cuda gated delta rule: n_tok {} < 0", n_tok);
  STRATA_REQUIRE(head_dim <= 8 * kWarp, "cuda gated delta rule: head size {} > {} is not supported", head_dim,
                 8 * kWarp);
  STRATA_REQUIRE(n_v_heads <= INT32_MAX, "cuda gated delta rule: {} value heads", n_v_heads);
  if (n_tok == 0) return;
  const int D = int(head_dim);
  // Dispatch on key elements per lane (state registers per row): E = ceil(D / 32).
  const int E = (D + kWarp - 1) / kWarp;
  const DeltaArgs a{n_tok, n_k_heads, n_v_heads, D, q, k, v, g, beta, q_scale, state, out};
  if (E == 1)
    launch_delta<1>(a, stream);
  else if (E == 2)
    launch_delta<2>(a, stream);
  else if (E <= 4)
    launch_delta<4>(a, stream);
  else
    launch_delta<8>(a, stream);
}

void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D, float eps,
                    float* y, cudaStream_t stream) {
  STRATA_REQUIRE(n_rows >= 0 && D > 0, "cuda gated rms norm: bad shape (rows {}, D {})", n_rows, D);
  if (n_rows == 0) return;
  const int64_t blocks = (n_rows + kRowWarps - 1) / kRowWarps;
  STRATA_REQUIRE(blocks <= INT32_MAX, "cuda gated rms norm: {} rows is too many", n_rows);
  gated_rms_norm_kernel<<<unsigned(blocks), kRowWarps * kWarp, 0, stream>>>(x, z, w, n_rows, D, eps, y);
  CUDA_CHECK_LAUNCH();
}

void split_q_gate(const float* qg, int64_t n_tok, int64_t n_head, int64_t D, float* q, float* gate,
                  cudaStream_t stream) {
  STRATA_REQUIRE(n_tok >= 0 && n_head > 0 && D > 0, "cuda split_q_gate: bad shape (n_tok {}, H {}, D {})", n_tok,
                 n_head, D);
  if (n_tok == 0) return;
  split_q_gate_kernel<<<blocks_for(n_tok * n_head * D, kThreads), kThreads, 0, stream>>>(qg, n_tok * n_head, D,
                                                                                         q, gate);
  CUDA_CHECK_LAUNCH();
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  STRATA_REQUIRE(n >= 0, "cuda mul_sigmoid: n {} < 0", n);
  if (n == 0) return;
  mul_sigmoid_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, gate, n);
  CUDA_CHECK_LAUNCH();
}

void add_sigmoid_scaled(float* y, const float* x, const float* logit, int64_t n_tok, int64_t n,
                        cudaStream_t stream) {
  STRATA_REQUIRE(n_tok >= 0 && n >= 0, "cuda add_sigmoid_scaled: bad shape (n_tok {}, n {})", n_tok, n);
  if (n_tok == 0 || n == 0) return;
  add_sigmoid_scaled_kernel<<<blocks_for(n_tok * n, kThreads), kThreads, 0, stream>>>(y, x, logit, n_tok, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::gdn
