// The small ops of the forward pass on the GPU (declarations and contracts in cuda/ops.cuh). Each kernel
// follows the arithmetic of its CPU reference in cpu/ops.cpp (engine/sampling.cpp for sample) up to the
// order of sums; where the CPU calls glibc's expf/logf/cosf/sinf we evaluate in double and round to f32,
// which gives the correctly rounded value (glibc's are within ~0.5 ulp), so both sides agree bit for bit
// almost always. No op allocates: scratch comes from the caller.
#include "cuda/ops.cuh"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <cub/block/block_scan.cuh>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/attn_tile.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/route_key.cuh"

namespace strata::cuda::ops {

namespace {

constexpr int kMaxHeadDimGpu = 256;  // attention: largest head size (8 values per lane)

__device__ __forceinline__ float exp_cr(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ float h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction, result in every thread. sh: [32] shared scratch. Call from all threads.
template <typename T, typename Op>
__device__ T block_reduce(T v, T* sh, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = sh[0];
  for (int w = 1; w < n_warps; ++w) r = op(r, sh[w]);
  return r;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// ---------------------------------------------------------------- elementwise and norms

// x, y: [n_rows][n]; w: [n]. One block per row; the sum of squares in double as the CPU (ggml_float).
// Launched with PDL (pdl.cuh): w (a weight) goes towards L2 while the kernel ahead still runs.
__global__ void rmsnorm_kernel(const float* x, const float* w, int64_t n, float eps, float* y) {
  __shared__ double sh[32];
  const float* xr = x + blockIdx.x * n;   // [n]
  float* yr = y + blockIdx.x * n;         // [n]
  for (int64_t i = int64_t(threadIdx.x) * 32; i < n; i += int64_t(blockDim.x) * 32) prefetch_l2(w + i);
  pdl_wait();
  pdl_launch_dependents();
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(xr[i]) * xr[i];
  s = block_reduce(s, sh, SumOp{});
  const float mean = static_cast<float>(s / static_cast<double>(n));
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// x: [n_tok][n_head][head_dim] in place; pos: [n_tok]. One block per token. The angles are built as the
// CPU builds them: theta_0 = pos, theta_{i+1} = theta_i * theta_scale in f32 (theta_scale computed on
// the host with the same std::pow), then cos/sin correctly rounded.
__global__ void rope_neox_kernel(float* x, const int32_t* pos, int n_head, int head_dim, int n_rot,
                                 float theta_scale) {
  __shared__ float cs[cpu::kMaxRot];  // [n_rot/2][cos, sin]
  const int half = n_rot / 2;
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = static_cast<float>(pos[t]);
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    cs[2 * i] = static_cast<float>(cos(static_cast<double>(theta)));
    cs[2 * i + 1] = static_cast<float>(sin(static_cast<double>(theta)));
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_head * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float* xh = x + (t * n_head + h) * head_dim;
    const float x0 = xh[i], x1 = xh[i + half];
    const float c = cs[2 * i], s = cs[2 * i + 1];
    // The FMAs of cpu::rope_neox (llama.cpp's CPU build), written out: left to the compiler, x0*s + x1*c
    // became fma(x1, c, x0*s) (PTX), a last-bit difference from the CPU; ops_fused.cu uses the same form.
    xh[i] = fmaf(x0, c, -(x1 * s));
    xh[i + half] = fmaf(x0, s, x1 * c);
  }
}

// gate, up, out: [n]
__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_cr(-g)) * up[i];
  }
}

// x, y: [n]
__global__ void add_kernel(float* x, const float* y, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// k: [n_tok][k_row] f32, v: [n_tok][v_row] f32, refs: [n_tok]. grid (ceil(max_row/256), n_tok).
__global__ void kv_store_kernel(const float* k, const float* v, const KvRef* refs, int layer, int64_t k_row,
                                int64_t v_row) {
  const int64_t t = blockIdx.y;
  const KvRef r = refs[t];
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t at = static_cast<int64_t>(layer) * r.n_ctx + r.pos;  // row index in [n_layer][n_ctx]
  if (i < k_row) r.k[at * k_row + i] = __half_as_ushort(__float2half_rn(k[t * k_row + i]));
  if (i < v_row) r.v[at * v_row + i] = __half_as_ushort(__float2half_rn(v[t * v_row + i]));
}

// ---------------------------------------------------------------- attention

// Lane `lane` holds dims [lane*DPL, lane*DPL + DPL) of a head row of n f16 values (zeros past n).
// Vector loads when the row is full width and aligned (the common head_dim = 32*DPL case).
template <int DPL>
__device__ __forceinline__ void load_row_f16(const uint16_t* row, int lane, int n, float (&x)[DPL]) {
  const int d0 = lane * DPL;
  const bool vec = DPL >= 2 && n == 32 * DPL &&
                   (reinterpret_cast<uintptr_t>(row) & (2 * DPL - 1)) == 0;
  if (vec) {
    if constexpr (DPL == 2) {
      const __half2 h = *reinterpret_cast<const __half2*>(row + d0);
      const float2 f = __half22float2(h);
      x[0] = f.x;
      x[1] = f.y;
    } else if constexpr (DPL == 4) {
      const uint2 u = *reinterpret_cast<const uint2*>(row + d0);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      x[0] = a.x; x[1] = a.y; x[2] = b.x; x[3] = b.y;
    } else if constexpr (DPL == 8) {
      const uint4 u = *reinterpret_cast<const uint4*>(row + d0);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        x[2 * j] = f.x;
        x[2 * j + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < DPL; ++j) x[j] = d0 + j < n ? h2f(row[d0 + j]) : 0.0f;
  }
}

constexpr int kGgmlWarps = 4;  // warps per block of the GgmlF16 kernel

// llama.cpp's CPU flash-attention arithmetic (cpu::attention GgmlF16), one warp per (token, head),
// positions in order. q: [n_tok][n_head][head_dim]; refs: [n_tok]; out: [n_tok][n_head][head_dim_v].
// grid: ceil(n_tok*n_head / kGgmlWarps) blocks of 32*kGgmlWarps threads.
template <int DPL>
__global__ void attn_ggml_f16_kernel(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head,
                                     int n_head_kv, int head_dim, int head_dim_v, float scale, float* out) {
  const int lane = threadIdx.x & 31;
  const int64_t wi = blockIdx.x * int64_t(kGgmlWarps) + (threadIdx.x >> 5);
  if (wi >= n_tok * n_head) return;
  const int64_t t = wi / n_head;
  const int h = static_cast<int>(wi % n_head), hk = h / (n_head / n_head_kv);
  const KvRef r = refs[t];
  const int64_t k_row = int64_t(n_head_kv) * head_dim, v_row = int64_t(n_head_kv) * head_dim_v;
  const uint16_t* kb = r.k + int64_t(layer) * r.n_ctx * k_row + int64_t(hk) * head_dim;    // + p*k_row
  const uint16_t* vb = r.v + int64_t(layer) * r.n_ctx * v_row + int64_t(hk) * head_dim_v;  // + p*v_row
  const float* qh = q + wi * head_dim;
  float q16[DPL], acc[DPL];
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    const int d = lane * DPL + j;
    q16[j] = d < head_dim ? round_f16(qh[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  // Positions go in groups of U: the group's K and V rows are loaded (and its dot products reduced)
  // up front, then the online-softmax updates run one position at a time in order, exactly as on the
  // CPU. Why: a warp walking one position at a time waits a full memory latency per position.
  // Why the prefetch: the next group's rows are requested before this group's sequential updates run,
  // so their latency hides behind the exp/round chain (the arithmetic and its order are unchanged).
  constexpr int U = DPL <= 4 ? 8 : 4;
  float M = -INFINITY, S = 0.0f;
  float kx[U][DPL], vx[U][DPL];
  auto load_group = [&](int32_t p0, float (&kd)[U][DPL], float (&vd)[U][DPL]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t p = p0 + u <= r.pos ? p0 + u : r.pos;  // past the end: a harmless re-read, unused
      load_row_f16<DPL>(kb + p * k_row, lane, head_dim, kd[u]);
      load_row_f16<DPL>(vb + p * v_row, lane, head_dim_v, vd[u]);
    }
  };
  load_group(0, kx, vx);
  for (int32_t p0 = 0; p0 <= r.pos; p0 += U) {
    float dot[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < DPL; ++j) d = fmaf(q16[j], kx[u][j], d);
      dot[u] = warp_reduce(d, SumOp{});
    }
    const bool more = p0 + U <= r.pos;
    float kn[U][DPL], vn[U][DPL];
    if (more) load_group(p0 + U, kn, vn);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (p0 + u > r.pos) break;
      const float s = dot[u] * scale;
      float ms = 1.0f, vs = 1.0f;
      if (s > M) {
        const float m_old = M;
        M = s;
        ms = exp_cr(m_old - M);
#pragma unroll
        for (int j = 0; j < DPL; ++j) acc[j] = round_f16(acc[j] * ms);
      } else {
        vs = exp_cr(s - M);
      }
#pragma unroll
      for (int j = 0; j < DPL; ++j) acc[j] = round_f16(fmaf(vx[u][j], vs, acc[j]));
      S = S * ms + vs;
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < DPL; ++j) {
          kx[u][j] = kn[u][j];
          vx[u][j] = vn[u][j];
        }
    }
  }
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  float* oh = out + wi * head_dim_v;
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    const int d = lane * DPL + j;
    if (d < head_dim_v) oh[d] = acc[j] * inv;
  }
}

