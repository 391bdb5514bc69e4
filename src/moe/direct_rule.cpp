#include "moe/direct_rule.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace strata::moe {

int parse_direct_share(const std::string& text, const std::string& what) {
  if (text == "off") return 0;
  char* end = nullptr;
  // strtod skips leading spaces and reads "nan"/"inf": only plain decimals pass.
  const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.');
  const double v = plain ? std::strtod(text.c_str(), &end) : NAN;
  STRATA_REQUIRE(plain && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0 && v <= 1,
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
