#pragma once
// The dense int8-activation matvec's block work and launch geometry (private to q8_kernels.cu and
// q8_norm_matvec.cu; contract: q8_kernels.cuh matvec / norm_matvec).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.h"
#include "cuda/host/q8_reference.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_formats.cuh"

namespace strata::cuda::q8mv {

constexpr int kThreads = 256;                  // 8 warps per block in every q8 kernel
constexpr int64_t kMaxStageBytes = 48 * 1024;  // staged rows of a block (shared memory without opting in)
// Two rows per lane group for big matrices at n <= 2 (whole-warp rows, >= 4096 rows: >= 128 blocks of 16
// rows); else one.
constexpr int64_t kTwoRowsMinRows = 4096;

// How a matvec of `rows` x `cols` in F for n tokens is launched: lanes per row, rows per lane group (R),
// blocks, and the staged region per warp (stride; 0: rows read from global memory).
struct Geometry {
  int lpr_log2 = 0, r = 1;
  int64_t rows_per_warp = 0, blocks = 0, stride = 0;
};

// g with r rows per lane group (g.lpr_log2 set): its rows per warp, blocks and staged region.
template <int A>
Geometry with_rows(Geometry g, int r, int64_t rows, int64_t row_bytes) {
  g.r = r, g.stride = 0;
  g.rows_per_warp = int64_t(g.r) << (5 - g.lpr_log2);
  const int64_t rows_per_block = (kThreads / 32) * g.rows_per_warp;
  g.blocks = (rows + rows_per_block - 1) / rows_per_block;
  STRATA_REQUIRE(g.blocks <= 0x7FFFFFFF, "q8 matvec: {} rows is too many", rows);
  // The 2-byte aligned formats go through shared memory when a block's rows fit in it.
  const int64_t stride = q8d::stage_stride(g.rows_per_warp * row_bytes);
  if (A == 2 && stride * (kThreads / 32) <= kMaxStageBytes) g.stride = stride;
  return g;
}

template <typename F, int A>
Geometry geometry(int64_t rows, int64_t cols, int64_t row_bytes, int nt_tile) {
  Geometry g;
  g.lpr_log2 = q8d::lanes_per_row_log2(int(cols / F::kVals) * F::kTasks);
  return with_rows<A>(g, nt_tile <= 2 && g.lpr_log2 == 5 && rows >= kTwoRowsMinRows ? 2 : 1, rows, row_bytes);
}

// The alignment every q8 product needs (strata::Error otherwise): weight rows of `type` aligned to
// q8ref::min_row_align (2 bytes; Q2_K 4, IQ4_XS / IQ1_M 8), activations 16-byte aligned. Returns the rows'
// alignment (q8d::dispatch picks the loads by it). what: the caller's name for messages.
inline q8d::Align checked_alignment(GgmlType type, const void* w, int64_t row_bytes, const int8_t* xq,
                                    const char* what) {
  const auto wa = reinterpret_cast<uintptr_t>(w);
  const int a = q8ref::min_row_align(type);
  STRATA_REQUIRE(wa % uintptr_t(a) == 0 && row_bytes % a == 0, "{}: {} weight rows must be {}-byte aligned", what,
                 type_name(type), a);
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(xq) % 16 == 0, "{}: activations must be 16-byte aligned", what);
  return q8d::align_of(wa, row_bytes);
}

// First weight row of the calling warp.
template <int R>
__device__ __forceinline__ int64_t warp_row0(int lpr_log2) {
  return (int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5)) * (int64_t(R) << (5 - lpr_log2));
}

// Before the PDL wait: the warp's weight rows into L2 while the previous kernel finishes.
template <int R>
__device__ __forceinline__ void prefetch_warp_rows(const uint8_t* w, int64_t rows, int64_t row_bytes, int lpr_log2) {
  const int64_t row0 = warp_row0<R>(lpr_log2), rows_per_warp = int64_t(R) << (5 - lpr_log2);
  if (row0 < rows) {
    const int64_t wbytes = (rows - row0 < rows_per_warp ? rows - row0 : rows_per_warp) * row_bytes;
    warp_prefetch_l2(w + row0 * row_bytes, wbytes, threadIdx.x & 31);
  }
}

