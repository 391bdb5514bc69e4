#include "cuda/host/slot_spec.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace strata::cuda {

namespace {
// Digits only, no sign, at most 9 of them (fits an int). -1 when not that.
int64_t parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9) return -1;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return std::stoll(s);
}
}  // namespace

int expert_slots_from_spec(const std::string& spec, int total, int64_t slot_bytes, int64_t avail_bytes) {
  STRATA_REQUIRE(total >= 0 && slot_bytes > 0, "expert cache: {} experts of {} bytes", total, slot_bytes);
  if (spec == "auto") {
    if (avail_bytes <= 0) return 0;
    return int(std::min<int64_t>(total, avail_bytes / slot_bytes));
  }
  if (!spec.empty() && spec.back() == '%') {
    const int64_t pct = parse_count(spec.substr(0, spec.size() - 1));
    STRATA_REQUIRE(pct >= 0 && pct <= 100,
                   "--expert-cache '{}': a percentage must be 0% to 100% of the {} experts", spec, total);
    return int(int64_t(total) * pct / 100);
  }
  const int64_t n = parse_count(spec);
  STRATA_REQUIRE(n >= 0, "--expert-cache must be a slot count N, a percentage N% or auto, got '{}'", spec);
  return int(std::min<int64_t>(total, n));
}

}  // namespace strata::cuda
