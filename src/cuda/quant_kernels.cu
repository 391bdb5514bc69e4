// Quantized matrix products, row gathers and dequantization on the GPU (declarations and contract:
// quant_kernels.cuh). Per-block dequantization: dequant_device.cuh (bit-identical to quant/dequant.cpp).
//
// matmul: one warp per weight row, 4 rows per block; the lanes walk the row in units of 8 values
// (lane i takes units i, i+32, ...: consecutive lanes read consecutive bytes of the row, so a warp's loads
// cover whole 32-byte sectors), dequantize them in registers and FMA them with up to kTile tokens of x
// (blockIdx.y = token tile): each weight row is read from memory once per tile of tokens. Why this shape:
// at decode (n = 1) the product is bound by the weight bytes; a warp per row keeps every SM's load units
// busy with independent rows and needs no shared memory or block-wide synchronisation.
// Fast path: Q4_K, Q5_K, Q6_K, Q4_0 and Q8_0 with rows aligned for its loads go through fast_matmul_kernel
// (fast_dot.cuh says why); every other type or alignment takes matmul_kernel.
#include "cuda/quant_kernels.cuh"

#include <algorithm>
#include <atomic>
#include <string>

#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/fast_dot.cuh"
#include "cuda/gemm_context.h"
#include "cuda/pdl.cuh"

