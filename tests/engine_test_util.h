#pragma once
// Engine settings and token runs shared by the engine tests on the tiny in-memory model (tiny_model.h).
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace strata::test {

// Exact mode (results independent of batching), 2 threads, ctx positions, passes of up to batch tokens.
inline EngineOptions exact_opts(int ctx = 64, int batch = 512) {
  EngineOptions o;
  o.n_ctx = ctx;
  o.n_batch = batch;
  o.n_threads = 2;
  o.mode = MatmulMode::Exact;
  return o;
}

// n token ids below vocab, a fixed run for each seed.
inline std::vector<int32_t> some_tokens(int n, int vocab, int seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 37 + seed * 11) % vocab;
  return t;
}

}  // namespace strata::test
