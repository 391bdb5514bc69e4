#pragma once
// The prefill matrix-matrix path of cuda::quant::matmul (issue 7): dequantize the weight tile by tile to
// 16-bit floats in a scratch buffer, convert x to the same type, and multiply with cuBLAS (tensor cores,
// f32 accumulate, f32 output). Why: at n >= kGemmMinTokens the tiled matvec kernel re-reads and
// re-dequantizes every weight once per 8 tokens and runs on CUDA cores; the round trip through a 16-bit
// copy (2 bytes written + read per weight) is paid once per call and the product then runs near the
// tensor-core peak.
//
// A GemmContext owns the cuBLAS handle, its workspace and the scratch; the model creates one at load
// (make_gemm_context) and passes it to every matmul, so the forward pass allocates nothing.
// Free of CUDA headers (like device.h): cublasHandle_t is a pointer to the opaque cublasContext.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda/device.h"
#include "quant/types.h"

struct cublasContext;

namespace strata::cuda {

// Below this many tokens quant::matmul keeps its tiled kernel even when given a context. Why 32: the
// tiled kernel reads each weight ceil(n/8) times; at n = 32 that is 4 reads of the quantized bytes (~0.56
// bytes/weight for Q4_K), about what the 16-bit round trip costs (2 bytes written + 2 read per weight),
// and from there on the GEMM path's cost stays flat while the tiled kernel's grows with n. To be measured
// (bench/cuda/cuda_gemm.cu) and tuned.
constexpr int64_t kGemmMinTokens = 32;

// The 16-bit type weights and activations are rounded to before the tensor-core product.
//  BF16 (default): the f32 exponent range, so no activation or dequantized weight can overflow (MoE
//        activations have outliers in the thousands; a scaled F32/F16 weight could exceed 65504); 8
//        significant bits: error ~1e-2 of sum|w x| at worst, ~1e-3 typical.
//  F16:  11 significant bits (8x more precise) but overflows to inf above 65504 and flushes to
//        subnormals below 6e-5: use it only where the values are known to fit.
enum class GemmPrecision { BF16, F16 };

class GemmContext {
 public:
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  cublasContext* handle() const { return handle_; }
  GemmPrecision precision() const { return precision_; }
  int64_t max_cols() const { return max_cols_; }
  int64_t max_n() const { return max_n_; }         // tokens per product (more are done in chunks)
  int64_t tile_rows() const { return tile_rows_; }  // weight rows dequantized per cuBLAS call
  int device() const { return device_; }
  // Scratch: x converted [max_n][max_cols] then the weight tile [tile_rows][max_cols], 16-bit each.
  void* x16() const { return scratch_.data(); }
  void* w16() const { return static_cast<uint8_t*>(scratch_.data()) + x_bytes_; }

 private:
  friend std::unique_ptr<GemmContext> make_gemm_context(Device&, int64_t, int64_t, int64_t, GemmPrecision);
  GemmContext() = default;
  cublasContext* handle_ = nullptr;
  DeviceBuffer scratch_, workspace_;
  GemmPrecision precision_ = GemmPrecision::BF16;
  int64_t max_cols_ = 0, max_n_ = 0, tile_rows_ = 0;
  size_t x_bytes_ = 0;
  int device_ = 0;
};

// A context for products with up to max_rows x max_cols weights and max_n tokens per call. The weight
// scratch holds min(max_rows, rows that fit in 64 MiB) rows (larger matrices, e.g. the output head, go in
// row tiles). Allocates (once) on `dev`: the scratch plus a 32 MiB cuBLAS workspace.
// Throws strata::Error for non-positive sizes or when the memory is not there.
std::unique_ptr<GemmContext> make_gemm_context(Device& dev, int64_t max_rows, int64_t max_cols, int64_t max_n,
                                               GemmPrecision precision = GemmPrecision::BF16);

// y[i][r] = sum_c W[r][c] * x[i][c] through the 16-bit + cuBLAS path, for any n >= 0 (quant::matmul calls
// it for n >= kGemmMinTokens). Same shapes and type rules as quant::matmul; cols <= ctx.max_cols().
// Enqueued on `stream`; the context's scratch is reused by the next call, so calls sharing a context must
// be ordered on one stream. accumulate: y[i][r] += the sum (cuBLAS's beta = 1, f32: the
// float addition of y and the product, as an add after it; the product's own sum order is cuBLAS's).
void matmul_gemm(const GemmContext& ctx, GgmlType type, const void* w, int64_t rows, int64_t cols,
                 const float* x, int64_t n, float* y, StreamHandle stream, bool accumulate = false);

}  // namespace strata::cuda
