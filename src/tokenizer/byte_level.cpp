#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8_decode.h"

namespace strata::tokenizer {

namespace {
// The table of GPT-2's bytes_to_unicode(): bytes that are printable ('!'..'~', '¡'..'¬', '®'..'ÿ')
// map to themselves, the other 68 to U+0100.. in byte order.
struct Tables {
  std::array<uint32_t, 256> cp{};
  std::array<std::string, 256> utf8;
  std::array<int16_t, 0x144> byte{};  // cp -> byte; the largest code point used is U+0143
  Tables() {
    byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(utf8[b], cp[b]);
      byte[cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

std::string_view byte_to_unicode(uint8_t b) { return tables().utf8[b]; }

int unicode_to_byte(uint32_t cp) {
  const auto& t = tables();
  return cp < t.byte.size() ? t.byte[cp] : -1;
}

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& t = tables();
  for (unsigned char c : bytes) out += t.utf8[c];
}

std::string byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    const Utf8Step st = utf8_step(p + i, text.size() - i);
    if (st.kind == Utf8Step::kValid) {
      const int b = unicode_to_byte(st.codepoint);
      if (b >= 0) {
        out += static_cast<char>(b);
      } else {
        out.append(text.data() + i, st.len);
      }
    } else {
      out.append(text.data() + i, st.len);  // not UTF-8: keep the raw bytes
    }
    i += st.len;
  }
  return out;
}

}  // namespace strata::tokenizer
