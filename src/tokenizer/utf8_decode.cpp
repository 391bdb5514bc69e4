#include "tokenizer/utf8_decode.h"

#include <cstring>

namespace strata::tokenizer {

namespace {
// Allowed range of the second byte for each lead byte (Unicode Table 3-7); later bytes: 80..BF.
struct Lead {
  uint8_t len, lo, hi;
};
inline Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // <= U+10FFFF
  return {0, 0, 0};                       // 80..C1, F5..FF never start a character
}
}  // namespace

Utf8Step utf8_step(const uint8_t* p, size_t n) {
  const uint8_t b0 = p[0];
  const Lead l = lead_info(b0);
  if (l.len == 1) return {Utf8Step::kValid, 1, b0};
  if (l.len == 0) return {Utf8Step::kInvalid, 1, 0};
  // Walk the continuation bytes; stop at the first one that does not fit.
  size_t i = 1;
  for (; i < l.len; ++i) {
    if (i >= n) return {Utf8Step::kIncomplete, static_cast<uint8_t>(n), 0};
    const uint8_t lo = i == 1 ? l.lo : 0x80, hi = i == 1 ? l.hi : 0xBF;
    if (p[i] < lo || p[i] > hi) return {Utf8Step::kInvalid, static_cast<uint8_t>(i), 0};
  }
  uint32_t cp = b0 & (0x7F >> l.len);
  for (i = 1; i < l.len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  return {Utf8Step::kValid, l.len, cp};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {  // fast path for ASCII
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(p + i, s.size() - i);
    if (st.kind != Utf8Step::kValid) return false;
    i += st.len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  Utf8Sanitizer san;
  san.push(s, out);
  san.finish(out);
  return out;
}

void Utf8Sanitizer::push(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  // Complete a held-back character first, one byte at a time (at most 3 more bytes matter).
  while (n_pending_ > 0 && n > 0) {
    pending_[n_pending_++] = *p++;
    --n;
    const Utf8Step st = utf8_step(pending_, n_pending_);
    if (st.kind == Utf8Step::kIncomplete) continue;
    if (st.kind == Utf8Step::kValid) {
      out.append(reinterpret_cast<const char*>(pending_), st.len);
      n_pending_ = 0;
    } else {
      // The held bytes [0, st.len) are one maximal subpart; the rest is re-examined as new input.
      out += kReplacementChar;
      uint8_t rest[4];
      const size_t n_rest = n_pending_ - st.len;
      std::memcpy(rest, pending_ + st.len, n_rest);
      n_pending_ = 0;
      std::string tail;
      push(std::string_view(reinterpret_cast<const char*>(rest), n_rest), tail);
      out += tail;
    }
  }
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      size_t j = i + 1;
      while (j < n && p[j] < 0x80) ++j;
      out.append(reinterpret_cast<const char*>(p + i), j - i);
      i = j;
      continue;
    }
    const Utf8Step st = utf8_step(p + i, n - i);
    if (st.kind == Utf8Step::kValid) {
      out.append(reinterpret_cast<const char*>(p + i), st.len);
    } else if (st.kind == Utf8Step::kInvalid) {
      out += kReplacementChar;
    } else {
      std::memcpy(pending_ + n_pending_, p + i, st.len);
      n_pending_ += st.len;
    }
    i += st.len;
  }
}

void Utf8Sanitizer::finish(std::string& out) {
  if (n_pending_ > 0) out += kReplacementChar;  // a truncated character is one maximal subpart
  n_pending_ = 0;
}

}  // namespace strata::tokenizer
