// The 16-bit + cuBLAS prefill path of quant::matmul (contract and why: gemm_context.h).
// Weights are dequantized by the same per-block decoders as every other GPU kernel (dequant_device.cuh,
// bit-identical to quant/dequant.cpp in f32) and then rounded to nearest to bf16/f16.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "cuda/convert16.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/gemm_context.h"
#include "cuda/quant_kernels.cuh"

namespace strata::cuda {
namespace {

constexpr size_t kWeightScratchBytes = size_t(64) << 20;  // weight tile: 64 MiB of 16-bit values
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's recommendation for Hopper

template <typename T>
__device__ __forceinline__ T to16(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 to16<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half to16<__half>(float v) { return __float2half_rn(v); }

// 8 floats rounded to T, as one 16-byte word (why: one vector store a unit instead of eight 2-byte ones;
// ncu, session 29: the 2-byte stores made a 512-token layer's three weight conversions 70 us).
template <typename T>
__device__ __forceinline__ uint4 pack8(const float v[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const T lo = to16<T>(v[2 * k]), hi = to16<T>(v[2 * k + 1]);
    w[k] = uint32_t(reinterpret_cast<const uint16_t&>(lo)) | (uint32_t(reinterpret_cast<const uint16_t&>(hi)) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// dst[0..n_values) = W dequantized and rounded to T; one thread per unit of 8 values (grid-stride), plus
// the float types' tail. w: n_values / F::kVals blocks; dst: 16-byte aligned.
template <typename F, int A, typename T>
__global__ void dequant16_kernel(const uint8_t* __restrict__ w, int64_t n_values, T* __restrict__ dst) {
  constexpr int kUnits = F::kVals / 8;
  const int64_t units = n_values / F::kVals * kUnits;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    float v[8];
    F::template deq8<A>(w + (u / kUnits) * F::kBytes, int(u % kUnits), v);
    reinterpret_cast<uint4*>(dst)[u] = pack8<T>(v);
  }
  if constexpr (F::kFloat) {
    const int64_t c = units * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c < n_values) dst[c] = to16<T>(F::one(w, c));
  }
}

// dst[i] = x[i] rounded to T. x, dst: [count]. Vec (x and dst 16-byte aligned): 8 values a thread as one
// vector load pair and store, then the tail; else one value a thread.
template <typename T, bool Vec>
__global__ void convert16_kernel(const float* __restrict__ x, int64_t count, T* __restrict__ dst) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, units = Vec ? count / 8 : 0;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const float4 a = reinterpret_cast<const float4*>(x)[2 * u], b = reinterpret_cast<const float4*>(x)[2 * u + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    reinterpret_cast<uint4*>(dst)[u] = pack8<T>(v);
  }
  for (int64_t c = units * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < count; c += stride)
    dst[c] = to16<T>(x[c]);
}

unsigned blocks_for(int64_t threads) { return unsigned(std::clamp<int64_t>((threads + 255) / 256, 1, 1 << 16)); }

template <typename T>
void dequant16(GgmlType type, const uint8_t* w, int64_t n_values, T* dst, cudaStream_t stream) {
  dq::dispatch(type, [&](auto f) {
    using F = decltype(f);
    const int64_t units = n_values / F::kVals * (F::kVals / 8);
    const unsigned blocks = blocks_for(std::max<int64_t>(units, 8));
    if (dq::aligned_for<F>(w, 0))
      dequant16_kernel<F, F::kAlign, T><<<blocks, 256, 0, stream>>>(w, n_values, dst);
    else
      dequant16_kernel<F, 1, T><<<blocks, 256, 0, stream>>>(w, n_values, dst);
    CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void matmul_gemm_t(const GemmContext& ctx, GgmlType type, const uint8_t* w, int64_t rows, int64_t cols,
                   const float* x, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  const cudaDataType_t dt = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
  const int64_t rb = int64_t(row_bytes(type, cols));
  T* x16 = static_cast<T*>(ctx.x16());
  T* w16 = static_cast<T*>(ctx.w16());
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;  // (accumulate: y = 1 * product + 1 * y)
  CUBLAS_CHECK(cublasSetStream(ctx.handle(), stream));
  for (int64_t n0 = 0; n0 < n; n0 += ctx.max_n()) {
    const int64_t nc = std::min(ctx.max_n(), n - n0);
    convert16(x + n0 * cols, nc * cols, x16, stream);  // x16: [nc][cols]
    for (int64_t r0 = 0; r0 < rows; r0 += ctx.tile_rows()) {
      const int64_t rc = std::min(ctx.tile_rows(), rows - r0);
      dequant16(type, w + r0 * rb, rc * cols, w16, stream);  // w16: [rc][cols]
      // Column-major view: w16 is [cols x rc] (ld cols), x16 [cols x nc] (ld cols), y's tile [rc x nc]
      // (ld rows): y_tile = w16^T * x16.
      CUBLAS_CHECK(cublasGemmEx(ctx.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(rc), int(nc), int(cols), &alpha, w16, dt,
                                int(cols), x16, dt, int(cols), &beta, y + n0 * rows + r0, CUDA_R_32F, int(rows),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

}  // namespace

template <typename T>
void convert16(const float* x, int64_t count, T* dst, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0)
    convert16_kernel<T, true><<<blocks_for(std::max<int64_t>(count / 8, 8)), 256, 0, stream>>>(x, count, dst);
  else
    convert16_kernel<T, false><<<blocks_for(count), 256, 0, stream>>>(x, count, dst);
  CUDA_CHECK_LAUNCH();
}
template void convert16<__half>(const float*, int64_t, __half*, cudaStream_t);
template void convert16<__nv_bfloat16>(const float*, int64_t, __nv_bfloat16*, cudaStream_t);

GemmContext::~GemmContext() {
  if (handle_) {
    cudaSetDevice(device_);
    cublasDestroy(handle_);  // no CUBLAS_CHECK: a destructor must not abort on a dying context
  }
}

std::unique_ptr<GemmContext> make_gemm_context(Device& dev, int64_t max_rows, int64_t max_cols, int64_t max_n,
                                               GemmPrecision precision) {
  STRATA_REQUIRE(max_rows > 0 && max_cols > 0 && max_n > 0, "gemm context: bad sizes rows {} cols {} n {}", max_rows,
                 max_cols, max_n);
  STRATA_REQUIRE(max_cols < (int64_t(1) << 31) && max_n < (int64_t(1) << 31) && max_n * max_cols < (int64_t(1) << 40),
                 "gemm context: {} tokens x {} columns is too large", max_n, max_cols);
  std::unique_ptr<GemmContext> c(new GemmContext());
  dev.make_current();
  c->device_ = dev.ordinal();
  c->precision_ = precision;
  c->max_cols_ = max_cols;
  c->max_n_ = max_n;
  c->tile_rows_ = std::clamp<int64_t>(int64_t(kWeightScratchBytes / (2 * size_t(max_cols))), 1, max_rows);
  c->tile_rows_ = std::min<int64_t>(c->tile_rows_, 0x7fffffff);
  c->x_bytes_ = (size_t(max_n) * size_t(max_cols) * 2 + 255) / 256 * 256;
  c->scratch_ = dev.alloc(c->x_bytes_ + size_t(c->tile_rows_) * size_t(max_cols) * 2, "gemm scratch");
  c->workspace_ = dev.alloc(kCublasWorkspaceBytes, "cublas workspace");
  CUBLAS_CHECK(cublasCreate(&c->handle_));
  CUBLAS_CHECK(cublasSetWorkspace(c->handle_, c->workspace_.data(), c->workspace_.bytes()));
  return c;
}

void matmul_gemm(const GemmContext& ctx, GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y, StreamHandle stream, bool accumulate) {
  const TypeTraits* tt = find_type_traits(type);
  STRATA_REQUIRE(tt != nullptr && quant::has_kernel(type), "cuda matmul_gemm: no GPU kernel for type {}",
                 tt ? std::string(tt->name) : std::to_string(static_cast<uint32_t>(type)));
  STRATA_REQUIRE(rows >= 0 && cols >= 0 && n >= 0, "cuda matmul_gemm: negative shape {}x{} n {}", rows, cols, n);
  STRATA_REQUIRE(cols % tt->block_size == 0, "cuda matmul_gemm: {} columns is not a multiple of the {} block size {}",
                 cols, tt->name, tt->block_size);
  STRATA_REQUIRE(cols <= ctx.max_cols(), "cuda matmul_gemm: {} columns is more than the context's {}", cols,
                 ctx.max_cols());
  STRATA_REQUIRE(rows < (int64_t(1) << 31), "cuda matmul_gemm: {} rows is too many", rows);
  if (rows == 0 || n == 0) return;
  if (cols == 0) {  // an empty sum: y = 0, or y unchanged (cuBLAS rejects k = 0 with ld 0)
    if (!accumulate) quant::matmul(type, w, rows, cols, x, n, y, stream);
    return;
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  if (ctx.precision() == GemmPrecision::F16)
    matmul_gemm_t<__half>(ctx, type, wb, rows, cols, x, n, y, accumulate, stream);
  else
    matmul_gemm_t<__nv_bfloat16>(ctx, type, wb, rows, cols, x, n, y, accumulate, stream);
}

}  // namespace strata::cuda
