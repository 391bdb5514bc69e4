#include "cpu/matmul_batch.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace strata::cpu {

MatmulBatch::MatmulBatch(int n_threads, int64_t max_tok) : max_tok_(max_tok) {
  for (int i = 0; i < n_threads; ++i) {
    serial_.push_back(std::make_unique<ThreadPool>(1));
    tmp_.emplace_back(static_cast<size_t>(max_tok > 1 ? max_tok * kMaxChunkRows : 0));
  }
  tasks_.reserve(1024);
  chunk_rows_.reserve(1024);
  first_chunk_.reserve(1025);
}

void MatmulBatch::run(MatmulMode mode, ThreadPool& pool) {
  STRATA_REQUIRE(static_cast<size_t>(pool.size()) <= serial_.size(),
                 "matmul batch built for {} threads, pool has {}", serial_.size(), pool.size());
  first_chunk_.clear();
  chunk_rows_.clear();
  first_chunk_.push_back(0);
  const int64_t want_items = 8 * static_cast<int64_t>(pool.size());
  const int64_t n_tasks = static_cast<int64_t>(tasks_.size());
  const int64_t per_task = std::max<int64_t>(1, (want_items + n_tasks - 1) / n_tasks);
  for (const auto& t : tasks_) {
    STRATA_REQUIRE(t.n_tok <= max_tok_, "matmul batch: {} tokens, built for {}", t.n_tok, max_tok_);
    int64_t cr = std::max(kMinChunkRows, ((t.rows + per_task - 1) / per_task + 15) / 16 * 16);
    if (t.n_tok > 1) cr = std::min(cr, kMaxChunkRows);  // bounded by the scatter buffer
    if (cr >= t.rows) cr = t.rows;
    cr = std::max<int64_t>(cr, 1);
    chunk_rows_.push_back(cr);
    first_chunk_.push_back(first_chunk_.back() + (t.rows + cr - 1) / cr);
  }
  const int64_t n_chunks = first_chunk_.back();
  pool.parallel_for(n_chunks, 1, [&](int64_t b, int64_t e, int thread) {
    ThreadPool& serial = *serial_[static_cast<size_t>(thread)];
    for (int64_t c = b; c < e; ++c) {
      const size_t ti = static_cast<size_t>(
          std::upper_bound(first_chunk_.begin(), first_chunk_.end(), c) - first_chunk_.begin() - 1);
      const MatmulTask& t = tasks_[ti];
      const int64_t cr = chunk_rows_[ti];
      const int64_t r0 = (c - first_chunk_[ti]) * cr;
      const int64_t nr = std::min(cr, t.rows - r0);
      const auto* w = static_cast<const uint8_t*>(t.w) + r0 * row_bytes(t.type, t.cols);
      if (t.n_tok == 1 || nr == t.rows) {  // output rows are contiguous: write in place
        matmul(t.type, w, nr, t.cols, t.x, t.n_tok, t.y + r0, mode, serial);
      } else {  // y chunk is [n_tok][nr]: compute aside, scatter into y [n_tok][rows]
        float* tmp = tmp_[static_cast<size_t>(thread)].data();
        matmul(t.type, w, nr, t.cols, t.x, t.n_tok, tmp, mode, serial);
        for (int64_t i = 0; i < t.n_tok; ++i)
          std::memcpy(t.y + i * t.rows + r0, tmp + i * nr, static_cast<size_t>(nr) * 4);
      }
    }
  });
}

}  // namespace strata::cpu
