// Int8-activation decode kernels: activation quantization and the dense matvec (contract:
// q8_kernels.cuh; per-format dots: q8_formats.cuh; MoE kernels: q8_moe.cu; CPU reference:
// host/q8_reference.cpp). Deterministic: every output is written by one warp, sums in a fixed order.
#include "cuda/q8_kernels.cuh"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_common.cuh"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_matvec.cuh"
#include "cuda/pdl.cuh"

namespace strata::cuda::q8 {
namespace {

constexpr int kThreads = q8mv::kThreads;  // 8 warps per block in every kernel here

// x: [n*cols/32 blocks][32] -> q (same shape), ds: [blocks]. One warp per block (grid-stride).
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const float* __restrict__ x, int64_t blocks, int8_t* __restrict__ q, float2* __restrict__ ds) {
  const int lane = threadIdx.x & 31;
  pdl_wait();  // (PDL: x comes from the previous kernel)
  pdl_launch_dependents();
  for (int64_t b = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5); b < blocks;
       b += int64_t(gridDim.x) * (kThreads / 32))
    q8c::quantize_warp(x[32 * b + lane], q + 32 * b, ds + b);
}

// One block per row (256 threads, the reduction of ops.cu rmsnorm_kernel, so y is bit-identical to
// ops::rmsnorm); then each warp quantizes 32-value blocks of the row. x, y: [n][cols] (y may be x: each
// element is read and written by the same thread after all reads of the sum); w: [cols];
// q: [n][cols]; ds: [n][cols/32].
// PER > 0 (cols == 256 * PER): the row stays in registers. Why: a decode norm is one block on one SM, so
// its time is load latency; here every load of x and w is issued up front and x is read once (the generic
// loop reloads it after the sum and runs its quantization blocks one after another). Thread i holds
// x[i + 256 j]: warp w holds whole 32-value blocks w + 8 j, which it quantizes from registers.
template <int PER>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_quantize_kernel(const float* x, const float* __restrict__ w, int64_t cols, float eps, float* y,
                            int8_t* __restrict__ q, float2* __restrict__ ds) {
  __shared__ double sh[32];
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  int8_t* qr = q + blockIdx.x * cols;
  float2* dr = ds + blockIdx.x * (cols / 32);
  const int lane = threadIdx.x & 31;
  double s = 0.0;
  if constexpr (PER > 0) {
    float xv[PER], wv[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) wv[j] = w[threadIdx.x + kThreads * j];  // weights: before the PDL wait
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int j = 0; j < PER; ++j) xv[j] = xr[threadIdx.x + kThreads * j];
#pragma unroll
    for (int j = 0; j < PER; ++j) s += static_cast<double>(xv[j]) * xv[j];  // the same order as the loop below
    s = q8c::block_sum_256(s, sh);
    const float mean = static_cast<float>(s / static_cast<double>(cols));
    const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + kThreads * j;
      const float v = xv[j] * scale * wv[j];
      yr[i] = v;
      q8c::quantize_warp(v, qr + (i - lane), dr + i / 32);
    }
  } else {
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += static_cast<double>(xr[i]) * xr[i];
    s = q8c::block_sum_256(s, sh);
    const float mean = static_cast<float>(s / static_cast<double>(cols));
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t b = threadIdx.x >> 5; b < cols / 32; b += kThreads / 32) {
      const int64_t i = 32 * b + lane;
      const float v = xr[i] * scale * w[i];
      yr[i] = v;
      q8c::quantize_warp(v, qr + 32 * b, dr + b);
    }
  }
}