constexpr int kSplitWarps = 4;     // warps per block of the per-warp flash-decoding kernel
constexpr int kMaxSplits = 128;    // positions of a sequence are split over at most this many blocks
constexpr int kTargetBlocks = 264; // blocks a call aims at: two per SM of an H200 (132 SMs)

// The split count: enough blocks to fill the GPU (about kTargetBlocks) counting the blocks the tokens
// already give (n_tok * n_head query rows, attn_tile::rows_per_block of them per block), and never a
// split shorter than one K/V tile. Why: a short context split over 128 blocks of a few positions spends
// its time in launch, partial writes and the combine; a long prefill needs no split at all.
// Rule 1 (the default, attn_split_rule()): a call whose rows already give at least one block per SM
// (kTargetBlocks / 2) is not split: such a call is a prefill, whose causal tiles the tensor-core kernel
// takes longest first, and a split there only adds the partial writes and the combine (ncu, session 29,
// 512 tokens of the 30B-A3B geometry: 2 splits and the combine's 21.7 us a layer). Rule 0: the old rule.
// Depends only on (n_tok, n_head, max_kv) and the rule; attention_scratch_floats() sizes for rule 0, which
// never gives fewer splits.
int attn_splits_by(int64_t n_tok, int n_head, int64_t max_kv, int rule) {
  const int64_t rows = std::max<int64_t>(1, n_tok) * n_head;
  const int64_t base = (rows + attn_tile::rows_per_block(n_tok) - 1) / attn_tile::rows_per_block(n_tok);
  if (rule == 1 && base >= kTargetBlocks / 2) return 1;
  const int64_t by_work = (kTargetBlocks + base - 1) / base;
  const int64_t by_len = (std::max<int64_t>(max_kv, 1) + attn_tile::kTileKv - 1) / attn_tile::kTileKv;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({by_len, by_work, int64_t(kMaxSplits)})));
}

DigitSetting g_split_rule("STRATA_CUDA_ATTN_SPLIT_RULE", "attention split rule", 0, 1, 1);

int attn_splits(int64_t n_tok, int n_head, int64_t max_kv) {
  return attn_splits_by(n_tok, n_head, max_kv, g_split_rule.get());
}

// Flash-decoding, phase 1. One block per (token, KV head, group tile of GT query heads, split): the
// block's warps take the split's positions round-robin, each keeping an online-softmax state (max m,
// sum s, acc) per query head in f32; the warps' states are merged and written to
// part: [n_tok*n_head][n_split][2 + head_dim_v] = (m, s, acc[head_dim_v]).
// q: [n_tok][n_head][head_dim]; refs: [n_tok]; chunk: positions per split (the last split takes the rest).
// Why a group tile: the query heads that share a KV head read each K/V row once (GQA).
// grid: (n_tok * n_head_kv * n_tiles, n_split); block 32*kSplitWarps.
template <int DPL, int GT>
__global__ void __launch_bounds__(32 * kSplitWarps)
    attn_split_kernel(const float* q, const KvRef* refs, int layer, int n_head, int n_head_kv, int head_dim,
                      int head_dim_v, float scale, int n_split, int chunk, float* part) {
  __shared__ float sm_m[kSplitWarps][GT], sm_s[kSplitWarps][GT];
  __shared__ float sm_acc[kSplitWarps][GT][32 * DPL];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = n_head / n_head_kv, n_tiles = (group + GT - 1) / GT;
  const int64_t bx = blockIdx.x;
  const int64_t t = bx / (int64_t(n_head_kv) * n_tiles);
  const int hk = static_cast<int>((bx / n_tiles) % n_head_kv), g0 = static_cast<int>(bx % n_tiles) * GT;
  const int ng = min(GT, group - g0);
  const int split = blockIdx.y;
  const KvRef r = refs[t];
  const int n_kv = r.pos + 1;
  const int p_begin = split * chunk;
  // The last split also takes any positions past n_split*chunk (a token beyond max_kv): correct, slower.
  const int p_end = split == n_split - 1 ? n_kv : min(n_kv, p_begin + chunk);
  const int64_t k_row = int64_t(n_head_kv) * head_dim, v_row = int64_t(n_head_kv) * head_dim_v;
  const uint16_t* kb = r.k + int64_t(layer) * r.n_ctx * k_row + int64_t(hk) * head_dim;
  const uint16_t* vb = r.v + int64_t(layer) * r.n_ctx * v_row + int64_t(hk) * head_dim_v;
  const int h0 = hk * group + g0;  // first query head of the tile

  float qv[GT][DPL], acc[GT][DPL], m[GT], s[GT];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = -INFINITY;
    s[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const int d = lane * DPL + j;
      qv[g][j] = g < ng && d < head_dim ? q[(t * n_head + h0 + g) * head_dim + d] * scale : 0.0f;
      acc[g][j] = 0.0f;
    }
  }
  // Each warp takes U of its positions per step (p, p + kSplitWarps, ...): U K/V rows in flight at
  // once, then one max update and U accumulations per query head. Why: one row at a time leaves too
  // few bytes in flight per SM to reach HBM bandwidth.
  constexpr int U = DPL <= 4 ? 4 : 2;
  for (int p = p_begin + warp; p < p_end; p += kSplitWarps * U) {
    float kx[U][DPL], vx[U][DPL], dot[U][GT];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pu = p + u * kSplitWarps;
      valid[u] = pu < p_end;
      const int pl = valid[u] ? pu : p;  // past the end: a harmless re-read, unused
      load_row_f16<DPL>(kb + pl * k_row, lane, head_dim, kx[u]);
      load_row_f16<DPL>(vb + pl * v_row, lane, head_dim_v, vx[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; ++j) d = fmaf(qv[g][j], kx[u][j], d);
        dot[u][g] = warp_reduce(d, SumOp{});
      }
    }
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) m_new = fmaxf(m_new, dot[u][g]);
      const float c = expf(m[g] - m_new);  // 0 while m was -inf (position p is always valid)
      s[g] *= c;
#pragma unroll
      for (int j = 0; j < DPL; ++j) acc[g][j] *= c;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!valid[u]) continue;
        const float e = expf(dot[u][g] - m_new);
        s[g] += e;
#pragma unroll
        for (int j = 0; j < DPL; ++j) acc[g][j] = fmaf(e, vx[u][j], acc[g][j]);
      }
      m[g] = m_new;
    }
  }
  // Merge the warps' states.
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_s[warp][g] = s[g];
    }
#pragma unroll
    for (int j = 0; j < DPL; ++j) sm_acc[warp][g][lane * DPL + j] = acc[g][j];
  }
  __syncthreads();
  const int row = 2 + head_dim_v;
  for (int e = threadIdx.x; e < ng * (head_dim_v + 2); e += blockDim.x) {
    const int g = e / (head_dim_v + 2), i = e % (head_dim_v + 2);  // i: 0 = m, 1 = s, 2.. = acc
    float M = -INFINITY;
    for (int w = 0; w < kSplitWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float v = 0.0f;
    if (i == 0) {
      v = M;
    } else if (M != -INFINITY) {
      for (int w = 0; w < kSplitWarps; ++w) {
        if (sm_m[w][g] == -INFINITY) continue;  // a warp without positions
        const float c = expf(sm_m[w][g] - M);
        v += c * (i == 1 ? sm_s[w][g] : sm_acc[w][g][i - 2]);
      }
    }
    part[((t * n_head + h0 + g) * n_split + split) * row + i] = v;
  }
}

