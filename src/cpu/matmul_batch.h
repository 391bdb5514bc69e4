#pragma once
// Several independent matrix products run as one parallel job (strata::matmul_many: activations
// quantized once per product, the row chunks of all products handed out together). Why: a decode
// step of an MoE layer is ~24 small products (8 experts x gate/up/down); one pool wake-up per product
// costs more than the products on a busy 2-core machine, and one job over all chunks keeps every core
// busy until the last row. This class owns the task list so the forward pass allocates nothing once
// the list has reached its size.
#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "quant/matmul.h"

namespace strata::cpu {

using MatmulTask = MatmulJob;  // {type, w [rows][cols], rows, cols, x [n_tok][cols], n_tok, y [n_tok][rows]}

class MatmulBatch {
 public:
  MatmulBatch(int n_threads, int64_t max_tok) : max_tok_(max_tok) { tasks_.reserve(1024); }
  void clear() { tasks_.clear(); }
  void add(const MatmulTask& t) { tasks_.push_back(t); }
  // Runs every task added since clear().
  void run(MatmulMode mode, ThreadPool& pool);

 private:
  std::vector<MatmulTask> tasks_;
  int64_t max_tok_;
};

}  // namespace strata::cpu
