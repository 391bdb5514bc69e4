// q8::norm_matvec's kernels and launch (internal): q8_norm_matvec.cu checks the arguments and calls
// dispatch_per for the row length; each row length's instantiation over every format is in its own
// translation unit (q8_norm_matvec_c256.cu, _c1024, _c2048, _c4096) so that they compile in parallel.
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/host/q8_reference.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/q8_matvec.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::q8::norm_detail {

using q8mv::kThreads;

// Dynamic shared memory: [cols] int8 | [cols/32] float2 | staged weight rows.
constexpr int64_t act_bytes(int64_t cols) { return cols + (cols / 32) * 8; }

constexpr int kMaxRows = 5;  // rows a lane group holds at most (norm_matvec_rows)

inline bool aligned16(const float* x, const float* nw) {
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(nw) % 16 == 0;
}

// The thread's values of one row (thread i holds x[i + 256 j]; every load in flight at once) and their sum
// of squares in double, j in order. after_loads(): called once the loads are issued, before their values
// are used.
template <int PER, typename AfterLoads>
__device__ __forceinline__ double load_row(const float* x, float (&xv)[PER], AfterLoads& after_loads) {
#pragma unroll
  for (int j = 0; j < PER; ++j) xv[j] = x[threadIdx.x + kThreads * j];
  after_loads();
  double s = 0.0;
#pragma unroll
  for (int j = 0; j < PER; ++j) s += static_cast<double>(xv[j]) * xv[j];
  return s;
}

// Every block: sq/sds (shared) = the Q8 activations of rmsnorm(x) * nw (one row of cols = 256 * PER),
// computed as rmsnorm_quantize_kernel<PER> does (thread i holds x[i + 256 j]; the same double sum in the
// same order, the same float expression, quantize_warp), so the values are the same bits. Block 0 also
// writes xn and copies sq/sds to xq/xds. wv: the thread's norm weights. after_loads(): called once the
// thread's loads of x are issued, before their values are used.
template <int PER, typename AfterLoads>
__device__ __forceinline__ void norm_quantize_row(const float* x, const float (&wv)[PER], float eps, int8_t* sq,
                                                  float2* sds, float* xn, int8_t* xq, float2* xds,
                                                  AfterLoads after_loads) {
  __shared__ double sh[kThreads / 32];
  constexpr int64_t cols = int64_t(PER) * kThreads;
  const int lane = threadIdx.x & 31;
  float xv[PER];
  double s = load_row(x, xv, after_loads);
  for (int o = 16; o > 0; o >>= 1) s = s + __shfl_xor_sync(0xffffffffu, s, o);  // q8c::block_sum_256's order
  if (lane == 0) sh[threadIdx.x >> 5] = s;
  pdl_mark();  // (traced builds: x loaded, the warp's sum stored)
  __syncthreads();
  double r = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) r = r + sh[w];
  const float mean = static_cast<float>(r / static_cast<double>(cols));
  const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int64_t i = threadIdx.x + kThreads * j;
    const float v = xv[j] * scale * wv[j];
    if (blockIdx.x == 0) xn[i] = v;
    q8c::quantize_warp(v, sq + (i - lane), sds + i / 32);
  }
  pdl_mark();  // (traced builds: thread 0's values quantized)
  __syncthreads();
  if (blockIdx.x == 0) {  // the Q8 activations for later readers (the same as rmsnorm_quantize writes)
    for (int64_t i = threadIdx.x; i < cols / 16; i += kThreads)
      reinterpret_cast<int4*>(xq)[i] = reinterpret_cast<const int4*>(sq)[i];
    for (int64_t b = threadIdx.x; b < cols / 32; b += kThreads) xds[b] = sds[b];
  }
}