// Flash-decoding, phase 2: merges the n_split partial states of each (token, head).
// part: [n_tok*n_head][n_split][2 + head_dim_v]; out: [n_tok][n_head][head_dim_v]. One block per row.
// Compact (the default): the value loop runs only over the splits that saw positions (m > -inf), listed
// in order by warp 0. Why: a decode graph is built for the whole context (max_kv = n_ctx), so at a short
// context nearly all of the ~64 splits are empty, and the old loop read all of them (64 x 128 floats per
// row, one dependent add each). An empty split adds c * acc = 0 * 0, so skipping it leaves every sum the
// same (up to the sign of an exact zero). !Compact: the first kernel (STRATA_CUDA_ATTN_COMBINE=all).
// Q8 (xq != null): the row is also written as Q8 activations of [rows][head_dim_v] (q8_kernels.cuh layout;
// head_dim_v % 32 == 0, so warp w's 32 values of a pass are one quantization block), the same bits as
// q8::quantize of `out` would give (quantize_warp on the same floats).
template <bool Compact, bool Q8>
__global__ void attn_combine_kernel(const float* part, int n_split, int head_dim_v, float* out, int8_t* xq,
                                    float2* xds) {
  __shared__ float w[kMaxSplits];
  __shared__ int live[kMaxSplits];
  __shared__ float s_total;
  __shared__ int n_live;
  pdl_wait();
  pdl_launch_dependents();
  const int row = 2 + head_dim_v;
  const float* pr = part + blockIdx.x * int64_t(n_split) * row;
  if (threadIdx.x < 32) {
    float M = -INFINITY;
    for (int i = threadIdx.x; i < n_split; i += 32) M = fmaxf(M, pr[i * row]);
    M = warp_reduce(M, MaxOp{});
    float S = 0.0f;
    int base = 0;
    for (int i0 = 0; i0 < n_split; i0 += 32) {  // warp-uniform trip count
      const int i = i0 + int(threadIdx.x);
      const float mi = i < n_split ? pr[i * row] : -INFINITY;
      const float c = mi == -INFINITY ? 0.0f : expf(mi - M);
      if (i < n_split) {
        w[i] = c;
        S += c * pr[i * row + 1];
      }
      if constexpr (Compact) {
        const unsigned b = __ballot_sync(0xffffffffu, mi != -INFINITY);
        if (mi != -INFINITY) live[base + __popc(b & ((1u << threadIdx.x) - 1u))] = i;
        base += __popc(b);
      }
    }
    S = warp_reduce(S, SumOp{});
    if (threadIdx.x == 0) {
      s_total = S;
      n_live = base;
    }
  }
  __syncthreads();
  const float inv = s_total == 0.0f ? 0.0f : 1.0f / s_total;
  // (trip count uniform per warp when Q8: head_dim_v and blockDim are multiples of 32)
  for (int d = threadIdx.x; d < head_dim_v; d += blockDim.x) {
    float a = 0.0f;
    if constexpr (Compact) {
      for (int j = 0; j < n_live; ++j) {
        const int i = live[j];
        a += w[i] * pr[i * row + 2 + d];
      }
    } else {
      for (int i = 0; i < n_split; ++i) a += w[i] * pr[i * row + 2 + d];
    }
    const int64_t f = blockIdx.x * int64_t(head_dim_v) + d;
    out[f] = a * inv;
    if constexpr (Q8) q8c::quantize_warp(a * inv, xq + (f - (threadIdx.x & 31)), xds + f / 32);
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// The combine kernel to launch: compact unless the environment sets STRATA_CUDA_ATTN_COMBINE=all (read
// once); with Q8 output when xq != null.
void launch_combine(const float* part, int64_t rows, int n_split, int head_dim_v, float* out, int8_t* xq,
                    float2* xds, cudaStream_t stream) {
  static const bool all = [] {
    const char* e = std::getenv("STRATA_CUDA_ATTN_COMBINE");
    return e != nullptr && std::string(e) == "all";
  }();
  const unsigned grid = static_cast<unsigned>(rows);
  auto* kern = xq != nullptr ? (all ? attn_combine_kernel<false, true> : attn_combine_kernel<true, true>)
                             : (all ? attn_combine_kernel<false, false> : attn_combine_kernel<true, false>);
  pdl::launch(kern, grid, 128, 0, stream, part, n_split, head_dim_v, out, xq, xds);
}

int lanes_per_dim(int head_dim, int head_dim_v) {  // DPL: values per lane covering both head sizes
  const int d = std::max(head_dim, head_dim_v);
  return d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : 8;
}

// The tiled kernel (K/V through shared memory, shared by all query rows of a block) and, over more than one
// split, the combine. Splits are whole K/V tiles, so fewer than attn_splits may be needed; one split writes
// `out` itself (no combine launch), and its Q8 activations in the decode shape. prep: as attn_tile::launch.
// Returns whether xq/xds were written (only when xq != null: by the combine kernel or the one split).
bool launch_tiled(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                  int head_dim, int head_dim_v, float scale, int64_t max_kv, float* scratch, float* out, int8_t* xq,
                  float2* xds, cudaStream_t stream, const attn_tile::Prep* prep = nullptr, bool one_cache = false) {
  const int n_split = attn_splits(n_tok, n_head, max_kv);
  const int64_t per = (max_kv + n_split - 1) / n_split;
  const int chunk = static_cast<int>((per + attn_tile::kTileKv - 1) / attn_tile::kTileKv * attn_tile::kTileKv);
  const int used = static_cast<int>((max_kv + chunk - 1) / chunk);
  const bool q8_done = attn_tile::launch(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, scale, used, chunk,
                                        scratch, out, xq, xds, stream, prep, one_cache);  // (xq: one split only)
  if (used == 1) return q8_done;
  launch_combine(scratch, n_tok * n_head, used, head_dim_v, out, xq, xds, stream);
  return xq != nullptr;
}

// Returns whether xq/xds were written (only when xq != null and the call ended in the combine kernel).
template <int DPL>
bool launch_attention(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                      int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv,
                      float* scratch, float* out, int8_t* xq, float2* xds, cudaStream_t stream, bool one_cache) {
  if (math == cpu::AttnMath::GgmlF16) {
    const int64_t warps = n_tok * n_head;
    const unsigned blocks = static_cast<unsigned>((warps + kGgmlWarps - 1) / kGgmlWarps);
    attn_ggml_f16_kernel<DPL><<<blocks, 32 * kGgmlWarps, 0, stream>>>(q, refs, n_tok, layer, n_head, n_head_kv,
                                                                      head_dim, head_dim_v, scale, out);
    CUDA_CHECK_LAUNCH();
    return false;
  }
  if (attn_tile::supported(head_dim, head_dim_v))
    return launch_tiled(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, max_kv, scratch, out,
                        xq, xds, stream, nullptr, one_cache);
  const int n_split = attn_splits(n_tok, n_head, max_kv);
  constexpr int GT = DPL <= 4 ? 8 : 4;  // query heads per block: registers bound it at 8 values per lane
  const int chunk = static_cast<int>((max_kv + n_split - 1) / n_split);
  const int group = n_head / n_head_kv, n_tiles = (group + GT - 1) / GT;
  const dim3 grid(static_cast<unsigned>(n_tok * n_head_kv * n_tiles), static_cast<unsigned>(n_split));
  attn_split_kernel<DPL, GT><<<grid, 32 * kSplitWarps, 0, stream>>>(q, refs, layer, n_head, n_head_kv, head_dim,
                                                                   head_dim_v, scale, n_split, chunk, scratch);
  CUDA_CHECK_LAUNCH();
  launch_combine(scratch, n_tok * n_head, n_split, head_dim_v, out, xq, xds, stream);
  return xq != nullptr;
}

// ---------------------------------------------------------------- routing and sampling

// Shared memory of route_token.
struct RouteShared {
  float p[cpu::kMaxExperts];        // the token's probabilities
  uint64_t key[cpu::kMaxExperts];   // their order keys, padded to a multiple of 32
  float red[32];
  float sel[64];                    // [k] chosen probabilities in rank order
  float inv, wsum;
};

// moe_route of one token by the whole block (blockDim a multiple of 32; threads take experts e = tid,
// tid + blockDim, ...). lr: [n_expert] (read through L2: it may have been written by other blocks of the
// same launch); ids, weights: [k]. The softmax keeps the arithmetic and order of the first GPU kernel
// (max, exp_cr, the double sum lane by lane then the xor butterfly of warp 0), so the weights are the same
// bits. Top-k by rank: an expert's rank is the number of order keys above its own (keys are unique: value
// desc, id asc, as the CPU's partial_sort), so the k first are found in one parallel pass instead of k
// rounds of a warp-wide arg-max. Ends with a barrier (sh may be reused at once).
__device__ void route_token(const float* lr, int n_expert, int k, bool norm, int32_t* ids, float* weights,
                            RouteShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, nt = blockDim.x;
  float mx = -INFINITY;
  for (int e = tid; e < n_expert; e += nt) {
    const float l = __ldcg(lr + e);  // one L2 round trip: each logit is read once
    sh.p[e] = l;
    mx = fmaxf(mx, l);
  }
  mx = block_reduce(mx, sh.red, MaxOp{});  // exact whatever the order
  for (int e = tid; e < n_expert; e += nt) sh.p[e] = exp_cr(sh.p[e] - mx);  // (only this thread wrote p[e])
  __syncthreads();
  if (tid < 32) {
    double sum = 0.0;
    for (int i = lane; i < n_expert; i += 32) sum += sh.p[i];
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) sh.inv = static_cast<float>(1.0 / sum);
  }
  __syncthreads();
  // A NaN probability and the padding get keys below every real one (high half 0; unique by id), so the
  // rank loop needs no bounds or exits.
  const int n_keys = (n_expert + 31) / 32 * 32;
  for (int e = tid; e < n_keys; e += nt) {
    const bool on = e < n_expert;
    const float pe = on ? sh.p[e] * sh.inv : 0.0f;
    if (on) sh.p[e] = pe;  // only this thread reads p[e] from here on
    sh.key[e] = on && pe >= 0.0f ? order_key(pe, static_cast<uint32_t>(e)) : bottom_key(uint32_t(e));
  }
  __syncthreads();
  for (int e = tid; e < n_expert; e += nt) {
    const int rank = key_rank(sh.key, n_keys, sh.key[e]);
    if (rank < k) {
      ids[rank] = static_cast<int32_t>(e);
      sh.sel[rank] = sh.p[e];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float wsum = 0.0f;  // the chosen weights summed in rank order, as the CPU
    for (int j = 0; j < k; ++j) wsum += sh.sel[j];
    sh.wsum = fmaxf(wsum, 6.103515625e-5f);
  }
  __syncthreads();
  for (int j = tid; j < k; j += nt) weights[j] = norm ? sh.sel[j] / sh.wsum : sh.sel[j];
  __syncthreads();
}

// logits: [n_tok][n_expert]; ids, weights: [n_tok][k]. One block per token.
__global__ void moe_route_kernel(const float* logits, int n_expert, int k, bool norm, int32_t* ids,
                                 float* weights) {
  __shared__ RouteShared sh;
  const int64_t t = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  route_token(logits + t * n_expert, n_expert, k, norm, ids + t * k, weights + t * k, sh);
}

constexpr int kRouterWarps = 4;  // router rows per block of router_route

// One F32 row dot product per warp with quant::matmul's arithmetic (dq::warp_row_dot: units of 8 values,
// lane i takes units i, i+32, ..., one FMA chain per lane, then the xor butterfly), unrolled further so a
// lane's loads are all in flight (the order of the FMAs is unchanged). wr: [cols] f32; xr: [cols].
template <int A>
__device__ __forceinline__ float router_row_dot(const uint8_t* wr, int64_t cols, const float* xr, bool xvec) {
  using F = dq::Fmt<GgmlType::F32>;
  const int lane = threadIdx.x & 31;
  const int units = int(cols / 8);
  float acc = 0.f;
#pragma unroll 8
  for (int u = lane; u < units; u += 32) {
    float v[8], xv[8];
    F::template deq8<A>(wr + int64_t(u) * F::kBytes, 0, v);
    dq::load_x8(xr, int64_t(u) * 8, xvec, xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(v[j], xv[j], acc);
  }
  for (int64_t c = int64_t(units) * 8 + lane; c < cols; c += 32) acc = fmaf(F::one(wr, c), __ldg(xr + c), acc);
  return dq::warp_sum(acc);
}

// The end of a router kernel whose blocks each wrote part of logits ([n_tok][n_expert]): the last block to
// finish (a ticket taken after a fence, as CUDA's threadFenceReduction sample) routes every token into ids
// and weights ([n_tok][k]), one after the other, then zeroes the counter for the next launch (graph replays
// included). Every thread of every block calls it, after its block's last logits write. (Routing a token a
// warp instead, built in session 39, gained nothing at 2 tokens and lost 2% at 8: sessions 41-42.)
__device__ void route_in_last_block(const float* logits, int n_tok, int n_expert, int k, bool norm, int32_t* ids,
                                    float* weights, unsigned* counter, RouteShared& sh) {
  __shared__ bool last;
  __threadfence();  // this block's logits visible to the whole device before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = 0; t < n_tok; ++t)
    route_token(logits + int64_t(t) * n_expert, n_expert, k, norm, ids + int64_t(t) * k, weights + int64_t(t) * k, sh);
  if (threadIdx.x == 0) *counter = 0u;
}

// w: [n_expert][cols] f32 (rb bytes per row); x: [n_tok][cols]; logits: [n_tok][n_expert]; ids, weights:
// [n_tok][k]; counter: one zero uint32 (left zero). grid: ceil(n_expert / kRouterWarps) blocks of
// 32*kRouterWarps. Warp = one router row for every token; the last block to finish (a ticket taken after
// a fence, as CUDA's threadFenceReduction sample) routes the tokens.
template <int A>
__global__ void __launch_bounds__(32 * kRouterWarps)
    router_route_kernel(const uint8_t* w, int n_expert, int64_t cols, int64_t rb, const float* x, int n_tok,
                        bool xvec, int k, bool norm, float* logits, int32_t* ids, float* weights,
                        unsigned* counter) {
  __shared__ RouteShared sh;
  const int r = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (r < n_expert) {
    const uint8_t* wr = w + int64_t(r) * rb;
    for (int t = 0; t < n_tok; ++t) {
      const float s = router_row_dot<A>(wr, cols, x + int64_t(t) * cols, xvec);
      if ((threadIdx.x & 31) == 0) logits[int64_t(t) * n_expert + r] = s;
    }
  }
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
}

// ---- router_route, block per row (the default; RouterRouteKernel::kBlockPerRow).
// Why: the warp-per-row kernel above runs n_expert / 4 blocks (32 for Qwen3's 128 experts: a quarter of
// the H200's SMs) and each lane's 8 KB-per-warp row arrives only as fast as one warp's loads are in
// flight; ncu showed 10 us for 1 MB. Here one block of kRouterRowThreads takes one router row: all its
// threads load the row (one 16-byte load each per 2 KB, so the whole row is one memory round trip) into
// shared memory, then warp w runs the dot products of tokens w, w + 4, ... from there with exactly the
// per-lane order of router_row_dot (lane i takes units i, i+32, ... of 8 values, one FMA chain, then the
// xor butterfly), so the logits are the same bits. Rows longer than kRouterStage floats go in passes of
// kRouterStage (a multiple of 256 floats = 32 units, so a unit keeps its lane across passes).
constexpr int kRouterRowThreads = 128;
constexpr int kRouterStage = 2048;  // floats of a row staged per pass (8 KB)
static_assert(kRouterStage % 256 == 0, "a pass must hold whole rounds of 32 units");
constexpr int kRouterTokPerWarp = int((kRouterRouteMaxTokens + kRouterRowThreads / 32 - 1) / (kRouterRowThreads / 32));

// w: [n_expert][cols] f32 (rb bytes per row, aligned to A); x: [n_tok][cols]; logits: [n_tok][n_expert];
// ids, weights: [n_tok][k]; counter as router_route_kernel. grid: n_expert blocks of kRouterRowThreads.
template <int A>
__global__ void __launch_bounds__(kRouterRowThreads)
    router_route_row_kernel(const uint8_t* __restrict__ w, int n_expert, int64_t cols, int64_t rb,
                            const float* __restrict__ x, int n_tok, bool xvec, int k, bool norm, float* logits,
                            int32_t* ids, float* weights, unsigned* counter) {
  using F = dq::Fmt<GgmlType::F32>;
  __shared__ __align__(16) float row[kRouterStage];
  __shared__ RouteShared sh;
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kRouterRowThreads / 32;
  const uint8_t* wr = w + int64_t(r) * rb;
  const int64_t whole = cols / 8 * 8;  // values in whole units; the rest go by the tail loop
  float acc[kRouterTokPerWarp];
#pragma unroll
  for (int i = 0; i < kRouterTokPerWarp; ++i) acc[i] = 0.f;
  for (int64_t c0 = 0; c0 < whole; c0 += kRouterStage) {
    const int len = int(min(int64_t(kRouterStage), whole - c0));  // a multiple of 8
    if constexpr (A >= 16) {
      const float4* src = reinterpret_cast<const float4*>(wr + c0 * 4);  // 16-byte aligned: rb % 16 == 0
      for (int i = threadIdx.x; i < len / 4; i += kRouterRowThreads) reinterpret_cast<float4*>(row)[i] = __ldg(src + i);
    } else {
      for (int i = threadIdx.x; i < len; i += kRouterRowThreads) row[i] = F::one(wr, c0 + i);
    }
    if (c0 == 0) {  // PDL: the first pass of the row (weights) is loaded while the previous kernel ends
      pdl_wait();
      pdl_launch_dependents();
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRouterTokPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t >= n_tok) break;
      const float* xr = x + int64_t(t) * cols;
      float a = acc[i];
#pragma unroll 4
      for (int u = lane; u < len / 8; u += 32) {
        const float4 p = reinterpret_cast<const float4*>(row)[2 * u], q = reinterpret_cast<const float4*>(row)[2 * u + 1];
        const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        float xv[8];
        dq::load_x8(xr, c0 + int64_t(u) * 8, xvec, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaf(v[j], xv[j], a);
      }
      acc[i] = a;
    }
    __syncthreads();  // row is rewritten by the next pass
  }
  pdl_wait();  // (no-op after the first; the one wait of a row shorter than 8)
#pragma unroll
  for (int i = 0; i < kRouterTokPerWarp; ++i) {
    const int t = warp + i * kWarps;
    if (t >= n_tok) break;
    const float* xr = x + int64_t(t) * cols;
    float a = acc[i];
    for (int64_t c = whole + lane; c < cols; c += 32) a = fmaf(F::one(wr, c), __ldg(xr + c), a);
    a = dq::warp_sum(a);
    if (lane == 0) logits[int64_t(t) * n_expert + r] = a;
  }
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
}

// ---- norm_router_route: ffn_norm (+ its Q8 activations) and the router in one launch.
// Block = one router row (as router_route_row_kernel): the row and the norm weight are staged in shared
// memory before the PDL wait; then for each token every block computes rmsnorm(x[t]) itself (x is 8 KB,
// read from L2) with ops::rmsnorm's exact arithmetic: the double sum of a 256-thread block (thread j: x[j],
// x[j+256], ...; the xor butterfly per warp; the 8 warp sums in order) emulated by 128 threads holding
// virtual threads j and j + 128; then y = x * scale * w in shared memory, the row's dot product on y with
// router_row_dot's lane order (same bits as quant::matmul F32 on xn), and this block's share of xn and its
// Q8 quantization (32-value groups g = 4 * block + warp, + 4 * gridDim: each written once).
// cols % 32 == 0, cols <= kRouterStage.
// Why the staging and the registers: after the wait this kernel is on the decode chain's critical path
// (the experts wait for its ids). Thread tid's 16 values of x are loaded in one go (one L2 round trip, where
// a loop carrying a double sum waits for each load), and the norm weight is already on chip.
constexpr int kNormRouterPer = kRouterStage / kRouterRowThreads;  // values of x per thread, at most
template <int A>
__global__ void __launch_bounds__(kRouterRowThreads)
    norm_router_route_kernel(const float* __restrict__ x, const float* __restrict__ nw, float eps,
                             const uint8_t* __restrict__ w, int n_expert, int64_t cols, int64_t rb, int n_tok, int k,
                             bool norm, float* __restrict__ xn, int8_t* __restrict__ xq, float2* __restrict__ xds,
                             float* logits, int32_t* ids, float* weights, unsigned* counter) {
  using F = dq::Fmt<GgmlType::F32>;
  static_assert(kRouterRowThreads == 128, "the 256-thread sum order is emulated with 2 values per thread");
  static_assert(kNormRouterPer % 2 == 0, "even / odd values are the two virtual threads");
  __shared__ __align__(16) float row[kRouterStage];
  __shared__ __align__(16) float nws[kRouterStage];  // the norm weight
  __shared__ __align__(16) float ys[kRouterStage];
  __shared__ double red[8];
  __shared__ RouteShared sh;
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int len = int(cols);
  const uint8_t* wr = w + int64_t(r) * rb;
  // The row and the norm weight go to shared memory as asynchronous copies where aligned (cp.async: the
  // block reaches its wait at once, the copies land while it waits; staged through registers instead,
  // the block arrived at its wait after the previous kernel had ended, delaying the whole chain).
  if constexpr (A >= 16) {
    for (int i = tid; i < len / 4; i += kRouterRowThreads) __pipeline_memcpy_async(row + 4 * i, wr + 16 * i, 16);
  } else {
    for (int i = tid; i < len; i += kRouterRowThreads) row[i] = F::one(wr, i);
  }
  if (reinterpret_cast<uintptr_t>(nw) % 16 == 0) {
    for (int i = tid; i < len / 4; i += kRouterRowThreads) __pipeline_memcpy_async(nws + 4 * i, nw + 4 * i, 16);
  } else {
    for (int i = tid; i < len; i += kRouterRowThreads) nws[i] = __ldg(nw + i);
  }
  __pipeline_commit();
  pdl_wait();  // (PDL: x comes from the previous kernel; the row and the norm weight are weights)
  pdl_launch_dependents();
  __pipeline_wait_prior(0);
  __syncthreads();
  const int groups = len / 32;
  for (int t = 0; t < n_tok; ++t) {
    const float* xt = x + int64_t(t) * cols;
    float xv[kNormRouterPer];  // xv[j] = x[t][tid + 128 j]: j even = virtual thread tid, j odd = tid + 128
#pragma unroll
    for (int j = 0; j < kNormRouterPer; ++j) xv[j] = tid + 128 * j < len ? xt[tid + 128 * j] : 0.0f;
    double s0 = 0.0, s1 = 0.0;
#pragma unroll
    for (int j = 0; j < kNormRouterPer; j += 2) {
      if (tid + 128 * j < len) s0 += static_cast<double>(xv[j]) * xv[j];
      if (tid + 128 * (j + 1) < len) s1 += static_cast<double>(xv[j + 1]) * xv[j + 1];
    }
    s0 = warp_reduce(s0, SumOp{});
    s1 = warp_reduce(s1, SumOp{});
    if (lane == 0) red[warp] = s0, red[warp + 4] = s1;
    __syncthreads();
    double s = red[0];
    for (int v = 1; v < 8; ++v) s = s + red[v];
    const float mean = static_cast<float>(s / static_cast<double>(cols));
    const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < kNormRouterPer; ++j) {
      const int i = tid + 128 * j;
      if (i < len) ys[i] = xv[j] * scale * nws[i];
    }
    __syncthreads();
    if (warp == (t & 3)) {  // the token's dot product: one warp, router_row_dot's order
      float a = 0.f;
      for (int u = lane; u < len / 8; u += 32) {
        const float4 p = reinterpret_cast<const float4*>(row)[2 * u], q = reinterpret_cast<const float4*>(row)[2 * u + 1];
        const float4 b = reinterpret_cast<const float4*>(ys)[2 * u], c = reinterpret_cast<const float4*>(ys)[2 * u + 1];
        const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        const float xv8[8] = {b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaf(v[j], xv8[j], a);
      }
      a = dq::warp_sum(a);
      if (lane == 0) logits[int64_t(t) * n_expert + r] = a;
    }
    for (int g = blockIdx.x * 4 + warp; g < groups; g += gridDim.x * 4) {  // this block's share of xn / xq
      const float v = ys[32 * g + lane];
      if (xn != nullptr) xn[int64_t(t) * cols + 32 * g + lane] = v;
      if (xq != nullptr) q8c::quantize_warp(v, xq + int64_t(t) * cols + 32 * g, xds + int64_t(t) * groups + g);
    }
    __syncthreads();  // red and ys are rewritten for the next token
  }
  pdl_mark();  // (traced builds: the product done)
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
  pdl_end();  // (traced builds: the block's end, every block's in a histogram; the last block to finish routes)
}

constexpr int kRowThreads = 1024;  // argmax / sample: one block per row

// logits: [n_tok][n_vocab]; out: [n_tok]. One block per row.
__global__ void argmax_kernel(const float* logits, int64_t n_vocab, int32_t* out) {
  __shared__ uint64_t sh[32];
  const float* row = logits + blockIdx.x * n_vocab;
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x)
    best = MaxOp{}(best, order_key(row[i], static_cast<uint32_t>(i)));
  best = block_reduce(best, sh, MaxOp{});
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(key_id(best));
}

// ---- sample: the CPU Sampler's filters over the whole vocabulary, without sorting it.
// The candidates in the CPU's sorted order are the row's order keys in descending order. A radix select
// (8 passes of 8 bits over the row, histogram in shared memory) finds the key of any rank; the walks
// over ranks (cumulative probabilities for top-p and for the draw) go in chunks of kChunk ranks: the
// chunk's keys are gathered, bitonic-sorted in shared memory and prefix-summed in double.
constexpr int kChunk = 2 * kRowThreads;

struct SampleShared {
  uint64_t keys[kChunk];
  unsigned hist[256];
  typename cub::BlockScan<double, kRowThreads>::TempStorage scan;
  uint64_t red_u64[32];
  double red_d[32];
  long long red_i[32];
  uint64_t sel_prefix;
  long long sel_rank;
  bool sel_unique;
  int cached;  // ranks [0, cached) are in keys[], sorted (0: none)
  int count;
  int first;
  // deep_walk's: the mass of each bucket (fixed point), and the block-uniform outcome of a level.
  unsigned long long mass[256];
  uint64_t deep_lo, deep_hi;
  double deep_cum;
  long long deep_above;
  int deep_state;  // 0: descend, 1: gather the bucket [deep_lo, deep_hi], 2: no bucket reaches the target
};

__device__ __forceinline__ uint64_t row_key(const float* row, int64_t i) {
  return order_key(row[i], static_cast<uint32_t>(i));
}

// The key of rank r (0 = first in the CPU's order) among the n_vocab keys of the row. All threads.
// Once the bucket holding rank r has a single key, one more pass fetches that key (typically after 3-4
// of the 8 passes for real logits).
__device__ uint64_t select_rank(const float* row, int64_t n_vocab, int64_t r, SampleShared& sh) {
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t hi_mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
      const uint64_t key = row_key(row, i);
      if ((key & hi_mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long rr = r;
      int b = 255;
      for (; b > 0; --b) {
        if (rr < static_cast<long long>(sh.hist[b])) break;
        rr -= sh.hist[b];
      }
      sh.sel_prefix = prefix | (static_cast<uint64_t>(b) << shift);
      sh.sel_rank = rr;
      sh.sel_unique = sh.hist[b] == 1u;
    }
    __syncthreads();
    prefix = sh.sel_prefix;
    r = sh.sel_rank;
    const bool unique = sh.sel_unique;
    __syncthreads();  // sel_* are rewritten below or in the next pass
    if (unique && shift > 0) {  // the one key with this prefix is the answer
      const uint64_t mask = ~0ull << shift;
      for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        const uint64_t key = row_key(row, i);
        if ((key & mask) == prefix) sh.sel_prefix = key;
      }
      __syncthreads();
      prefix = sh.sel_prefix;
      __syncthreads();
      break;
    }
  }
  return prefix;
}

// Remembers the last selections (block-uniform registers): the walks ask for the same ranks again.
struct RankCache {
  int64_t rank[4] = {-1, -1, -1, -1};
  uint64_t key[4] = {0, 0, 0, 0};
  int next = 0;
  __device__ uint64_t get(const float* row, int64_t n_vocab, int64_t r, SampleShared& sh) {
    for (int i = 0; i < 4; ++i)
      if (rank[i] == r) return key[i];
    const uint64_t k = select_rank(row, n_vocab, r, sh);
    rank[next] = r;
    key[next] = k;
    next = (next + 1) & 3;
    return k;
  }
};

// Fills sh.keys[0, count) with the row's keys in [lo, upper) (no upper bound unless has_upper), sorted
// descending; the rest of keys[] is 0. The caller makes sure at most kChunk keys fall in the range.
__device__ void gather_sorted(const float* row, int64_t n_vocab, uint64_t lo, bool has_upper, uint64_t upper,
                              SampleShared& sh) {
  if (threadIdx.x == 0) sh.count = 0;
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) sh.keys[i] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
    const uint64_t key = row_key(row, i);
    if (key >= lo && (!has_upper || key < upper)) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kChunk) sh.keys[slot] = key;
    }
  }
  __syncthreads();
  for (int k2 = 2; k2 <= kChunk; k2 <<= 1) {  // bitonic sort, descending
    for (int j = k2 >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = sh.keys[i], b = sh.keys[ixj];
          const bool desc = (i & k2) == 0;
          if (desc ? a < b : a > b) {
            sh.keys[i] = b;
            sh.keys[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The first of the sorted keys sh.keys[0, c) whose cumulative probability (cum + prob of keys 0..idx, summed
// in double by a block scan) satisfies stop, or kChunk when none does; *total: the c keys' probability. All
// threads; sh.first and sh.scan are the scratch (the caller syncs before reusing them).
template <typename Prob, typename Stop>
__device__ int scan_sorted(const float* row, int c, double cum, Prob prob, Stop stop, SampleShared& sh, double* total) {
  if (threadIdx.x == 0) sh.first = kChunk;
  __syncthreads();
  double v[2];
  for (int j = 0; j < 2; ++j) {
    const int idx = 2 * threadIdx.x + j;
    v[j] = idx < c ? static_cast<double>(prob(row[key_id(sh.keys[idx])])) : 0.0;
  }
  cub::BlockScan<double, kRowThreads>(sh.scan).InclusiveSum(v, v, *total);
  for (int j = 0; j < 2; ++j) {
    const int idx = 2 * threadIdx.x + j;
    if (idx < c && stop(cum + v[j])) atomicMin(&sh.first, idx);
  }
  __syncthreads();
  return sh.first;
}

// walk_ranks past its first chunk when the deep search is on (sample_deep, the default): the ranks [start, n)
// are the keys in [lo, hi] (hi: the key below the first chunk's last, lo: the key of rank n - 1, 0 for the
// whole row); cum: the probability of ranks [0, start). Instead of walking them in chunks of kChunk (each a
// full-row radix select, gather and sort: a draw over a flat distribution went ~tens of thousands of ranks
// deep, ~1 ms a row), it descends the keys' bytes from the top:
// one pass per level sums each 256-way bucket's probability in fixed point (2^-60 units, integer atomics:
// the same sums whatever the order), the bucket where the target falls is kept, and once it holds at most
// kChunk keys they are gathered, sorted and walked in double as in walk_ranks. The cumulative sums before
// that bucket differ from rank-order double sums by ~1e-13 at most, so a pick differs from the CPU's only
// where the target falls that close to a boundary (as the CPU's own split walk, engine/sampling.cpp).
// Returns the rank (and *key_out) as walk_ranks, or -1 when the target is beyond every candidate.
template <typename Prob, typename Stop>
__device__ int64_t deep_walk(const float* row, int64_t n_vocab, int64_t start, uint64_t lo, uint64_t hi, double cum,
                             Prob prob, Stop stop, SampleShared& sh, uint64_t* key_out) {
  constexpr double kFx = 1152921504606846976.0;  // 2^60
  long long above = 0;  // candidates with keys above the current range
  for (int shift = 56;; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0u, sh.mass[b] = 0ull;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
      const uint64_t key = row_key(row, i);
      if (key < lo || key > hi) continue;
      const int b = int((key >> shift) & 255u);
      atomicAdd(&sh.hist[b], 1u);
      atomicAdd(&sh.mass[b], static_cast<unsigned long long>(static_cast<double>(prob(row[i])) * kFx));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // The keys of the range share their bits above shift + 8; bucket b is [base + b << shift, + 2^shift).
      const uint64_t base = shift == 56 ? 0ull : lo & ~((uint64_t(1) << (shift + 8)) - 1);
      unsigned long long acc = 0;
      int state = 2;
      for (int b = 255; b >= 0; --b) {
        if (sh.hist[b] == 0u) continue;
        if (stop(cum + static_cast<double>(acc + sh.mass[b]) / kFx)) {
          const uint64_t b_lo = base + (uint64_t(b) << shift), b_hi = b_lo + ((uint64_t(1) << shift) - 1);
          sh.deep_lo = b_lo > lo ? b_lo : lo;
          sh.deep_hi = b_hi < hi ? b_hi : hi;
          sh.deep_cum = cum + static_cast<double>(acc) / kFx;
          state = sh.hist[b] <= unsigned(kChunk) || shift == 0 ? 1 : 0;
          break;
        }
        acc += sh.mass[b];
        above += sh.hist[b];
      }
      sh.deep_state = state;
      sh.deep_above = above;
    }
    __syncthreads();
    const int state = sh.deep_state;
    if (state == 2) return -1;
    lo = sh.deep_lo, hi = sh.deep_hi, cum = sh.deep_cum, above = sh.deep_above;
    __syncthreads();  // (sh.deep_* are rewritten by the next level)
    if (state == 0) continue;
    // The bucket's keys, sorted, walked in double.
    gather_sorted(row, n_vocab, lo, hi != ~0ull, hi + 1, sh);
    if (threadIdx.x == 0) sh.cached = 0;
    __syncthreads();
    const int c = sh.count < kChunk ? sh.count : kChunk;
    double total;
    const int found = scan_sorted(row, c, cum, prob, stop, sh, &total);
    // (The fixed-point sums put the target in this bucket; where the double walk falls short of it by
    // their rounding, the bucket's last key.)
    const int first = found < c ? found : c - 1;
    *key_out = sh.keys[first];
    __syncthreads();
    return start + above + first;
  }
}

// Walks ranks [0, n) in the CPU's order accumulating cum += prob(logit) in double; returns the first
// rank whose cumulative value satisfies stop(cum) and its key in *key_out, or -1 when none does.
// Chunk 0 comes from sh.keys when they already hold it (sh.cached).
template <typename Prob, typename Stop>
__device__ int64_t walk_ranks(const float* row, int64_t n_vocab, int64_t n, Prob prob, Stop stop, RankCache& rc,
                              SampleShared& sh, uint64_t* key_out, bool deep) {
  double cum = 0.0;
  uint64_t upper = 0;  // keys of earlier chunks are >= upper (exclusive bound), once has_upper
  bool has_upper = false;
  for (int64_t start = 0; start < n; start += kChunk) {
    if (deep && has_upper && upper > 0) {  // past the first chunk: the byte descent by mass
      const uint64_t floor_key = n < n_vocab ? rc.get(row, n_vocab, n - 1, sh) : 0ull;
      return deep_walk(row, n_vocab, start, floor_key, upper - 1, cum, prob, stop, sh, key_out);
    }
    const int64_t end = start + kChunk < n ? start + kChunk : n;
    const int c = static_cast<int>(end - start);
    uint64_t lo;  // the key of rank end-1 (0 for the row's last chunk when gathering)
    if (start == 0 && sh.cached >= end) {
      lo = sh.keys[c - 1];
    } else {
      lo = end < n_vocab ? rc.get(row, n_vocab, end - 1, sh) : 0ull;
      gather_sorted(row, n_vocab, lo, has_upper, upper, sh);
      if (threadIdx.x == 0) sh.cached = start == 0 ? c : 0;
    }
    double total;
    const int first = scan_sorted(row, c, cum, prob, stop, sh, &total);
    if (first < c) {
      *key_out = sh.keys[first];
      __syncthreads();
      return start + first;
    }
    cum += total;
    upper = lo;
    has_upper = true;
    __syncthreads();
  }
  return -1;
}

// Sum over ranks [0, n) of f(logit), in double: from the sorted keys when they hold those ranks, else one
// pass over the row keeping keys >= lo (the key of rank n-1; 0 when n is the whole row). All threads.
template <typename F>
__device__ double sum_top(const float* row, int64_t n_vocab, int64_t n, uint64_t lo, F f, SampleShared& sh) {
  double acc = 0.0;
  if (n <= sh.cached) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += f(row[key_id(sh.keys[i])]);
  } else {
    for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x)
      if (row_key(row, i) >= lo) acc += f(row[i]);
  }
  return block_reduce(acc, sh.red_d, SumOp{});
}

// logits: [n_tok][n_vocab]; u: [n_tok]; out: [n_tok]. One block of kRowThreads per row.
// Why the cache of chunk 0: with top-k <= kChunk (the usual case) the k candidates are selected and
// sorted once and every later step reads them from shared memory instead of the whole row.
// rows: null (P for every row) or [n_tok] device rules, row t's at rows[t] (ops::sample_rows).
__global__ void __launch_bounds__(kRowThreads) sample_kernel(const float* logits, int64_t n_vocab, SampleParams P0,
                                                             const SampleParams* rows, const float* u, int32_t* out,
                                                             bool deep) {
  __shared__ SampleShared sh;
  const SampleParams P = rows != nullptr ? rows[blockIdx.x] : P0;  // block-uniform
  const float* row = logits + blockIdx.x * n_vocab;
  if (threadIdx.x == 0) sh.cached = 0;
  uint64_t kmax = 0;
  for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) kmax = MaxOp{}(kmax, row_key(row, i));
  kmax = block_reduce(kmax, sh.red_u64, MaxOp{});  // (its barriers also publish sh.cached)
  const int32_t best = static_cast<int32_t>(key_id(kmax));
  if (P.temperature <= 0.0f) {
    if (threadIdx.x == 0) out[blockIdx.x] = best;
    return;
  }
  const float mx = row[best];
  RankCache rc;
  // top-k: ranks [0, m).
  const int64_t m = P.top_k > 0 && P.top_k < n_vocab ? P.top_k : n_vocab;
  const uint64_t lo_m = m < n_vocab ? rc.get(row, n_vocab, m - 1, sh) : 0ull;
  if (m <= kChunk) {
    gather_sorted(row, n_vocab, lo_m, false, 0, sh);
    if (threadIdx.x == 0) sh.cached = static_cast<int>(m);
    __syncthreads();
  }
  int64_t n = m;
  uint64_t key_unused = 0;
  // top-p over the softmax (temperature 1) of the m candidates.
  if (P.top_p < 1.0f) {
    const double s1 = sum_top(row, n_vocab, m, lo_m, [=](float l) { return exp_cr((l - mx) / 1.0f); }, sh);
    const double top_p = P.top_p;
    const int64_t at = walk_ranks(
        row, n_vocab, m, [=](float l) { return static_cast<float>(exp_cr((l - mx) / 1.0f) / s1); },
        [=](double cum) { return cum >= top_p; }, rc, sh, &key_unused, deep);
    if (at >= 0) n = at + 1;
  }
  // min-p: the candidates with logit >= max + log(min_p) are a prefix of the order (at least one).
  if (P.min_p > 0.0f) {
    const float thresh = mx + static_cast<float>(log(static_cast<double>(P.min_p)));
    long long cnt = 0;
    if (n <= sh.cached) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) cnt += row[key_id(sh.keys[i])] >= thresh;
    } else {
      for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) cnt += row[i] >= thresh;
    }
    cnt = block_reduce(cnt, sh.red_i, SumOp{});
    n = cnt < n ? static_cast<int64_t>(cnt) : n;
    if (n < 1) n = 1;
  }
  // temperature softmax over ranks [0, n), then the draw.
  const float temp = P.temperature;
  const uint64_t lo_n = n < n_vocab && n > sh.cached ? rc.get(row, n_vocab, n - 1, sh) : 0ull;
  const double s2 = sum_top(row, n_vocab, n, lo_n, [=](float l) { return exp_cr((l - mx) / temp); }, sh);
  const double ud = u[blockIdx.x];
  uint64_t key = 0;
  const int64_t at = walk_ranks(
      row, n_vocab, n, [=](float l) { return static_cast<float>(exp_cr((l - mx) / temp) / s2); },
      [=](double cum) { return ud < cum; }, rc, sh, &key, deep);
  if (at < 0) {  // u beyond the last cumulative sum: the last candidate, as the CPU
    if (n <= sh.cached) {
      key = sh.keys[n - 1];
    } else {
      key = rc.get(row, n_vocab, n - 1, sh);
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(key_id(key));
}

unsigned grid_1d(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535 * 16));
}

}  // namespace

