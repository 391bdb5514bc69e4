#include "moe/stream_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace strata::moe {

DecodeStreamMode DecodeStreamMode::parse(const std::string& text, const std::string& what) {
  DecodeStreamMode m;
  if (text == "auto") return m;
  if (text == "off") {
    m.kind = Off;
    return m;
  }
  char* end = nullptr;
  // strtod skips leading spaces and reads "nan"/"inf": only plain decimals pass.
  const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.');
  const double v = plain ? std::strtod(text.c_str(), &end) : NAN;
  STRATA_REQUIRE(plain && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0 && v <= 1,
                 "{} must be auto, off or a share of the misses in [0, 1], got '{}'", what, text);
  if (v == 0) {
    m.kind = Off;
  } else {
    m.kind = Share;
    m.share = v;
  }
  return m;
}

std::string DecodeStreamMode::str() const {
  if (kind == Off) return "off";
  if (kind == Auto) return "auto";
  std::string s = std::to_string(share);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

DecodeStreamCosts::DecodeStreamCosts(double copy_us)
    : copy_us_(std::isfinite(copy_us) && copy_us > 0 ? copy_us : 0),
      cpu_us_(copy_us_) {}

void DecodeStreamCosts::note_cpu(double us, int experts) {
  if (experts <= 0 || !std::isfinite(us) || us < 0) return;
  const double per = us / experts;
  cpu_us_ = cpu_us_ > 0 ? cpu_us_ + (per - cpu_us_) / 8 : per;
}

int decode_stream_count(int misses, const DecodeStreamMode& mode, const DecodeStreamCosts& costs, int max_slots) {
  if (misses <= 0 || max_slots <= 0 || mode.kind == DecodeStreamMode::Off) return 0;
  int k = 0;
  if (mode.kind == DecodeStreamMode::Share) {
    k = int(std::lround(mode.share * misses));
  } else if (costs.copy_us() <= 0) {
    k = 0;  // no measured copy cost: nothing to balance against
  } else {
    double best = 0;
    for (int j = 0; j <= misses; ++j) {
      const double t = std::max(j * costs.copy_us(), (misses - j) * costs.cpu_us());
      if (j == 0 || t < best) best = t, k = j;
    }
  }
  return std::clamp(k, 0, std::min(misses, max_slots));
}

}  // namespace strata::moe