// The early norm (norm_matvec_early()): every warp quantizes its values of x * nw as soon as its loads of x
// land, without the norm's scale (the int8 codes of v * scale and of v are the same up to rounding, and d
// scales with it), and adds up its sum of squares in the same order as norm_quantize_row; one barrier then
// publishes the codes and the warps' sums. Returns the scale, which the caller applies to each dot. Block
// 0 writes xn (the same bits as rmsnorm_quantize); xq / xds are not written. Why: in session 17's trace
// block 0 had x 0.64 us after the wait but its codes only at 2.88 (the last block at 3.62): two barriers
// with the scale's arithmetic between them, before the product could start.
// Lanes (the default; STRATA_CUDA_NORM_LANES=0 off): the codes come from a second load of x in runs
// (LaneRuns below; wv holds nw in that layout), quantized by q8c::quantize_lanes<DPL>: 2 dependent
// shuffles a 32-value block for each of max and sum instead of quantize_warp's 5 + 5 for every value (why:
// session 19's trace had block 0's codes 2.14 us after the wait, 1.5 us after x landed, 8 quantize_warp
// calls a thread at 2048 columns). The sum of squares still comes from the strided values (its order, so
// the scale is the same bits); the codes do not depend on which lane quantizes (quantize_lanes' contract).
// Without Lanes, wv is nw at the strided layout (thread i holds nw[i + 256 j]).
template <int PER>
struct LaneRuns {
  static constexpr int kDpl = PER < 8 ? PER : 8;  // values a lane holds in a run (quantize_lanes' DPL)
  static constexpr int kPasses = PER / kDpl;
  // First column of the run of pass p for the calling thread: warp w's 32 * DPL columns of pass p.
  static __device__ __forceinline__ int64_t col(int p) {
    return int64_t(32 * kDpl) * (8 * p + (threadIdx.x >> 5)) + kDpl * (threadIdx.x & 31);
  }
};

// v[p * DPL + j] = src[LaneRuns<PER>::col(p) + j] (src 16-byte aligned: float4 loads where DPL allows).
template <int PER>
__device__ __forceinline__ void load_runs(const float* src, float (&v)[PER]) {
  using L = LaneRuns<PER>;
#pragma unroll
  for (int p = 0; p < L::kPasses; ++p) {
    const float* r = src + L::col(p);
    if constexpr (L::kDpl % 4 == 0) {
#pragma unroll
      for (int j = 0; j < L::kDpl; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(r + j);
        float* o = v + p * L::kDpl + j;
        o[0] = f.x, o[1] = f.y, o[2] = f.z, o[3] = f.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < L::kDpl; ++j) v[p * L::kDpl + j] = r[j];
    }
  }
}

template <int PER, bool Lanes, typename AfterLoads>
__device__ __forceinline__ float norm_quantize_row_early(const float* x, const float (&wv)[PER], float eps,
                                                         int8_t* sq, float2* sds, float* xn, AfterLoads after_loads) {
  __shared__ double sh[kThreads / 32];
  constexpr int64_t cols = int64_t(PER) * kThreads;
  const int lane = threadIdx.x & 31;
  using L = LaneRuns<PER>;
  float xr[PER];  // Lanes: x in runs
  if constexpr (Lanes) load_runs<PER>(x, xr);
  float xv[PER];
  double s = load_row(x, xv, after_loads);
  if constexpr (Lanes) {
#pragma unroll
    for (int p = 0; p < L::kPasses; ++p) {
      float v[L::kDpl];
#pragma unroll
      for (int j = 0; j < L::kDpl; ++j) v[j] = xr[p * L::kDpl + j] * wv[p * L::kDpl + j];
      const int64_t c0 = L::col(p) - L::kDpl * lane;  // the warp's first column of the pass
      q8c::quantize_lanes<L::kDpl>(v, sq + c0, sds + c0 / 32);
    }
  } else {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + kThreads * j;
      q8c::quantize_warp(xv[j] * wv[j], sq + (i - lane), sds + i / 32);
    }
  }
  for (int o = 16; o > 0; o >>= 1) s = s + __shfl_xor_sync(0xffffffffu, s, o);  // q8c::block_sum_256's order
  if (lane == 0) sh[threadIdx.x >> 5] = s;
  pdl_mark();  // (traced builds: thread 0's values quantized)
  __syncthreads();
  double r = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) r = r + sh[w];
  const float mean = static_cast<float>(r / static_cast<double>(cols));
  const float scale = 1.0f / sqrtf(mean + eps);
  if (blockIdx.x == 0) {
    if constexpr (Lanes) {
#pragma unroll
      for (int p = 0; p < L::kPasses; ++p)
#pragma unroll
        for (int j = 0; j < L::kDpl; ++j) xn[L::col(p) + j] = xr[p * L::kDpl + j] * scale * wv[p * L::kDpl + j];
    } else {
#pragma unroll
      for (int j = 0; j < PER; ++j) xn[threadIdx.x + kThreads * j] = xv[j] * scale * wv[j];
    }
  }
  return scale;
}