// ---------------------------------------------------------------- host wrappers

void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y, cudaStream_t stream) {
  STRATA_REQUIRE(n >= 1, "rmsnorm: row length {} must be >= 1", n);
  if (n_rows <= 0) return;
  pdl::launch(rmsnorm_kernel, static_cast<unsigned>(n_rows), 256, 0, stream, x, w, n, eps, y);
}

void rope_neox(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, int n_rot, float base,
               cudaStream_t stream) {
  STRATA_REQUIRE(n_rot >= 2 && n_rot % 2 == 0 && n_rot <= head_dim && n_rot <= cpu::kMaxRot,
                 "rope: n_rot {} must be even, <= head_dim {} and <= {}", n_rot, head_dim, cpu::kMaxRot);
  if (n_tok <= 0) return;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));  // as cpu::rope_neox
  rope_neox_kernel<<<static_cast<unsigned>(n_tok), 256, 0, stream>>>(x, pos, n_head, head_dim, n_rot, theta_scale);
  CUDA_CHECK_LAUNCH();
}

void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(gate, up, n, out);
  CUDA_CHECK_LAUNCH();
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  pdl::launch(add_kernel, grid_1d(n, 256), 256, 0, stream, x, y, n);
}

void kv_store(const float* k, const float* v, const KvRef* refs, int64_t n_tok, int layer, int64_t k_row,
              int64_t v_row, cudaStream_t stream) {
  STRATA_REQUIRE(k_row >= 1 && v_row >= 1 && layer >= 0, "kv_store: rows {}/{} layer {}", k_row, v_row, layer);
  STRATA_REQUIRE(n_tok <= 65535, "kv_store: {} tokens in one call (at most 65535)", n_tok);
  if (n_tok <= 0) return;
  const int64_t n = std::max(k_row, v_row);
  const dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(n_tok));
  kv_store_kernel<<<grid, 256, 0, stream>>>(k, v, refs, layer, k_row, v_row);
  CUDA_CHECK_LAUNCH();
}

