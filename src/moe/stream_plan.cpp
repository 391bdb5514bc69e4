#include "moe/stream_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace strata::moe {

bool parse_unit_share(const std::string& text, double* share) {
  char* end = nullptr;
  // strtod skips leading spaces and reads "nan"/"inf": only plain decimals pass.
  const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.');
  const double v = plain ? std::strtod(text.c_str(), &end) : NAN;
  if (!(plain && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0 && v <= 1)) return false;
  *share = v;
  return true;
}

DecodeStreamMode DecodeStreamMode::parse(const std::string& text, const std::string& what) {
  DecodeStreamMode m;
  if (text == "auto") return m;
  if (text == "off") {
    m.kind = Off;
    return m;
  }
  double v = 0;
  STRATA_REQUIRE(parse_unit_share(text, &v), "{} must be auto, off or a share of the misses in [0, 1], got '{}'",
                 what, text);
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

namespace {
// The running average of both cost classes: the first timing as it is, then an exponential average with
// weight 1/8 for the new one. Timings of `count` <= 0 items or not finite are ignored.
void note_timing(double& avg, double us, double count) {
  if (count <= 0 || !std::isfinite(us) || us < 0) return;
  const double per = us / count;
  avg = avg > 0 ? avg + (per - avg) / 8 : per;
}
}  // namespace

void DecodeStreamCosts::note_cpu(double us, int experts) { note_timing(cpu_us_, us, double(experts)); }

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

PrefillStreamMode PrefillStreamMode::parse(const std::string& text, const std::string& what) {
  PrefillStreamMode m;
  if (text == "fixed") return m;
  STRATA_REQUIRE(text == "auto", "{} must be fixed or auto, got '{}'", what, text);
  m.kind = Auto;
  return m;
}

PrefillStreamCosts::PrefillStreamCosts(double copy_us) : copy_us_(std::isfinite(copy_us) && copy_us > 0 ? copy_us : 0) {}

void PrefillStreamCosts::note_cpu(double us, int64_t pairs) { note_timing(pair_us_, us, double(pairs)); }

int prefill_stream_count(const std::vector<int32_t>& pairs, int64_t other_pairs, const PrefillStreamCosts& costs) {
  const int n = int(pairs.size());
  if (costs.copy_us() <= 0 || costs.pair_us() <= 0) return n;
  int64_t rest = std::max<int64_t>(other_pairs, 0);  // CPU pairs when the first k are copied
  for (int32_t p : pairs) rest += std::max(p, 0);
  int k = 0;
  double best = costs.pair_us() * double(rest);
  for (int j = 1; j <= n; ++j) {
    rest -= std::max(pairs[size_t(j - 1)], 0);
    const double t = std::max(j * costs.copy_us(), costs.pair_us() * double(rest));
    if (t <= best) best = t, k = j;
  }
  return k;
}

}  // namespace strata::moe