// Prestaging (prefetch_mode() 3 and 4; A == 16 rows only): the warp's rows into its shared-memory region
// (stage + warp * stride) by 16-byte cp.async copies, one commit group; the caller waits for them
// (__pipeline_wait_prior(0), __syncwarp) right before the product. Why: with the rows only asked into L2
// (modes 1, 2) the product after the norm's barrier still starts with an L2 round trip for them (q|k|v:
// block 0's end 2.2 us after the barrier in session 20's first trace).
template <int R>
__device__ __forceinline__ const uint8_t* prestage_rows(const uint8_t* w, int64_t rows, int64_t row_bytes,
                                                        int lpr_log2, uint8_t* region) {
  const int64_t row0 = q8mv::warp_row0<R>(lpr_log2), rows_per_warp = int64_t(R) << (5 - lpr_log2);
  if (row0 >= rows) return nullptr;
  const int64_t n16 = (rows - row0 < rows_per_warp ? rows - row0 : rows_per_warp) * row_bytes / 16;
  const uint8_t* src = w + row0 * row_bytes;
  for (int64_t i = threadIdx.x & 31; i < n16; i += 32) __pipeline_memcpy_async(region + 16 * i, src + 16 * i, 16);
  __pipeline_commit();
  return region;
}

// x, nw, eps, xn, xq_out, xds_out: as norm_matvec (one token); prefetch: prefetch_mode(); E: 0 the two-step
// norm, 1 the early norm (above) one value a lane, 2 the early norm in runs; the rest as q8_kernels.cu
// matvec_kernel.
// Registers: the norm's values are dead before the product starts, so the kernel needs about what the
// plain matvec does (why it matters: at 88 registers, with two tokens' rows held, the q|k|v product's
// 320 blocks no longer fit on the H200 at once, and the launch measured 11.8 us instead of 7.8 for the
// two it replaced).
template <typename F, int A, int R, int PER, int E>
__global__ void __launch_bounds__(kThreads)
    norm_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int lpr_log2, int64_t stride,
                       const float* x, const float* __restrict__ nw, float eps, float* xn, int8_t* xq_out,
                       float2* xds_out, float* y, bool accumulate, int prefetch) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int64_t cols = int64_t(PER) * kThreads;
  int8_t* sq = reinterpret_cast<int8_t*>(smem);            // [cols]
  float2* sds = reinterpret_cast<float2*>(smem + cols);    // [cols/32]
  uint8_t* stage = smem + act_bytes(cols);                 // [warps][stride] (A == kStaged, or prestaged)
  if (prefetch == 1) q8mv::prefetch_warp_rows<R>(w, rows, row_bytes, lpr_log2);
  const uint8_t* staged = nullptr;  // prestaged rows (modes 3, 4)
  uint8_t* region = stage + (threadIdx.x >> 5) * stride;
  if constexpr (A == 16) {
    if (prefetch == 4) staged = prestage_rows<R>(w, rows, row_bytes, lpr_log2, region);
  }
  float wv[PER];  // a weight: before the wait (E == 2: in runs, else strided)
  if constexpr (E == 2) {
    load_runs<PER>(nw, wv);
  } else {
#pragma unroll
    for (int j = 0; j < PER; ++j) wv[j] = nw[threadIdx.x + kThreads * j];
  }
  pdl_wait();
  pdl_launch_dependents();
  auto after_loads = [&] {  // x's loads issued: the weight rows' prefetch or prestaging (modes 2, 3)
    if (prefetch == 2) q8mv::prefetch_warp_rows<R>(w, rows, row_bytes, lpr_log2);
    if constexpr (A == 16) {
      if (prefetch == 3) staged = prestage_rows<R>(w, rows, row_bytes, lpr_log2, region);
    }
  };
  float scale = 1.f;  // the early norm's: each dot is scaled by it
  if constexpr (E != 0) scale = norm_quantize_row_early<PER, E == 2>(x, wv, eps, sq, sds, xn, after_loads);
  else norm_quantize_row<PER>(x, wv, eps, sq, sds, xn, xq_out, xds_out, after_loads);
  pdl_mark();  // (traced builds: the norm done)
  if (staged != nullptr) {
    __pipeline_wait_prior(0);
    __syncwarp();
  }
  q8mv::matvec_warp<F, A, 1, R, E != 0>(w, rows, row_bytes, cols, lpr_log2, stride, stage, sq, sds, 1, y,
                                        accumulate ? y : nullptr, scale, staged);
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// Where the kernel gets its weight rows ahead of the product: 3 (the default) copies them into shared memory
// after its PDL wait, once the loads of x are issued (prestage_rows; rows 16-byte aligned, else as 2); 4 the
// same before the wait; 2 asks L2 for them after the wait, 1 before it; 0 not at all.
// STRATA_CUDA_QKV_PREFETCH=0..4 (read once). Why 3: H200, 48-layer 30B-A3B geometry fully resident,
// alternating in one machine (session 20): 3 gave 563.3, 556.3, 567.5, 552.9, 566.8 tok/s against 558.1,
// 553.5, 551.1, 560.2 for 2 (+1.0%, within the runs' spread; 3 of 4 pairs ahead); 4 gave 557.3, 549.7.
// Why 2 before it: session 14 suspected x's loads (the first step after the wait) of queueing behind the
// prefetches; H200, 48-layer 30B-A3B geometry, fully resident, tok/s in one call each (session 17): 2 gave
// 493.3, 488.8, 493.8; 1 gave 487.0, 487.4 (alternating) and 488.5, 480.2; 0 gave 485.9. About +1%.
inline int prefetch_mode() {
  static const int mode = [] {
    const char* e = std::getenv("STRATA_CUDA_QKV_PREFETCH");
    if (e == nullptr) return 3;
    const std::string v(e);
    return v == "0" ? 0 : v == "1" ? 1 : v == "2" ? 2 : v == "4" ? 4 : 3;
  }();
  return mode;
}