void set_attn_split_rule(int rule) { g_split_rule.set(rule); }
int attn_split_rule() { return g_split_rule.get(); }

size_t attention_scratch_floats(int64_t n_tok, int n_head, int head_dim_v, int64_t max_kv) {
  const int n_split = attn_splits_by(n_tok, n_head, max_kv, 0);  // (rule 0: the most splits)
  return static_cast<size_t>(n_tok) * static_cast<size_t>(n_head) * static_cast<size_t>(n_split) *
         static_cast<size_t>(head_dim_v + 2);
}

namespace {
bool attention_impl(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                    int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv, float* scratch,
                    float* out, int8_t* xq, float2* xds, cudaStream_t stream, bool one_cache = false) {
  STRATA_REQUIRE(head_dim >= 1 && head_dim_v >= 1 && head_dim <= kMaxHeadDimGpu && head_dim_v <= kMaxHeadDimGpu,
                 "attention (cuda): head size {}/{} must be in [1, {}]", head_dim, head_dim_v, kMaxHeadDimGpu);
  STRATA_REQUIRE(n_head_kv >= 1 && n_head >= n_head_kv && n_head % n_head_kv == 0,
                 "attention: {} query heads not a multiple of {} KV heads", n_head, n_head_kv);
  STRATA_REQUIRE(max_kv >= 1 && layer >= 0, "attention: max_kv {} must be >= 1, layer {} >= 0", max_kv, layer);
  if (n_tok <= 0) return true;
  switch (lanes_per_dim(head_dim, head_dim_v)) {
    case 1:
      return launch_attention<1>(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math,
                                 max_kv, scratch, out, xq, xds, stream, one_cache);
    case 2:
      return launch_attention<2>(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math,
                                 max_kv, scratch, out, xq, xds, stream, one_cache);
    case 4:
      return launch_attention<4>(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math,
                                 max_kv, scratch, out, xq, xds, stream, one_cache);
    default:
      return launch_attention<8>(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math,
                                 max_kv, scratch, out, xq, xds, stream, one_cache);
  }
}
}  // namespace

