// y[t][r] = sum_c W[r][c] * x[t][c], exact (dequantize + f32) or fast (integer kernels, quantized x).
//
// Work split: rows are cut into chunks handed out by the thread pool. Inside a chunk, tokens are walked
// in tiles and, for each weight row, every token of the tile is done while the row is hot in L1: the
// weights stream from memory once per call whatever n_tok is (decode and small-batch prefill alike).
#include "quant/matmul.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "quant/dequant.h"
#include "quant/vec_dot.h"

namespace strata {
namespace {

constexpr int64_t kRowGrain = 16;  // rows per work item: ~36 KiB of Q4_K at 4096 columns
constexpr int64_t kTokTile = 32;   // tokens per tile: their quantized rows stay in L2 across a row chunk

float dot_f32_rows(const float* a, const float* b, int64_t n) {
  // 8 independent partial sums (auto-vectorizable, and fewer rounding steps than one running sum).
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void check_args(GgmlType type, int64_t rows, int64_t cols, int64_t n_tok) {
  const TypeTraits* tt = type_traits(static_cast<uint32_t>(type));
  STRATA_REQUIRE(tt != nullptr, "matmul: unknown type id {}", static_cast<uint32_t>(type));
  STRATA_REQUIRE(rows >= 0 && cols >= 0 && n_tok >= 0, "matmul: negative shape {}x{} n_tok {}", rows, cols, n_tok);
  STRATA_REQUIRE(cols % tt->block_size == 0, "matmul: {} columns is not a multiple of the {} block size {}", cols,
                 tt->name, tt->block_size);
}

// Exact mode: each row dequantized once into a per-thread f32 buffer, then dotted with every token.
void matmul_exact(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
                  float* y, ThreadPool& pool) {
  STRATA_REQUIRE(can_dequantize(type), "matmul: unsupported type {}", type_name(type));
  const int64_t rb = static_cast<int64_t>(row_bytes(type, cols));
  pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    thread_local std::vector<float> row;  // [cols] f32; grows once, reused across calls
    if (static_cast<int64_t>(row.size()) < cols) row.resize(cols);
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(type, w + r * rb, row.data(), cols);
      for (int64_t t = 0; t < n_tok; ++t) y[t * rows + r] = dot_f32_rows(row.data(), x + t * cols, cols);
    }
  });
}

}  // namespace

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_tok, float* y,
            MatmulMode mode, ThreadPool& pool) {
  check_args(type, rows, cols, n_tok);
  if (rows == 0 || n_tok == 0) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  const q::DotKernel k = mode == MatmulMode::Fast ? q::dot_kernel(type, cpu_level()) : q::DotKernel{};
  if (!k.fn) {  // exact mode, or a type without an integer kernel: dequantize + f32 (still correct)
    matmul_exact(type, wb, rows, cols, x, n_tok, y, pool);
    return;
  }
  // Quantize the activations once per call: [n_tok][xb bytes].
  const int64_t xb = q::act_row_bytes(k.act, cols);
  thread_local std::vector<uint8_t> xq_buf;
  if (static_cast<int64_t>(xq_buf.size()) < xb * n_tok) xq_buf.resize(xb * n_tok);
  uint8_t* xq = xq_buf.data();
  pool.parallel_for(n_tok, 4, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) q::quantize_act_row(k.act, x + t * cols, xq + t * xb, cols);
  });
  const int64_t rb = static_cast<int64_t>(row_bytes(type, cols));
  pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
      const int64_t t1 = std::min(n_tok, t0 + kTokTile);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wr = wb + r * rb;
        for (int64_t t = t0; t < t1; ++t) y[t * rows + r] = k.fn(cols, wr, xq + t * xb);
      }
    }
  });
}

}  // namespace strata