// mode: 0 the two-step norm; 1 the early norm, strided; 2 the early norm, in runs (x and nw 16-byte aligned;
// the only mode with R > 2).
template <typename F, int A, int R, int PER>
void launch(const uint8_t* w, int64_t rows, int64_t row_bytes, const q8mv::Geometry& g, int mode, const float* x,
            const float* nw, float eps, float* xn, int8_t* xq, float2* xds, float* y, bool accumulate,
            cudaStream_t stream) {
  // Prestaging (modes 3, 4): 16-byte aligned rows whose warp regions fit kMaxStageBytes; else mode 2.
  int pf = prefetch_mode();
  int64_t pre_stride = 0;
  if (pf >= 3) {
    pre_stride = (g.rows_per_warp * row_bytes + 15) / 16 * 16;
    if (A != 16 || pre_stride * (kThreads / 32) > q8mv::kMaxStageBytes) pf = 2, pre_stride = 0;
  }
  const int cap = spreading_cap(g.blocks, norm_matvec_per_sm());
  auto run = [&](auto kernel, int64_t stride) {
    const auto* kern = reinterpret_cast<const void*>(kernel);
    const int64_t need = act_bytes(int64_t(PER) * kThreads) + stride * (kThreads / 32);
    allow_dynamic_bytes(kern, need);
    const size_t smem = smem_for_cap(kern, size_t(need), cap, kThreads);
    pdl::launch(kernel, unsigned(g.blocks), kThreads, smem, stream, w, rows, row_bytes, g.lpr_log2, stride, x, nw, eps,
                xn, xq, xds, y, accumulate, pf);
  };
  auto pick = [&](auto a, int64_t stride) {
    constexpr int AA = decltype(a)::value;
    if constexpr (R > 2) {  // (mode 2 only: launch_per)
      run(norm_matvec_kernel<F, AA, R, PER, 2>, stride);
    } else {
      if (mode == 2) run(norm_matvec_kernel<F, AA, R, PER, 2>, stride);
      else if (mode == 1) run(norm_matvec_kernel<F, AA, R, PER, 1>, stride);
      else run(norm_matvec_kernel<F, AA, R, PER, 0>, stride);
    }
  };
  if constexpr (A == 2) {
    if (g.stride > 0) return pick(std::integral_constant<int, q8d::kStaged>{}, g.stride);
  }
  pick(std::integral_constant<int, A>{}, pre_stride);  // (0 unless prestaged)
}