// y[t][r] (+)= W[r] . x[t]: each warp its rows (q8_matvec.cuh matvec_warp), the rows prefetched into L2
// before the PDL wait. stride: bytes of a warp's staged region (A == kStaged).
template <typename F, int A, int NT, int R>
__global__ void __launch_bounds__(kThreads)
    matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols, int lpr_log2,
                  int64_t stride, const int8_t* __restrict__ xq, const float2* __restrict__ xds, int64_t n,
                  float* y, bool accumulate, bool async_stage) {
  q8mv::prefetch_warp_rows<R>(w, rows, row_bytes, lpr_log2);
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ __align__(16) uint8_t stage[];  // [warps][stride] (A == kStaged)
  q8mv::matvec_warp<F, A, NT, R>(w, rows, row_bytes, cols, lpr_log2, stride, stage, xq, xds, n, y,
                                 accumulate ? y : nullptr, 1.f, nullptr, async_stage);
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// STRATA_CUDA_MATVEC_CARVEOUT=N (0-100): the shared-memory carveout the staged matvec kernels (2-byte aligned
// rows: Q6_K, Q8_0, Q4_0, ...) ask for; unset or anything else: the driver's choice (or STRATA_CUDA_CARVEOUT's,
// which every PDL launch asks for when set). Session 36 traced the Q6_K output product (151936 x 2048, ~27 KB
// of staged rows a block, 61 registers) running ~2.5 blocks at a time at 68% of the read roofline; session 38
// measured 100 against the driver's on an H100: 119.7 against 121.9 us, tg64 +0.15% (within the rounds'
// spread), so the carveout is not what holds it there and the default stays the driver's.
int staged_carveout() {
  static const int value = pdl::carveout_from_env("STRATA_CUDA_MATVEC_CARVEOUT");
  return value;
}

// On (session 41, H100, bench/cuda_matvec): the Q6_K output product (151936 x 2048, n = 1) 119.1 -> 115.3 us,
// 67.9 -> 70.2% of the read roofline; the 48-layer Q4_0 decode 585.2 / 583.0 -> 585.1 / 587.0 tok/s (even).
DigitSetting g_matvec_async("STRATA_CUDA_MATVEC_ASYNC_STAGE", "the staged matvec's cp.async copy", 0, 1, 1);

template <typename F, int A, int NT, int R>
void launch_matvec_r(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t cols, const q8mv::Geometry& g,
                     const int8_t* xq, const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  if constexpr (A == 2) {
    if (g.stride > 0) {
      if (staged_carveout() >= 0 && pdl::carveout() < 0)
        set_kernel_attribute_once(reinterpret_cast<const void*>(matvec_kernel<F, q8d::kStaged, NT, R>),
                                  cudaFuncAttributePreferredSharedMemoryCarveout, staged_carveout());
      pdl::launch(matvec_kernel<F, q8d::kStaged, NT, R>, unsigned(g.blocks), kThreads,
                  size_t(g.stride * (kThreads / 32)), stream, w, rows, row_bytes, cols, g.lpr_log2, g.stride, xq, xds,
                  n, y, accumulate, matvec_async_stage() != 0);
      return;
    }
  }
  pdl::launch(matvec_kernel<F, A, NT, R>, unsigned(g.blocks), kThreads, 0, stream, w, rows, row_bytes, cols,
              g.lpr_log2, int64_t(0), xq, xds, n, y, accumulate, false);
}

template <typename F, int A, int NT>
void launch_matvec(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t cols, const int8_t* xq,
                   const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  const q8mv::Geometry g = q8mv::geometry<F, A>(rows, cols, row_bytes, NT);
  if constexpr (NT <= 2) {
    if (g.r == 2) {
      launch_matvec_r<F, A, NT, 2>(w, rows, row_bytes, cols, g, xq, xds, n, y, accumulate, stream);
      return;
    }
  }
  launch_matvec_r<F, A, NT, 1>(w, rows, row_bytes, cols, g, xq, xds, n, y, accumulate, stream);
}

}  // namespace

void set_matvec_async_stage(int on) { g_matvec_async.set(on); }

// Off until measured (session 40 built it without a GPU; the Q6_K output product reads at 66-68% of the read
// roofline staged against 86-94% for the formats read in place).
int matvec_async_stage() { return g_matvec_async.get(); }

bool supported(GgmlType t) { return q8ref::supported(t); }

namespace {
DigitSetting g_low_bit("STRATA_CUDA_Q8_LOW_BIT", "the low-bit formats' int8 kernels", 0, 1, 1);
}  // namespace

void set_low_bit(bool on) { g_low_bit.set(on ? 1 : 0); }