// The warp's part of y[t][r] (+)= W[r] . x[t] (after the PDL wait). Lanes of a warp split into groups of
// 2^lpr_log2 lanes, R consecutive weight rows per group (2048-column K-quant rows: 32 tasks, a whole warp
// per row; 768 columns: 12 tasks, 16 lanes per row, so few lanes idle; R = 2 for big matrices at n <= 2).
// Each lane sums its tasks (task = lane_in_group, += lanes per group), then a butterfly over the group: a
// fixed order. Tokens in tiles of NT sharing each weight load.
// A == kStaged (the 2-byte aligned formats Q4_0 / Q8_0 / Q6_K): the warp first copies its rows (they are
// consecutive in memory) into its shared-memory region (stage + warp * stride) with coalesced 16-byte
// loads, and the lanes read their tasks from there (why: a lane's task is 32 or 64 contiguous bytes of one
// block, so read straight from global memory every 16-bit load of the warp touches ~8-16 cache lines for
// 64 bytes; the staged copy reads each line once).
// add: nullptr (y = the product) or the residual (y = add + the product; add may be y). The residual is
// loaded before the dot (why: loaded after it, as `*y + acc`, it was one more L2 round trip at the end of
// every block on the decode chain; the sum is the same float addition).
// Returns the sum of the squares of the values this lane wrote (every lane returns its own; the caller
// reduces): wo_router's sum of squares of the residual stream (q8_folded_router.cu).
// Scaled: each dot is multiplied by `scale` (rounded on its own, then the residual added: no fused
// multiply-add) before it is written: norm_matvec's early norm, whose activations lack the norm's scale.
// async_stage (A == kStaged): the rows copied by cp.async, every 16-byte piece of the lane in flight at once
// (why: the plain copy's loop stores each load to shared memory before the next load issues, so a lane's
// ~7 pieces of the Q6_K output product's two 1680-byte rows were ~7 dependent round trips; the same bytes).
// staged (A == 16 only; else null): the warp's rows already copied there by the caller (shared memory,
// 16-byte aligned, landed and visible to the warp), read instead of w's (norm_matvec's prestaged rows).
//   w: [rows][row_bytes] (row starts A-aligned)   xq: [n][cols] int8 (global or shared)   xds: [n][cols/32]
//   y, add: [n][rows]
template <typename F, int A, int NT, int R, bool Scaled = false>
__device__ __forceinline__ float matvec_warp(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes,
                                             int64_t cols, int lpr_log2, int64_t stride, uint8_t* stage,
                                             const int8_t* xq, const float2* xds, int64_t n, float* y,
                                             const float* add, float scale = 1.f, const uint8_t* staged = nullptr,
                                             bool async_stage = false) {
  const int lane = threadIdx.x & 31, lpr = 1 << lpr_log2, sub = lane & (lpr - 1);
  const int64_t rows_per_warp = int64_t(R) << (5 - lpr_log2);
  const int64_t row0 = warp_row0<R>(lpr_log2);
  if (row0 >= rows) return 0.f;  // the whole warp is past the end (warp-uniform)
  const int64_t rowg = row0 + int64_t(lane >> lpr_log2) * R;  // the group's first row
  const int64_t dss = cols / 32;
  // The warp's rows start at `first` (global memory, or their staged copy). Rows past the end compute on
  // row0's bytes (always valid) and are not written.
  const uint8_t* first = staged != nullptr ? staged : w + row0 * row_bytes;
  if constexpr (A == q8d::kStaged) {
    const int64_t nrows = rows - row0 < rows_per_warp ? rows - row0 : rows_per_warp;
    uint8_t* dst = q8d::stage_dst(stage + (threadIdx.x >> 5) * stride, first);
    if (async_stage) {
      q8d::warp_copy_with(dst, first, nrows * row_bytes, lane, q8d::Copy16Async{});
      __pipeline_commit();
      __pipeline_wait_prior(0);
    } else {
      q8d::warp_copy(dst, first, nrows * row_bytes, lane);
    }
    __syncwarp();
    first = dst;
  }
  const uint8_t* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) wr[i] = first + (rowg + i < rows ? rowg + i - row0 : 0) * row_bytes;
  float squares = 0.f;
  for (int64_t t0 = 0; t0 < n; t0 += NT) {
    const int nt = int(n - t0 < NT ? n - t0 : NT);
    float acc[R][NT], base[R][NT];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        acc[i][t] = 0.f;
        base[i][t] = add != nullptr && sub == 0 && rowg + i < rows && t < nt ? add[(t0 + t) * rows + rowg + i] : 0.f;
      }
    if (rowg < rows)
      q8d::rows_tokens_lane_partial<F, A, R, NT>(wr, cols, sub, lpr, xq + t0 * cols, xds + t0 * dss, nt, acc);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        for (int o = lpr >> 1; o > 0; o >>= 1) acc[i][t] += __shfl_xor_sync(0xffffffffu, acc[i][t], o);
    if (sub == 0)
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (rowg + i < rows)
#pragma unroll
          for (int t = 0; t < NT; ++t)
            if (t < nt) {
              float v;
              if constexpr (Scaled) {
                const float dot = __fmul_rn(acc[i][t], scale);
                v = add != nullptr ? base[i][t] + dot : dot;
              } else {
                v = add != nullptr ? base[i][t] + acc[i][t] : acc[i][t];
              }
              y[(t0 + t) * rows + rowg + i] = v;
              squares = fmaf(v, v, squares);
            }
  }
  return squares;
}

}  // namespace strata::cuda::q8mv
