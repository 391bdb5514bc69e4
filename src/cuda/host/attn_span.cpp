#include "cuda/host/attn_span.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace strata::cuda {

int64_t attention_span(int64_t n_kv, int64_t n_ctx_max) {
  STRATA_REQUIRE(n_kv >= 1 && n_kv <= n_ctx_max, "attention span: {} positions in a context of {}", n_kv, n_ctx_max);
  int64_t span = kAttnSpanMin;
  while (span < n_kv) span *= 2;  // (n_kv <= n_ctx_max, an int64: no overflow before it stops)
  return std::min(span, n_ctx_max);
}

int64_t pass_attention_span(int64_t n_kv, int64_t n_ctx_max) {
  static const bool whole_context = [] {
    const char* e = std::getenv("STRATA_CUDA_ATTN_SPAN");
    return e != nullptr && std::string(e) == "ctx";
  }();
  const int64_t span = attention_span(n_kv, n_ctx_max);  // (its checks either way)
  return whole_context ? n_ctx_max : span;
}

}  // namespace strata::cuda
