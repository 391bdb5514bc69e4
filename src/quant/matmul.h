#pragma once
// Matrix products against quantized weights, the CPU hot path.
//   W: [rows][cols] in `type`, row-major as GGUF stores it (ne[0] = cols), rows contiguous.
//   x: [n_tok][cols] f32, y: [n_tok][rows] f32:  y[t][r] = sum_c W[r][c] * x[t][c]
// Exact mode: each weight row is dequantized to f32 and accumulated in f32 against unquantized x
// (the reference every other path is measured against). Fast mode: the best kernel this CPU has
// (AVX-512 / AVX2 / scalar, picked at run time), which may quantize x per block like ggml does.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "quant/types.h"

namespace strata {

enum class MatmulMode { Exact, Fast };

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
            float* y, MatmulMode mode, ThreadPool& pool);

}  // namespace strata