void attention(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
               int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv, float* scratch,
               float* out, cudaStream_t stream, bool one_cache) {
  attention_impl(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math, max_kv, scratch, out,
                 nullptr, nullptr, stream, one_cache);
}

bool attention_q8_fused() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_ATTN_Q8");
  return on;
}

void attention_q8(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                  int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv, float* scratch,
                  float* out, int8_t* xq, float2* xds, cudaStream_t stream, bool fused) {
  STRATA_REQUIRE((int64_t(n_head) * head_dim_v) % 32 == 0, "attention_q8: {} x {} output columns, not a multiple of 32",
                 n_head, head_dim_v);
  fused = fused && head_dim_v % 32 == 0;  // the combine's warps quantize whole blocks of one head
  const bool done = attention_impl(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, head_dim_v, scale, math, max_kv,
                                   scratch, out, fused ? xq : nullptr, fused ? xds : nullptr, stream);
  if (!done || !fused) q8::quantize(out, n_tok, int64_t(n_head) * head_dim_v, xq, xds, stream);
}

// Declared in cuda/ops_fused.cuh; here beside attention_q8, whose split and combine it shares.
bool prep_attention_supported(int64_t n_tok, const AttnPrepShape& s) {
  return n_tok == 1 && s.n_head_kv >= 1 && s.n_head >= s.n_head_kv && s.n_head % s.n_head_kv == 0 &&
         attn_tile::supported(s.head_dim, s.head_dim_v) && s.n_rot >= 2 && s.n_rot % 2 == 0 &&
         s.n_rot <= s.head_dim;
}