bool low_bit_enabled() { return g_low_bit.get() == 1; }

bool use_type(GgmlType t) { return supported(t) && (!q8ref::low_bit(t) || low_bit_enabled()); }

bool use_moe(const moe::ExpertLayerView& v) {
  return moe_supported(v) && use_type(v.gate_type) && use_type(v.up_type) && use_type(v.down_type);
}

bool enabled() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_Q8");
  return on;
}

void quantize(const float* x, int64_t n, int64_t cols, int8_t* q, float2* ds, cudaStream_t stream) {
  STRATA_REQUIRE(cols > 0 && cols % 32 == 0, "q8 quantize: {} columns is not a positive multiple of 32", cols);
  STRATA_REQUIRE(n >= 0, "q8 quantize: {} rows", n);
  const int64_t blocks = n * (cols / 32);
  if (blocks == 0) return;
  const int64_t grid = std::min<int64_t>((blocks + kThreads / 32 - 1) / (kThreads / 32), 65535);
  pdl::launch(quantize_kernel, unsigned(grid), kThreads, 0, stream, x, blocks, q, ds);
}

void rmsnorm_quantize(const float* x, const float* w, int64_t n, int64_t cols, float eps, float* y, int8_t* q,
                      float2* ds, cudaStream_t stream) {
  STRATA_REQUIRE(cols > 0 && cols % 32 == 0, "q8 rmsnorm_quantize: {} columns is not a positive multiple of 32", cols);
  STRATA_REQUIRE(n >= 0 && n <= 0x7FFFFFFF, "q8 rmsnorm_quantize: {} rows", n);
  if (n == 0) return;
  const unsigned grid = unsigned(n);
  switch (cols) {  // the register-resident shapes (n_embd of the supported models and the test sizes)
    case 1024: pdl::launch(rmsnorm_quantize_kernel<4>, grid, kThreads, 0, stream, x, w, cols, eps, y, q, ds); break;
    case 2048: pdl::launch(rmsnorm_quantize_kernel<8>, grid, kThreads, 0, stream, x, w, cols, eps, y, q, ds); break;
    case 4096: pdl::launch(rmsnorm_quantize_kernel<16>, grid, kThreads, 0, stream, x, w, cols, eps, y, q, ds); break;
    default: pdl::launch(rmsnorm_quantize_kernel<0>, grid, kThreads, 0, stream, x, w, cols, eps, y, q, ds); break;
  }
}

void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
            const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  q8ref::check_matvec_shape(type, cols, row_bytes, "q8 matvec");
  STRATA_REQUIRE(rows >= 0 && n >= 0, "q8 matvec: bad shape rows {} n {}", rows, n);
  const q8d::Align al = q8mv::checked_alignment(type, w, row_bytes, xq, "q8 matvec");
  if (rows == 0 || n == 0) return;
  // Several tokens: a tensor-core kernel where the mode and the format say so (q8_mma_matvec.cu says why).
  if (n >= 2 && mma_matvec(type, w, rows, cols, row_bytes, xq, xds, n, y, accumulate, stream)) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool ran = q8d::dispatch_dense(type, al, [&](auto f, auto a) {
    using F = decltype(f);
    constexpr int A = decltype(a)::value;
    // Token tile: the smallest of 1, 2, 4, 8 that holds n (more tokens: tiles of 8).
    if (n == 1) launch_matvec<F, A, 1>(wb, rows, row_bytes, cols, xq, xds, n, y, accumulate, stream);
    else if (n == 2) launch_matvec<F, A, 2>(wb, rows, row_bytes, cols, xq, xds, n, y, accumulate, stream);
    else if (n <= 4) launch_matvec<F, A, 4>(wb, rows, row_bytes, cols, xq, xds, n, y, accumulate, stream);
    else launch_matvec<F, A, 8>(wb, rows, row_bytes, cols, xq, xds, n, y, accumulate, stream);
  });
  STRATA_REQUIRE(ran, "q8 matvec: no kernel for {} rows at {}-byte alignment", type_name(type), al.bytes);
}

}  // namespace strata::cuda::q8
