#include "cpu/matmul_batch.h"

#include "common/error.h"

namespace strata::cpu {

void MatmulBatch::run(MatmulMode mode, ThreadPool& pool) {
  for (const auto& t : tasks_)
    STRATA_REQUIRE(t.n_tok <= max_tok_, "matmul batch: {} tokens, built for {}", t.n_tok, max_tok_);
  matmul_many(tasks_.data(), static_cast<int64_t>(tasks_.size()), mode, pool);
}

}  // namespace strata::cpu
