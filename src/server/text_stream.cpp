#include "server/text_stream.h"

#include <algorithm>

namespace strata::server {

size_t utf8_incomplete_tail(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the lead byte of the last character.
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0 ? 4 : 1;  // invalid lead byte: treat as complete
    return back < need ? back : 0;
  }
  return 0;  // only continuation bytes: invalid, nothing to wait for
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string TextStream::push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  // A stop string can only start inside pending_: released text never ends with a stop's prefix.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t maxk = std::min(s.size() - 1, pending_.size());
    for (size_t k = maxk; k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  size_t release = pending_.size() - hold;
  release -= utf8_incomplete_tail(std::string_view(pending_).substr(0, release));
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

std::string TextStream::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace strata::server
