#include "moe/direct_rule.h"

#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "moe/stream_plan.h"

namespace strata::moe {

int parse_direct_share(const std::string& text, const std::string& what) {
  if (text == "off") return 0;
  double v = 0;
  STRATA_REQUIRE(parse_unit_share(text, &v),
                 "{} must be off or a share of each token's non-resident experts in [0, 1], got '{}'", what, text);
  return static_cast<int>(std::lround(v * kDirectShareOne));
}

std::string direct_share_str(int share) {
  if (share <= 0) return "off";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", double(share) / kDirectShareOne);
  return buf;
}

}  // namespace strata::moe
