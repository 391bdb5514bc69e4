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

TextStream::TextStream(std::vector<std::string> stops) : stop_(std::move(stops)) {}

std::string TextStream::push(std::string_view piece) {
  if (stop_.stopped()) return {};
  // stop_ only releases bytes that can no longer be part of a stop string, so holding its output
  // back for UTF-8 reasons never hides a stop match.
  std::string out = utf8_pending_ + stop_.feed(piece);
  utf8_pending_.clear();
  if (stop_.stopped()) return out;  // the text before the stop string, as it is
  const size_t tail = utf8_incomplete_tail(out);
  utf8_pending_.assign(out, out.size() - tail, tail);
  out.resize(out.size() - tail);
  return out;
}

std::string TextStream::flush() {
  if (stop_.stopped()) return {};
  std::string out = utf8_pending_ + stop_.finish();
  utf8_pending_.clear();
  return out;
}

}  // namespace strata::server
