// BPE, special tokens, BOS/EOS, detokenization and metadata validation on small hand-made
// vocabularies whose expected ids follow from the BPE rules by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

using namespace strata::tokenizer;
using testing::HasSubstr;
using Ids = std::vector<TokenId>;

namespace {

// Ids 0..255 are the single bytes (id == byte value); `extra` follow from id 256.
VocabData byte_vocab(std::vector<std::string> extra = {}, std::vector<std::string> merges = {},
                     std::vector<int32_t> extra_types = {}, const char* pre = "qwen2") {
  VocabData d;
  d.pre = pre;
  for (int b = 0; b < 256; ++b) d.tokens.emplace_back(byte_to_unicode(uint8_t(b)));
  d.token_types.assign(256, 1);
  for (size_t i = 0; i < extra.size(); ++i) {
    d.tokens.push_back(extra[i]);
    d.token_types.push_back(i < extra_types.size() ? extra_types[i] : 1);
  }
  d.merges = std::move(merges);
  return d;
}

Ids bytes_of(std::string_view s) {
  Ids r;
  for (unsigned char c : s) r.push_back(c);
  return r;
}

std::string error_of(const VocabData& d) {
  try {
    Tokenizer::from_data(d);
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TokenizerBpe, LowerRankMergesFirst) {
  auto t1 = Tokenizer::from_data(byte_vocab({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_EQ(t1.tokenize("abc"), (Ids{256, 'c'}));
  auto t2 = Tokenizer::from_data(byte_vocab({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(t2.tokenize("abc"), (Ids{'a', 257}));
}

TEST(TokenizerBpe, LeftmostPairWinsAmongEqualRanks) {
  auto t = Tokenizer::from_data(byte_vocab({"aa", "aaaa"}, {"a a", "aa aa"}));
  EXPECT_EQ(t.tokenize("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t.tokenize("aaaa"), (Ids{257}));
  EXPECT_EQ(t.tokenize("aaaaa"), (Ids{257, 'a'}));
}

TEST(TokenizerBpe, MultiLevelMergesWithByteLevelSpace) {
  // " hello" is one piece; byte-level it is "Ġhello".
  auto t = Tokenizer::from_data(byte_vocab({"he", "ll", "hell", "hello", "\xC4\xA0hello"},
                                           {"h e", "l l", "he ll", "hell o", "\xC4\xA0 hello"}));
  EXPECT_EQ(t.tokenize(" hello"), (Ids{260}));
  EXPECT_EQ(t.tokenize("hello hello"), (Ids{259, 260}));
  EXPECT_EQ(t.tokenize("hellx"), (Ids{258, 'x'}));
  EXPECT_EQ(t.detokenize(t.tokenize("hello hello")), "hello hello");
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordTokens) {
  // "abc" is a token that no merge produces: llama3 takes it whole, qwen2 does not.
  EXPECT_EQ(Tokenizer::from_data(byte_vocab({"abc"}, {}, {}, "llama3")).tokenize("abc",
                                                                           {.add_special = false}),
            (Ids{256}));
  EXPECT_EQ(Tokenizer::from_data(byte_vocab({"abc"}, {}, {}, "qwen2")).tokenize("abc"),
            (Ids{'a', 'b', 'c'}));
}

TEST(TokenizerBpe, ControlTokensOnlyWithParseSpecial) {
  auto d = byte_vocab({"<|im_start|>", "<think>"}, {}, {3, 4});
  auto t = Tokenizer::from_data(d);
  const std::string s = "x<|im_start|>y";
  EXPECT_EQ(t.tokenize(s, {.parse_special = true}), (Ids{'x', 256, 'y'}));
  // Typed by a user: plain text, byte by byte here (no merges).
  EXPECT_EQ(t.tokenize(s, {.parse_special = false}), bytes_of(s));
  // User-defined tokens are always matched (llama.cpp and Hugging Face do the same).
  EXPECT_EQ(t.tokenize("a<think>b"), (Ids{'a', 257, 'b'}));
  EXPECT_TRUE(t.is_control(256));
  EXPECT_FALSE(t.is_control(257));
  // Rendering: control tokens only when asked.
  EXPECT_EQ(t.detokenize(Ids{'x', 256, 'y'}), "x<|im_start|>y");
  EXPECT_EQ(t.detokenize(Ids{'x', 256, 'y'}, /*render_special=*/false), "xy");
  EXPECT_EQ(t.detokenize(Ids{257}, false), "<think>");
}

TEST(TokenizerBpe, LongestSpecialTokenWins) {
  auto t = Tokenizer::from_data(byte_vocab({"<a>", "<a><b>", "<b>"}, {}, {3, 3, 3}));
  EXPECT_EQ(t.tokenize("<a><b><b><a>", {.parse_special = true}), (Ids{257, 258, 256}));
}

TEST(TokenizerBpe, BosEosPerMetadata) {
  auto d = byte_vocab({"<s>", "</s>"}, {}, {3, 3});
  d.bos_id = 256;
  d.eos_id = 257;
  d.add_bos = true;
  auto t = Tokenizer::from_data(d);
  EXPECT_EQ(t.tokenize("a"), (Ids{256, 'a'}));
  EXPECT_EQ(t.tokenize("a", {.add_special = false}), (Ids{'a'}));
  EXPECT_EQ(t.tokenize(""), (Ids{256}));
  d.add_bos = false;
  d.add_eos = true;
  EXPECT_EQ(Tokenizer::from_data(d).tokenize("a"), (Ids{'a', 257}));
  // llama3 adds BOS by default, qwen2 does not.
  d.add_eos.reset();
  d.add_bos.reset();
  d.pre = "llama3";
  EXPECT_EQ(Tokenizer::from_data(d).tokenize("a"), (Ids{256, 'a'}));
  d.pre = "qwen2";
  EXPECT_EQ(Tokenizer::from_data(d).tokenize("a"), (Ids{'a'}));
  EXPECT_TRUE(Tokenizer::from_data(d).is_eog(257));
  EXPECT_FALSE(Tokenizer::from_data(d).is_eog(256));
}

TEST(TokenizerBpe, EogIncludesImEnd) {
  auto d = byte_vocab({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, {}, {3, 3, 3});
  d.eos_id = 256;
  auto t = Tokenizer::from_data(d);
  EXPECT_EQ(t.eog_ids(), (Ids{256, 258}));
}

TEST(TokenizerBpe, MissingByteTokensBecomeUnknownOrAreDropped) {
  auto d = byte_vocab({"<unk>"}, {}, {2});
  d.tokens['z'] = "not-z";  // the vocabulary lacks the byte 'z'
  EXPECT_EQ(Tokenizer::from_data(d).tokenize("aza"), (Ids{'a', 'a'}));
  d.unk_id = 256;
  EXPECT_EQ(Tokenizer::from_data(d).tokenize("aza"), (Ids{'a', 256, 'a'}));
}

TEST(TokenizerBpe, RoundTripOnRandomTextAndBytes) {
  auto t = Tokenizer::from_data(byte_vocab({"he", "ll", "hell", "hello", "\xC4\xA0hello", "<|x|>"},
                                           {"h e", "l l", "he ll", "hell o", "\xC4\xA0 hello"},
                                           {1, 1, 1, 1, 1, 3}));
  std::mt19937 rng(42);
  const std::string alphabet[] = {"hello", " ", "h", "l", "\n", "\xC3\xA9", "\xE4\xB8\xAD",
                                  "\xF0\x9F\x98\x80", "1", "<|x|>", "'s"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string s;
    for (int i = rng() % 20; i > 0; --i) s += alphabet[rng() % std::size(alphabet)];
    for (bool special : {false, true})
      ASSERT_EQ(t.detokenize(t.tokenize(s, {.parse_special = special})), s);
    // Arbitrary bytes: the tokens' bytes concatenate back to the input exactly.
    std::string raw;
    for (int i = rng() % 20; i > 0; --i) raw += char(rng() % 256);
    std::string back;
    for (TokenId id : t.tokenize(raw)) back += t.token_bytes(id);
    ASSERT_EQ(back, raw);
  }
}

TEST(TokenizerStream, SplitCharacterIsHeldBack) {
  // "😀" = F0 9F 98 80 as two tokens of two bytes each, then as four byte tokens.
  std::string first, second;
  byte_level_encode("\xF0\x9F", first);
  byte_level_encode("\x98\x80", second);
  auto t = Tokenizer::from_data(byte_vocab({first, second, "<|im_end|>"}, {}, {1, 1, 3}));
  StreamDecoder dec(t);
  EXPECT_EQ(dec.push('a'), "a");
  EXPECT_EQ(dec.push(256), "");
  EXPECT_EQ(dec.pending_bytes(), 2u);
  EXPECT_EQ(dec.push(257), "\xF0\x9F\x98\x80");
  for (unsigned char c : std::string("\xF0\x9F\x98")) EXPECT_EQ(dec.push(c), "");
  EXPECT_EQ(dec.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(dec.push(258), "<|im_end|>");
  EXPECT_EQ(dec.flush(), "");
  StreamDecoder quiet(t, /*render_special=*/false);
  EXPECT_EQ(quiet.push(258), "");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementChar) {
  auto t = Tokenizer::from_data(byte_vocab());
  const std::string R = "\xEF\xBF\xBD";
  StreamDecoder dec(t);
  EXPECT_EQ(dec.push(0xFF), R);
  EXPECT_EQ(dec.push(0xE2), "");
  EXPECT_EQ(dec.push('A'), R + "A");  // a character cut short by another
  EXPECT_EQ(dec.push(0xF0), "");
  EXPECT_EQ(dec.flush(), R);          // cut short by the end of the stream
  EXPECT_EQ(t.detokenize(Ids{0xED, 0xA0, 0x80, 'x'}), R + R + R + "x");
}

TEST(TokenizerStream, OutOfRangeIdThrowsAndLosesNothing) {
  auto t = Tokenizer::from_data(byte_vocab());
  StreamDecoder dec(t);
  EXPECT_EQ(dec.push(0xE2), "");
  EXPECT_THROW(dec.push(256), strata::Error);
  EXPECT_THROW(dec.push(-1), strata::Error);
  EXPECT_EQ(dec.push(0x82), "");
  EXPECT_EQ(dec.push(0xAC), "\xE2\x82\xAC");
  EXPECT_THROW(t.detokenize(Ids{1, 999}), strata::Error);
  EXPECT_THROW(t.token_text(256), strata::Error);
}

TEST(TokenizerVocab, BadMetadataIsAClearError) {
  VocabData d = byte_vocab({"ab"}, {"a b"});
  EXPECT_EQ(error_of(d), "(no error)");

  auto e = d;
  e.merges = {"a q"};  // 'q' exists; "aq" does not
  EXPECT_THAT(error_of(e), HasSubstr("merged token 'aq' is not in the vocabulary"));
  e.merges = {"a zz"};
  EXPECT_THAT(error_of(e), HasSubstr("tokenizer.ggml.merges[0] = 'a zz': 'zz' is not a token"));
  e.merges = {"ab"};
  EXPECT_THAT(error_of(e), HasSubstr("not of the form 'left right'"));
  e.merges = {"a b", " "};
  EXPECT_THAT(error_of(e), HasSubstr("tokenizer.ggml.merges[1]"));

  e = d;
  e.token_types.pop_back();
  EXPECT_THAT(error_of(e), HasSubstr("token_type has 256 entries but tokenizer.ggml.tokens has 257"));
  e = d;
  e.token_types[3] = 9;
  EXPECT_THAT(error_of(e), HasSubstr("tokenizer.ggml.token_type[3] = 9"));
  e = d;
  e.bos_id = 257;
  EXPECT_THAT(error_of(e), HasSubstr("bos_token_id = 257 is out of range"));
  e = d;
  e.eos_id = -3;
  EXPECT_THAT(error_of(e), HasSubstr("eos_token_id = -3 is out of range"));
  e = d;
  e.add_bos = true;
  EXPECT_THAT(error_of(e), HasSubstr("bos_token_id is missing"));
  e = d;
  e.pre = "bogus";
  EXPECT_THAT(error_of(e), HasSubstr("unsupported pre-tokenizer tokenizer.ggml.pre = 'bogus'"));
  e = d;
  e.model = "llama";
  EXPECT_THAT(error_of(e), HasSubstr("tokenizer.ggml.model = 'llama' is not supported"));
  e = d;
  e.tokens.clear();
  e.token_types.clear();
  EXPECT_THAT(error_of(e), HasSubstr("tokenizer.ggml.tokens is empty"));
}

TEST(TokenizerVocab, HostileTokenTextIsHarmless) {
  // Empty and ill-formed token texts, an empty special token: no crash, no endless loop.
  auto d = byte_vocab({"", "\xFF\xFE", "", "\xC4"}, {}, {1, 1, 3, 4});
  auto t = Tokenizer::from_data(d);
  EXPECT_EQ(t.tokenize("ab", {.parse_special = true}), (Ids{'a', 'b'}));
  EXPECT_EQ(t.detokenize(Ids{257}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.detokenize(Ids{256, 258}), "");
}