namespace {
EnvSwitch g_prep_attention;
EnvSwitch g_prep_early;
}  // namespace

bool prep_attention_enabled() {
  return g_prep_attention.get([] { return env_on_unless_zero("STRATA_CUDA_PREP_ATTENTION"); });
}

void set_prep_early_weights(bool on) { g_prep_early.set(on); }
bool prep_early_weights() {
  return g_prep_early.get([] { return env_on_unless_zero("STRATA_CUDA_PREP_EARLY"); });
}

void prep_attention_q8(const AttnPrepIn& in, const AttnPrepShape& s, const KvRef* refs, int layer, float scale,
                       int64_t max_kv, float* scratch, float* out, int8_t* xq, float2* xds, cudaStream_t stream,
                       const predict::ExpertPrefetch* pf) {
  STRATA_REQUIRE(prep_attention_supported(1, s),
                 "prep_attention_q8: {} query / {} KV heads of {}/{}, n_rot {} (needs K and V heads of 64, 128 or "
                 "256, whole groups, an even n_rot <= head size)", s.n_head, s.n_head_kv, s.head_dim, s.head_dim_v,
                 s.n_rot);
  STRATA_REQUIRE(in.q_ld >= int64_t(s.n_head) * s.head_dim && in.k_ld >= int64_t(s.n_head_kv) * s.head_dim &&
                     in.v_ld >= int64_t(s.n_head_kv) * s.head_dim_v && layer >= 0 && max_kv >= 1,
                 "prep_attention_q8: row strides {}/{}/{} shorter than the rows, layer {} or max_kv {}", in.q_ld,
                 in.k_ld, in.v_ld, layer, max_kv);
  // The same launches as attention_q8 of one token, so the same split, partial sums and merge.
  const attn_tile::Prep prep{in, s.n_rot, s.eps, pf != nullptr ? *pf : predict::ExpertPrefetch{},
                             prep_early_weights()};
  if (!launch_tiled(nullptr, refs, 1, layer, s.n_head, s.n_head_kv, s.head_dim, s.head_dim_v, scale, max_kv, scratch,
                    out, xq, xds, stream, &prep))
    q8::quantize(out, 1, int64_t(s.n_head) * s.head_dim_v, xq, xds, stream);  // (not written by the launch)
}