template <typename F, int A, int PER>
void launch_per(const uint8_t* w, int64_t rows, int64_t row_bytes, const float* x, const float* nw, float eps,
                float* xn, int8_t* xq, float2* xds, float* y, bool accumulate, cudaStream_t stream) {
  q8mv::Geometry g = q8mv::geometry<F, A>(rows, int64_t(PER) * kThreads, row_bytes, 1);
  const int mode = !norm_matvec_early() ? 0 : norm_matvec_lanes() && aligned16(x, nw) ? 2 : 1;  // (launch's)
  auto go = [&](auto r) {
    launch<F, A, decltype(r)::value, PER>(w, rows, row_bytes, g, mode, x, nw, eps, xn, xq, xds, y, accumulate,
                                          stream);
  };
  if constexpr (PER >= 8) {
    // 3 to 5 rows a lane group: the early norm in runs only (the default; else the geometry's choice).
    // 0: 3 where the geometry picks 2 (whole-warp rows, at least 4096 of them). Why: norm_matvec_per_sm().
    const int want = norm_matvec_rows(), r = want == 0 && g.r == 2 ? 3 : want;
    if (r >= 1 && r <= kMaxRows && (r <= 2 || mode == 2)) g = q8mv::with_rows<A>(g, r, rows, row_bytes);
    switch (g.r) {
      case 3: return go(std::integral_constant<int, 3>{});
      case 4: return go(std::integral_constant<int, 4>{});
      case 5: return go(std::integral_constant<int, 5>{});
      default: break;
    }
  }
  if (g.r == 2) go(std::integral_constant<int, 2>{});
  else go(std::integral_constant<int, 1>{});
}


// norm_matvec for rows of PER * kThreads values (PER: 1, 4, 8, 16 = 256, 1024, 2048, 4096 columns) over the
// formats of q8d::dispatch_core, and from 2048 columns (whole groups) the regrouped dense ones
// (q8d::dispatch_dense_only: a Q4_K_M file's Q6_K v); false where none took type at alignment al.
template <int PER>
bool dispatch_per(GgmlType type, q8d::Align al, const uint8_t* w, int64_t rows, int64_t row_bytes, const float* x, const float* nw,
                  float eps, float* xn, int8_t* xq, float2* xds, float* y, bool accumulate, cudaStream_t stream) {
  auto go = [&](auto f, auto a) {
    launch_per<decltype(f), decltype(a)::value, PER>(w, rows, row_bytes, x, nw, eps, xn, xq, xds, y, accumulate,
                                                      stream);
  };
  if constexpr (PER * kThreads % 2048 == 0) {
    if (q8d::dispatch_dense_only(type, al, go)) return true;
  }
  return q8d::dispatch_core(type, al, go);
}

#define STRATA_NORM_MATVEC_PER(EXTERN, PER)                                                             \
  EXTERN template bool dispatch_per<PER>(GgmlType, q8d::Align, const uint8_t*, int64_t, int64_t, const float*, \
                                         const float*, float, float*, int8_t*, float2*, float*, bool, cudaStream_t);
STRATA_NORM_MATVEC_PER(extern, 1)
STRATA_NORM_MATVEC_PER(extern, 4)
STRATA_NORM_MATVEC_PER(extern, 8)
STRATA_NORM_MATVEC_PER(extern, 16)

}  // namespace strata::cuda::q8::norm_detail
