// The small ops of the forward pass on the GPU (declarations and contracts in cuda/ops.cuh): norms, RoPE,
// elementwise ops, the KV store and the generic attention kernels (routing: ops_route.cu; sampling:
// ops_sample.cu). Each kernel follows the arithmetic of its CPU reference in cpu/ops.cpp up to the
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

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/attn_tile.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_kernels.cuh"

namespace strata::cuda::ops {

namespace {

using namespace detail;  // (cuda/ops_common.cuh)

constexpr int kMaxHeadDimGpu = 256;  // attention: largest head size (8 values per lane)

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
// One-token decode: a split walks at least this many K/V tiles (kTileKv positions each), so contexts up to
// tiles x kTileKv positions take one split and no combine launch (set_attn_decode_tiles).
DigitSetting g_decode_tiles("STRATA_CUDA_ATTN_DECODE_TILES", "attention decode tiles a split", 1, 8, 1);
// One-token decode: the splits merged by their blocks in thread block clusters instead of a combine launch
// (set_attn_cluster_merge).
DigitSetting g_cluster_merge("STRATA_CUDA_ATTN_CLUSTER_MERGE", "attention cluster merge", 0, 1, 0);

// Whether the current device runs thread block clusters (sm_90 and later).
bool device_has_clusters() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

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
  int n_split = attn_splits(n_tok, n_head, max_kv);
  if (n_tok == 1) {  // (attn_decode_tiles: the fewest positions a split walks)
    const int64_t least = int64_t(g_decode_tiles.get()) * attn_tile::kTileKv;
    n_split = static_cast<int>(std::min<int64_t>(n_split, (max_kv + least - 1) / least));
  }
  const int64_t per = (max_kv + n_split - 1) / n_split;
  const int chunk = static_cast<int>((per + attn_tile::kTileKv - 1) / attn_tile::kTileKv * attn_tile::kTileKv);
  const int used = static_cast<int>((max_kv + chunk - 1) / chunk);
  // (the merge in clusters: one token, at most a portable cluster of splits, no predictor blocks in the grid)
  const bool cl_merge = n_tok == 1 && used >= 2 && used <= attn_tile::kMaxMergeCluster && g_cluster_merge.get() == 1 &&
                        (prep == nullptr || !prep->pf.on()) && device_has_clusters();
  const bool q8_done = attn_tile::launch(q, refs, n_tok, layer, n_head, n_head_kv, head_dim, scale, used, chunk,
                                        scratch, out, xq, xds, stream, prep, one_cache,
                                        cl_merge);  // (xq: one split or the cluster merge only)
  if (used == 1 || cl_merge) return q8_done;
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
void set_attn_decode_tiles(int tiles) { g_decode_tiles.set(tiles); }
int attn_decode_tiles() { return g_decode_tiles.get(); }
void set_attn_cluster_merge(bool on) { g_cluster_merge.set(on ? 1 : 0); }
bool attn_cluster_merge() { return g_cluster_merge.get() == 1; }

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

}  // namespace strata::cuda::ops
