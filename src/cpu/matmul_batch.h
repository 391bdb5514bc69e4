#pragma once
// Several independent matrix products run as one parallel job: every product is cut into row chunks
// and the chunks of all products are handed out together, each computed by strata::matmul on the
// worker's own one-thread pool. Why: a decode step of an MoE layer is ~24 small products (8 experts x
// gate/up/down); one pool wake-up per product costs more than the products on a busy 2-core machine,
// and one job over all chunks keeps every core busy until the last row.
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/thread_pool.h"
#include "quant/matmul.h"

namespace strata::cpu {

struct MatmulTask {
  GgmlType type;
  const void* w;  // [rows][cols] in `type`
  int64_t rows, cols;
  const float* x; // [n_tok][cols]
  int64_t n_tok;
  float* y;       // [n_tok][rows]
};

class MatmulBatch {
 public:
  // max_tok: the largest n_tok of a task (sizes the per-thread scatter buffers).
  MatmulBatch(int n_threads, int64_t max_tok);
  void clear() { tasks_.clear(); }
  void add(const MatmulTask& t) { tasks_.push_back(t); }
  // Runs every task added since clear(). No allocation once the task list has reached its size.
  void run(MatmulMode mode, ThreadPool& pool);

 private:
  // Row chunking. strata::matmul quantizes x once per call, so every chunk re-quantizes its task's
  // activations: tasks are split only as far as the pool needs work items (about 8 per thread over
  // all tasks, chunks of >= kMinChunkRows rows); multi-token chunks are at most kMaxChunkRows rows
  // (the per-thread scatter buffer).
  static constexpr int64_t kMinChunkRows = 32;
  static constexpr int64_t kMaxChunkRows = 1024;
  std::vector<MatmulTask> tasks_;
  std::vector<int64_t> chunk_rows_;                  // [tasks] rows per chunk of each task
  std::vector<int64_t> first_chunk_;                 // [tasks + 1] prefix sums of chunk counts
  std::vector<std::unique_ptr<ThreadPool>> serial_;  // [n_threads] one-thread pools
  std::vector<std::vector<float>> tmp_;              // [n_threads][max_tok * kMaxChunkRows]
  int64_t max_tok_;
};

}  // namespace strata::cpu
