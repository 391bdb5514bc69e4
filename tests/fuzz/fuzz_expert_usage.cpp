// libFuzzer target for the expert-usage JSON (moe::ExpertUsage::from_json, the file `strata profile`
// writes and the expert cache loads). Any input either loads or throws strata::Error; what loads has
// consistent statistics and survives a to_json -> from_json round trip unchanged.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "common/error.h"
#include "moe/expert_usage.h"

using namespace strata;

#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) __builtin_trap(); \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::ExpertUsage u;
  try {
    u = moe::ExpertUsage::from_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
    return 0;
  }
  const moe::ExpertUsage v = moe::ExpertUsage::from_json(u.to_json(-1));  // no catch: must load
  FUZZ_CHECK(v.n_layer() == u.n_layer() && v.n_expert() == u.n_expert());
  for (int l = 0; l < u.n_layer(); ++l) {
    const moe::LayerUsageStats s = u.layer_stats(l);
    FUZZ_CHECK(s.selections == s.tokens * u.n_expert_used());
    FUZZ_CHECK(s.entropy_bits >= 0 && s.entropy_bits <= std::log2(double(u.n_expert())) + 1e-9);
    FUZZ_CHECK(s.top25_share >= 0 && s.top25_share <= 1.0 + 1e-12);
    FUZZ_CHECK(v.tokens(l) == u.tokens(l));
    for (int e = 0; e < u.n_expert(); ++e) FUZZ_CHECK(v.count(l, e) == u.count(l, e));
  }
  return 0;
}
