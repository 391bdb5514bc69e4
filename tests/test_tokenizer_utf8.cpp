// UTF-8 repair (streaming and one-shot) and the GPT-2 byte-level table.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8_decode.h"

using namespace strata::tokenizer;

namespace {
const std::string R = "\xEF\xBF\xBD";  // U+FFFD
}

// Expected values: Python's bytes.decode('utf-8', 'replace') on the same bytes (one U+FFFD per
// maximal subpart).
TEST(TokenizerUtf8, SanitizeMatchesMaximalSubpartPolicy) {
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), R + R + R);        // surrogate
  EXPECT_EQ(sanitize_utf8("\xF0\x80\x80"), R + R + R);        // overlong lead
  EXPECT_EQ(sanitize_utf8("\xE2\x82" "A"), R + "A");          // truncated, then ASCII
  EXPECT_EQ(sanitize_utf8("\xF0\x9F"), R);                    // truncated at the end
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), R + R);                // overlong 2-byte
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(sanitize_utf8("\xE0\x9F\x80"), R + R + R);
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a" + R + "b");
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), R);
  EXPECT_EQ(sanitize_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"), "h\xC3\xA9llo \xF0\x9F\x98\x80");
  EXPECT_TRUE(is_valid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
}

TEST(TokenizerUtf8, StreamingHoldsBackSplitCharacters) {
  Utf8Sanitizer s;
  std::string out;
  const std::string emoji = "\xF0\x9F\x98\x80";
  for (size_t i = 0; i < 3; ++i) {
    s.push(emoji.substr(i, 1), out);
    EXPECT_EQ(out, "") << "byte " << i << " must be held back";
    EXPECT_EQ(s.pending(), i + 1);
  }
  s.push(emoji.substr(3, 1), out);
  EXPECT_EQ(out, emoji);
  EXPECT_EQ(s.pending(), 0u);

  out.clear();
  s.push("\xE2\x82", out);  // "€" cut after two bytes, then completed
  EXPECT_EQ(out, "");
  s.push("\xAC!", out);
  EXPECT_EQ(out, "\xE2\x82\xAC!");

  out.clear();
  s.push("\xE2\x82", out);  // cut, and the next chunk does not continue it
  s.push("A", out);
  EXPECT_EQ(out, R + "A");

  out.clear();
  s.push("\xF0\x9F", out);  // cut at the end of the stream
  s.finish(out);
  EXPECT_EQ(out, R);
  EXPECT_EQ(s.pending(), 0u);

  out.clear();
  s.push("\xF0", out);  // an invalid continuation that itself starts a character
  s.push("\xE2\x82\xAC", out);
  EXPECT_EQ(out, R + "\xE2\x82\xAC");
}

// Any split of any byte string gives the same text as decoding it whole, and the text is valid.
TEST(TokenizerUtf8, StreamingEqualsOneShotOnRandomSplits) {
  std::mt19937 rng(1234);
  const std::string alphabet[] = {"a", " ", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                  "\xFF", "\x80", "\xED\xA0", "\xF4\x90", "\xE0"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes;
    const int n = rng() % 24;
    for (int i = 0; i < n; ++i) {
      const std::string& a = alphabet[rng() % std::size(alphabet)];
      bytes += (rng() % 4 == 0) ? a.substr(0, 1 + rng() % a.size()) : a;
    }
    const std::string whole = sanitize_utf8(bytes);
    ASSERT_TRUE(is_valid_utf8(whole));
    Utf8Sanitizer s;
    std::string out;
    size_t i = 0;
    while (i < bytes.size()) {
      const size_t k = std::min(bytes.size() - i, size_t(1 + rng() % 4));
      s.push(std::string_view(bytes).substr(i, k), out);
      ASSERT_TRUE(is_valid_utf8(out));
      i += k;
    }
    s.finish(out);
    ASSERT_EQ(out, whole) << "iteration " << iter;
  }
}

TEST(TokenizerByteLevel, TableIsGpt2BytesToUnicode) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode(0xAD), "\xC5\x83");  // soft hyphen is the last remapped: U+0143
  EXPECT_EQ(byte_to_unicode(0xE9), "\xC3\xA9");  // 'é' maps to itself
  std::set<std::string_view> seen;
  for (int b = 0; b < 256; ++b) {
    seen.insert(byte_to_unicode(uint8_t(b)));
    std::string s;
    byte_level_encode(std::string(1, char(b)), s);
    EXPECT_EQ(byte_level_decode(s), std::string(1, char(b)));
  }
  EXPECT_EQ(seen.size(), 256u);
  // Text outside the table (added tokens, broken vocabularies) passes through unchanged.
  EXPECT_EQ(byte_level_decode("\xE4\xB8\xAD"), "\xE4\xB8\xAD");
  EXPECT_EQ(byte_level_decode("a\xFF"), "a\xFF");
}