namespace strata::cuda::quant {
namespace {

constexpr int kWarps = 4;  // rows per block of matmul
constexpr int kTile = 8;   // tokens per weight read

// The product kernels below are launched with PDL (pdl.cuh): a warp sends its weight rows (which no kernel
// writes) towards L2 while the kernel ahead of it still runs, then waits for it before reading x. Why: at
// decode these products are a chain of dependent short kernels (norm -> product -> ...), where each one's
// first weight loads would otherwise start only after the previous kernel has drained.

// w: [rows][row_bytes]  x: [n][cols]  y: [n][rows]. Block (32*kWarps): warp = one row; blockIdx.y = tile
// of NT tokens starting at blockIdx.y * NT.
template <typename F, int A, int NT>
__global__ void __launch_bounds__(32 * kWarps) matmul_kernel(const uint8_t* __restrict__ w, int64_t rows,
                                                             int64_t cols, int64_t row_bytes,
                                                             const float* __restrict__ x, int64_t n,
                                                             float* __restrict__ y, bool xvec, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r < rows && blockIdx.y == 0) warp_prefetch_l2(w + r * row_bytes, row_bytes, lane);
  pdl_wait();
  pdl_launch_dependents();
  if (r >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  const int nt = n - t0 < NT ? int(n - t0) : NT;
  const uint8_t* wr = w + r * row_bytes;
  const float* xt = x + t0 * cols;
  constexpr int kUnits = F::kVals / 8;
  const int units = int(cols / F::kVals) * kUnits;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
#pragma unroll 2
  for (int u = lane; u < units; u += 32) {
    const int b = u / kUnits, i8 = u % kUnits;
    float v[8];
    F::template deq8<A>(wr + int64_t(b) * F::kBytes, i8, v);
    const int64_t c = int64_t(b) * F::kVals + 8 * i8;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        float xv[8];
        dq::load_x8(xt + t * cols, c, xvec, xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[t] = fmaf(v[k], xv[k], acc[t]);
      }
    }
  }
  if constexpr (F::kFloat) {  // the float types' columns past the last whole 8
    for (int64_t c = int64_t(units) * 8 + lane; c < cols; c += 32) {
      const float wv = F::one(wr, c);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] = fmaf(wv, __ldg(xt + t * cols + c), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = dq::warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + (t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Fast path (fast_dot.cuh: Q4_K, Q5_K, Q6_K, Q4_0, Q8_0). Warp = R consecutive rows (they share every
// x load), lane = one 32-value chunk of a block per step (chunks c = lane, lane+32, ...: a warp step reads
// whole consecutive blocks with 16-byte or 2-byte loads), blockIdx.y = tile of NT tokens (they share every
// weight load). Why: see fast_dot.cuh; R = 2 halves the L1 traffic of x, which at n = 1 is 7x the weight
// bytes of Q4_K; two chunk steps are unrolled so a 2048-column row has all its loads in flight at once.
// w: [rows][row_bytes] (row starts K::kAlign-aligned)  x: [n][cols]  y: [n][rows].
template <typename K, int R, int NT>
__global__ void __launch_bounds__(32 * kWarps) fast_matmul_kernel(const uint8_t* __restrict__ w, int64_t rows,
                                                                  int64_t cols, int64_t row_bytes,
                                                                  const float* __restrict__ x, int64_t n,
                                                                  float* __restrict__ y, bool xvec,
                                                                  bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (r0 < rows && blockIdx.y == 0)
    warp_prefetch_l2(w + r0 * row_bytes, (rows - r0 < R ? rows - r0 : R) * row_bytes, lane);
  pdl_wait();
  pdl_launch_dependents();
  if (r0 >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  const int nt = n - t0 < NT ? int(n - t0) : NT;
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + (r0 + r < rows ? r0 + r : rows - 1) * row_bytes;  // past the end: row
                                                                                             // rows-1 again, unused
  const float* xt = x + t0 * cols;
  const int chunks = int(cols / K::kVals) * K::kChunks;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    const int b = c / K::kChunks, ch = c % K::kChunks;
    const uint8_t* blk[R];
#pragma unroll
    for (int r = 0; r < R; ++r) blk[r] = wr[r] + int64_t(b) * K::kBytes;
    fd::chunk_dot<K, R, NT>(blk, ch, xt + int64_t(b) * K::kVals, cols, nt, xvec, acc);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float s = dq::warp_sum(acc[r][t]);
      if (lane == 0 && t < nt && r0 + r < rows) {
        float* out = y + (t0 + t) * rows + r0 + r;
        *out = accumulate ? *out + s : s;
      }
    }
}

// Rows of W gathered: dst[i][c] for c in the units of blockIdx.x's threads; rows ids[i], i over blockIdx.y
// (grid-stride). w: [rows][row_bytes]  dst: [n][cols].
template <typename F, int A>
__global__ void get_rows_kernel(const uint8_t* __restrict__ w, int64_t cols, int64_t row_bytes,
                                const int32_t* __restrict__ ids, int64_t n, float* __restrict__ dst) {
  constexpr int kUnits = F::kVals / 8;
  const int64_t units = cols / F::kVals * kUnits;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  pdl_wait();  // ids come from an earlier kernel or copy
  pdl_launch_dependents();
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const uint8_t* wr = w + int64_t(ids[i]) * row_bytes;
    float* out = dst + i * cols;
    if (u < units) {
      float v[8];
      F::template deq8<A>(wr + (u / kUnits) * F::kBytes, int(u % kUnits), v);
      for (int k = 0; k < 8; ++k) out[u * 8 + k] = v[k];
    }
    if constexpr (F::kFloat) {
      const int64_t c = units * 8 + u;
      if (c < cols) out[c] = F::one(wr, c);
    }
  }
}

// dst[0..n_values) = W dequantized; one thread per unit of 8 values (plus the float types' tail).
template <typename F, int A>
__global__ void dequantize_kernel(const uint8_t* __restrict__ w, int64_t n_values, float* __restrict__ dst) {
  constexpr int kUnits = F::kVals / 8;
  const int64_t units = n_values / F::kVals * kUnits;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    float v[8];
    F::template deq8<A>(w + (u / kUnits) * F::kBytes, int(u % kUnits), v);
    for (int k = 0; k < 8; ++k) dst[u * 8 + k] = v[k];
  }
  if constexpr (F::kFloat) {
    const int64_t c = units * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c < n_values) dst[c] = F::one(w, c);
  }
}

const TypeTraits& checked_traits(GgmlType type, const char* what) {
  const TypeTraits* tt = find_type_traits(type);
  STRATA_REQUIRE(tt != nullptr, "cuda {}: unknown type id {}", what, static_cast<uint32_t>(type));
  STRATA_REQUIRE(has_kernel(type), "cuda {}: no GPU kernel for type {} (repack it to {} at load)", what,
                 tt->name, type_name(storage_type(type)));
  return *tt;
}

template <typename F, int NT>
void launch_matmul(const uint8_t* w, int64_t rows, int64_t cols, int64_t rb, const float* x, int64_t n, float* y,
                   bool xvec, bool acc, cudaStream_t stream) {
  const dim3 grid(unsigned((rows + kWarps - 1) / kWarps), unsigned((n + NT - 1) / NT));
  if (dq::aligned_for<F>(w, rb))
    pdl::launch(matmul_kernel<F, F::kAlign, NT>, grid, 32 * kWarps, 0, stream, w, rows, cols, rb, x, n, y, xvec, acc);
  else
    pdl::launch(matmul_kernel<F, 1, NT>, grid, 32 * kWarps, 0, stream, w, rows, cols, rb, x, n, y, xvec, acc);
}

template <typename K, int R, int NT>
void launch_fast(const uint8_t* w, int64_t rows, int64_t cols, int64_t rb, const float* x, int64_t n, float* y,
                 bool xvec, bool acc, cudaStream_t stream) {
  const dim3 grid(unsigned((rows + kWarps * R - 1) / (kWarps * R)), unsigned((n + NT - 1) / NT));
  pdl::launch(fast_matmul_kernel<K, R, NT>, grid, 32 * kWarps, 0, stream, w, rows, cols, rb, x, n, y, xvec, acc);
}

// The fast path when the type has one and the rows are aligned for its loads; false: use the generic one.
// R = 2 rows per warp only from 4096 rows: below that, 2 rows per warp leave too few warps to fill 132 SMs
// (a 768-row expert matrix would get 96 blocks).
std::atomic<bool> g_generic_only{false};

bool try_fast_matmul(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, int64_t rb, const float* x,
                     int64_t n, float* y, bool xvec, bool acc, cudaStream_t stream) {
  bool done = false;
  if (g_generic_only.load(std::memory_order_relaxed)) return false;
  // Q4_0 and Q8_0 stay on the generic kernel: on the H200 the fast path was slower for them at n = 1
  // (0.74-0.91x on three of the four Qwen3-30B-A3B shapes; bench/results/2026-11-29-gpu-kernels-h200.md).
  // Q4_0_X8 (dense Q4_0 regrouped, model_common.h product_type) with them: the generic kernel sums its
  // values in Q4_0's order, so the regrouping keeps every product's bits (the fast path's chunks do not).
  if (type == GgmlType::Q4_0 || type == GgmlType::Q4_0_X8 || type == GgmlType::Q8_0) return false;
  fd::dispatch(type, [&](auto k) {
    using K = decltype(k);
    if (!fd::rows_aligned<K>(w, rb)) return;
    done = true;
    const bool two = rows >= 4096;
    if (n == 1)
      two ? launch_fast<K, 2, 1>(w, rows, cols, rb, x, n, y, xvec, acc, stream)
          : launch_fast<K, 1, 1>(w, rows, cols, rb, x, n, y, xvec, acc, stream);
    else
      two ? launch_fast<K, 2, kTile>(w, rows, cols, rb, x, n, y, xvec, acc, stream)
          : launch_fast<K, 1, kTile>(w, rows, cols, rb, x, n, y, xvec, acc, stream);
  });
  return done;
}

}  // namespace

void set_generic_only(bool on) { g_generic_only.store(on); }
bool generic_only() { return g_generic_only.load(std::memory_order_relaxed); }

bool has_kernel(GgmlType t) {
  return dq::dispatch(t, [](auto) {});
}

GgmlType storage_type(GgmlType t) { return has_kernel(t) ? t : GgmlType::F16; }

bool takes_gemm(const GemmContext* gemm, int64_t n) { return gemm != nullptr && n >= kGemmMinTokens; }

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            cudaStream_t stream, const GemmContext* gemm, bool accumulate) {
  if (takes_gemm(gemm, n)) {  // prefill: tensor cores (why: gemm_context.h)
    matmul_gemm(*gemm, type, w, rows, cols, x, n, y, stream, accumulate);
    return;
  }
  const TypeTraits& tt = checked_traits(type, "matmul");
  STRATA_REQUIRE(rows >= 0 && cols >= 0 && n >= 0, "cuda matmul: negative shape {}x{} n {}", rows, cols, n);
  STRATA_REQUIRE(cols % tt.block_size == 0, "cuda matmul: {} columns is not a multiple of the {} block size {}",
                 cols, tt.name, tt.block_size);
  STRATA_REQUIRE(rows <= int64_t(kWarps) * 0x7fffffff && (n + kTile - 1) / kTile <= 65535,
                 "cuda matmul: shape {}x{} with n {} is beyond the grid limits", rows, cols, n);
  STRATA_REQUIRE(cols / 8 < (int64_t(1) << 30), "cuda matmul: {} columns is too many", cols);
  if (rows == 0 || n == 0) return;
  const int64_t rb = static_cast<int64_t>(row_bytes(type, cols));
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols % 4 == 0;
  const auto* wb = static_cast<const uint8_t*>(w);
  if (try_fast_matmul(type, wb, rows, cols, rb, x, n, y, xvec, accumulate, stream)) return;
  dq::dispatch(type, [&](auto f) {
    using F = decltype(f);
    if (n == 1)
      launch_matmul<F, 1>(wb, rows, cols, rb, x, n, y, xvec, accumulate, stream);
    else
      launch_matmul<F, kTile>(wb, rows, cols, rb, x, n, y, xvec, accumulate, stream);
  });
}

void get_rows(GgmlType type, const void* w, int64_t cols, const int32_t* ids, int64_t n, float* dst,
              cudaStream_t stream) {
  const TypeTraits& tt = checked_traits(type, "get_rows");
  STRATA_REQUIRE(cols >= 0 && n >= 0 && cols % tt.block_size == 0,
                 "cuda get_rows: {} columns (n {}) is not a multiple of the {} block size {}", cols, n, tt.name,
                 tt.block_size);
  if (cols == 0 || n == 0) return;
  const int64_t rb = static_cast<int64_t>(row_bytes(type, cols));
  const auto* wb = static_cast<const uint8_t*>(w);
  dq::dispatch(type, [&](auto f) {
    using F = decltype(f);
    const int64_t units = cols / F::kVals * (F::kVals / 8);
    const int64_t threads = std::max<int64_t>(units, F::kFloat ? cols - units * 8 : 0);
    const dim3 grid(unsigned((threads + 127) / 128), unsigned(std::min<int64_t>(n, 65535)));
    if (dq::aligned_for<F>(w, rb))
      pdl::launch(get_rows_kernel<F, F::kAlign>, grid, 128, 0, stream, wb, cols, rb, ids, n, dst);
    else
      pdl::launch(get_rows_kernel<F, 1>, grid, 128, 0, stream, wb, cols, rb, ids, n, dst);
  });
}

void dequantize(GgmlType type, const void* w, int64_t n_values, float* dst, cudaStream_t stream) {
  const TypeTraits& tt = checked_traits(type, "dequantize");
  STRATA_REQUIRE(n_values >= 0 && n_values % tt.block_size == 0,
                 "cuda dequantize: {} values is not a multiple of the {} block size {}", n_values, tt.name,
                 tt.block_size);
  if (n_values == 0) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  dq::dispatch(type, [&](auto f) {
    using F = decltype(f);
    const int64_t units = n_values / F::kVals * (F::kVals / 8);
    const int64_t threads = std::max<int64_t>(units, 8);  // >= the float types' tail (< 8 values)
    const unsigned blocks = unsigned(std::min<int64_t>((threads + 255) / 256, 1 << 20));
    if (dq::aligned_for<F>(w, 0))
      dequantize_kernel<F, F::kAlign><<<blocks, 256, 0, stream>>>(wb, n_values, dst);
    else
      dequantize_kernel<F, 1><<<blocks, 256, 0, stream>>>(wb, n_values, dst);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace strata::cuda::quant