void moe_route(const float* logits, int64_t n_tok, int n_expert, int k, bool norm, int32_t* ids, float* weights,
               cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "moe_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts <= {})",
                 n_expert, k, cpu::kMaxExperts);
  if (n_tok <= 0) return;
  STRATA_REQUIRE(n_tok <= 0x7fffffff, "moe_route (cuda): {} tokens in one call", n_tok);
  const int threads = (n_expert + 31) / 32 * 32;
  pdl::launch(moe_route_kernel, static_cast<unsigned>(n_tok), unsigned(threads), 0, stream, logits, n_expert, k, norm,
              ids, weights);
}

// Declared in cuda/ops_fused.cuh; here beside moe_route, whose per-token code (route_token) it shares.
namespace {
DigitSetting g_fused_router_tokens("STRATA_CUDA_FUSED_ROUTER_TOKENS", "tokens of the fused router launches", 1,
                                   int(kRouterRouteMaxTokens), int(kFusedRouterMaxTokens));
}  // namespace

void set_fused_router_max_tokens(int n) { g_fused_router_tokens.set(n); }
int64_t fused_router_max_tokens() { return g_fused_router_tokens.get(); }

RouterRouteKernel router_route_default() {
  static const RouterRouteKernel kern = [] {
    const char* e = std::getenv("STRATA_CUDA_ROUTER");
    return e != nullptr && std::string(e) == "warp" ? RouterRouteKernel::kWarpPerRow : RouterRouteKernel::kBlockPerRow;
  }();
  return kern;
}

void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream) {
  router_route(w, n_expert, cols, x, n_tok, k, norm, logits, ids, weights, counter, stream, router_route_default());
}

void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream,
                  RouterRouteKernel kern) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "router_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts <= {})",
                 n_expert, k, cpu::kMaxExperts);
  STRATA_REQUIRE(n_tok <= kRouterRouteMaxTokens && cols >= 1 && cols / 8 < (int64_t(1) << 30),
                 "router_route (cuda): {} tokens (at most {}), {} columns", n_tok, kRouterRouteMaxTokens, cols);
  if (n_tok <= 0) return;
  const int64_t rb = cols * 4;
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols % 4 == 0;  // as quant::matmul
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const bool aligned = dq::aligned_for<dq::Fmt<GgmlType::F32>>(w, rb);
  if (kern == RouterRouteKernel::kBlockPerRow) {
    const unsigned rows = static_cast<unsigned>(n_expert);
    pdl::launch(aligned ? router_route_row_kernel<16> : router_route_row_kernel<1>, rows, kRouterRowThreads, 0, stream,
                wb, n_expert, cols, rb, x, int(n_tok), xvec, k, norm, logits, ids, weights, counter);
    return;
  }
  const unsigned blocks = static_cast<unsigned>((n_expert + kRouterWarps - 1) / kRouterWarps);
  if (aligned)
    router_route_kernel<16><<<blocks, 32 * kRouterWarps, 0, stream>>>(wb, n_expert, cols, rb, x, int(n_tok), xvec, k,
                                                                     norm, logits, ids, weights, counter);
  else
    router_route_kernel<1><<<blocks, 32 * kRouterWarps, 0, stream>>>(wb, n_expert, cols, rb, x, int(n_tok), xvec, k,
                                                                    norm, logits, ids, weights, counter);
  CUDA_CHECK_LAUNCH();
}

bool norm_router_route_supported(int64_t cols) { return cols >= 32 && cols % 32 == 0 && cols <= kRouterStage; }

bool norm_router_route_enabled() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_NORM_ROUTER");
  return on;
}

void norm_router_route(const float* x, const float* norm_w, float eps, const float* w, int n_expert, int64_t cols,
                       int64_t n_tok, int k, bool norm, float* xn, int8_t* xq, float2* xds, float* logits,
                       int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "norm_router_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts "
                 "<= {})", n_expert, k, cpu::kMaxExperts);
  STRATA_REQUIRE(n_tok <= kRouterRouteMaxTokens && norm_router_route_supported(cols),
                 "norm_router_route (cuda): {} tokens (at most {}), {} columns (a multiple of 32, at most {})", n_tok,
                 kRouterRouteMaxTokens, cols, kRouterStage);
  STRATA_REQUIRE(xn != x && (xq == nullptr) == (xds == nullptr), "norm_router_route: xn may not alias x; xq and xds "
                 "go together");
  if (n_tok <= 0) return;
  const int64_t rb = cols * 4;
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const bool aligned = dq::aligned_for<dq::Fmt<GgmlType::F32>>(w, rb);
  pdl::launch(aligned ? norm_router_route_kernel<16> : norm_router_route_kernel<1>, static_cast<unsigned>(n_expert),
              kRouterRowThreads, 0, stream, x, norm_w, eps, wb, n_expert, cols, rb, int(n_tok), k, norm, xn, xq, xds,
              logits, ids, weights, counter);
}

void argmax(const float* logits, int64_t n_tok, int64_t n_vocab, int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "argmax: vocabulary size {}", n_vocab);
  if (n_tok <= 0) return;
  argmax_kernel<<<static_cast<unsigned>(n_tok), kRowThreads, 0, stream>>>(logits, n_vocab, out);
  CUDA_CHECK_LAUNCH();
}

// logits: [n_tok][n_vocab]; ban: [n_ban]; rows: [n_tok] or null. One thread per (row, banned id).
__global__ void ban_tokens_kernel(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                                  const uint8_t* rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tok * n_ban) return;
  const int64_t t = i / n_ban;
  const int32_t id = ban[i % n_ban];
  if ((rows == nullptr || rows[t] != 0) && id >= 0 && id < n_vocab) logits[t * n_vocab + id] = -INFINITY;
}

void ban_tokens(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                const uint8_t* rows, cudaStream_t stream) {
  STRATA_REQUIRE(n_tok >= 0 && n_ban >= 0 && n_vocab >= 1 && n_vocab <= INT32_MAX,
                 "ban_tokens: {} rows of {} logits, {} banned ids", n_tok, n_vocab, n_ban);
  STRATA_REQUIRE(n_tok <= INT32_MAX / std::max(n_ban, 1), "ban_tokens: {} rows x {} ids", n_tok, n_ban);
  if (n_tok == 0 || n_ban == 0) return;
  const int64_t n = n_tok * n_ban;
  ban_tokens_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(logits, n_tok, n_vocab, ban, n_ban,
                                                                                rows);
  CUDA_CHECK_LAUNCH();
}

size_t sample_scratch_bytes(int64_t /*n_tok*/, int64_t /*n_vocab*/) {
  return 0;  // the kernel re-reads the row (L2-resident) instead of sorting a copy
}

namespace {
DigitSetting g_sample_deep("STRATA_CUDA_SAMPLE_DEEP", "the device sampler's deep search by mass", 0, 1, 1);
}  // namespace
void set_sample_deep(bool on) { g_sample_deep.set(on ? 1 : 0); }
bool sample_deep() { return g_sample_deep.get() == 1; }

void check_sample_params(const SampleParams& p) {
  STRATA_REQUIRE(std::isfinite(p.temperature), "sample: temperature must be finite, got {}", p.temperature);
  STRATA_REQUIRE(p.top_p > 0.0f && p.top_p <= 1.0f, "sample: top-p must be in (0, 1], got {}", p.top_p);
  STRATA_REQUIRE(p.min_p >= 0.0f && p.min_p <= 1.0f, "sample: min-p must be in [0, 1], got {}", p.min_p);
}

void sample(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams& p, const float* u,
            void* /*scratch*/, int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "sample: vocabulary size {}", n_vocab);
  check_sample_params(p);
  if (n_tok <= 0) return;
  sample_kernel<<<static_cast<unsigned>(n_tok), kRowThreads, 0, stream>>>(logits, n_vocab, p, nullptr, u, out,
                                                                          sample_deep());
  CUDA_CHECK_LAUNCH();
}

void sample_rows(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams* rows, const float* u,
                 int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "sample: vocabulary size {}", n_vocab);
  STRATA_REQUIRE(rows != nullptr || n_tok <= 0, "sample_rows: no rules");
  if (n_tok <= 0) return;
  sample_kernel<<<static_cast<unsigned>(n_tok), kRowThreads, 0, stream>>>(logits, n_vocab, SampleParams{}, rows, u,
                                                                          out, sample_deep());
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::ops
