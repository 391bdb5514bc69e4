#pragma once
// Matrix products against quantized weights, the CPU hot path.
//   W: [rows][cols] in `type`, row-major as GGUF stores it (ne[0] = cols), rows contiguous.
//   x: [n_tok][cols] f32, y: [n_tok][rows] f32:  y[t][r] = sum_c W[r][c] * x[t][c]
// Exact mode: each weight row is dequantized to f32 and accumulated in f32 against unquantized x
// (the reference every other path is measured against). Fast mode: the best kernel this CPU has
// (AVX-512 / AVX2 / scalar, picked at run time), which may quantize x per block like ggml does.
// Formats and tolerances: docs/quant.md. Bad shapes or an unsupported type throw strata::Error.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "quant/types.h"

namespace strata {

// FastPrecise: fast mode with a second int8 pass for the activations' rounding residual
// (x ~ q1 * d1 + q2 * d2): twice the integer work, activation error ~250x smaller than Fast. For
// decode, where the weights' memory traffic dominates, it costs little; it is the fast mode to use when
// a model's routing is sensitive to rounding. Formats with F32 activations (F32/F16/BF16) are exact.
enum class MatmulMode { Exact, Fast, FastPrecise };

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
            float* y, MatmulMode mode, ThreadPool& pool);

// One product of a batch (shapes as above).
struct MatmulJob {
  GgmlType type;
  const void* w;       // [rows][cols] in `type`
  int64_t rows, cols;
  const float* x;      // [n_tok][cols]
  int64_t n_tok;
  float* y;            // [n_tok][rows]
};

// Independent products in one parallel region: one wake-up of the pool for all of them (e.g. the gate
// and up projections of every routed expert of a MoE layer). Results equal matmul() on each job.
// Jobs with the same x pointer (and n_tok, cols) quantize their activations once between them.
// Not re-entrant on the same pool (like ThreadPool::parallel_for).
void matmul_many(const MatmulJob* jobs, int64_t n_jobs, MatmulMode mode, ThreadPool& pool);

// Weight streams per work item: a large job's work item takes the same rows of up to this many far-apart
// parts of W in turns (one core reads DRAM faster through a few sequential streams than through one;
// matmul.cpp). STRATA_MATMUL_STREAMS (1..4, default 3, read once) or the last matmul_set_streams
// (benchmarks compare settings in one process). Results do not depend on it.
int matmul_streams();
void matmul_set_streams(int n);

}  // namespace strata
