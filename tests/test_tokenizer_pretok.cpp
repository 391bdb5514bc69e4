// Pre-tokenizer splits. Expected pieces are worked out by hand from the regexes' semantics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "tokenizer/pretokenizer.h"

using namespace strata::tokenizer;

namespace {
std::vector<std::string> split(const char* pre, std::string_view text) {
  PreTokenizer p(pre);
  std::vector<Piece> pieces;
  p.split(text, pieces);
  std::vector<std::string> r;
  for (auto& x : pieces) r.emplace_back(text.substr(x.offset, x.length));
  return r;
}
using V = std::vector<std::string>;
}  // namespace

TEST(TokenizerPreTok, Qwen2) {
  EXPECT_EQ(split("qwen2", "Hello world 123"), (V{"Hello", " world", " ", "1", "2", "3"}));
  EXPECT_EQ(split("qwen2", "  Hello"), (V{" ", " Hello"}));
  EXPECT_EQ(split("qwen2", "I'm HERE'S"), (V{"I", "'m", " HERE", "'S"}));
  EXPECT_EQ(split("qwen2", "x<|im_start|>y"), (V{"x", "<|", "im", "_start", "|>", "y"}));
  EXPECT_EQ(split("qwen2", "a.\n\nb"), (V{"a", ".\n\n", "b"}));
  EXPECT_EQ(split("qwen2", "a \n b"), (V{"a", " \n", " b"}));
}

TEST(TokenizerPreTok, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(split("llama3", "12345 x"), (V{"123", "45", " x"}));
  EXPECT_EQ(split("llama-bpe", "1234567"), (V{"123", "456", "7"}));
  PreTokenizer p("llama3");
  EXPECT_TRUE(p.ignore_merges());
  EXPECT_TRUE(p.default_add_bos());
  EXPECT_FALSE(PreTokenizer("qwen2").default_add_bos());
}

TEST(TokenizerPreTok, Qwen35KeepsCombiningMarksWithLetters) {
  const std::string s = "e\xCC\x81x";  // 'e', U+0301 COMBINING ACUTE ACCENT, 'x'
  EXPECT_EQ(split("qwen2", s), (V{"e", "\xCC\x81x"}));
  EXPECT_EQ(split("qwen35", s), (V{s}));
}

TEST(TokenizerPreTok, DeepseekV3) {
  // Digits by three first, then CJK runs, then the main pattern; text between matches is kept.
  EXPECT_EQ(split("deepseek-v3", "abc 12345 \xE4\xB8\xAD\xE6\x96\x87"),
            (V{"abc", " ", "123", "45", " ", "\xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(split("deepseek-v3", "x.Hello"), (V{"x", ".Hello"}));
}

TEST(TokenizerPreTok, DeepseekLlm) {
  EXPECT_EQ(split("deepseek-llm", "Hello, world!\n123"),
            (V{"Hello", ",", " world", "!", "\n", "123"}));
  // Newlines are split off first; the whitespace run before one becomes its own piece.
  EXPECT_EQ(split("deepseek-llm", "a  \n"), (V{"a", "  ", "\n"}));
}

TEST(TokenizerPreTok, Gpt4oSplitsCamelCase) {
  EXPECT_EQ(split("gpt-4o", "HelloWorld it's"), (V{"Hello", "World", " it's"}));
}

TEST(TokenizerPreTok, KimiK2SplitsHanFromOtherLetters) {
  const std::string han = "\xE4\xB8\x96\xE7\x95\x8C";  // two Han characters
  EXPECT_EQ(split("kimi-k2", "Hello" + han + " it's"), (V{"Hello", han, " it's"}));
  EXPECT_EQ(split("gpt-4o", "Hello" + han), (V{"Hello" + han}));  // Han is \p{Lo} there
}

TEST(TokenizerPreTok, PiecesCoverAnyInputExactly) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "7", "'s", ".",
                                  "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xCC\x81",
                                  "\xFF", "\x80", "\xE2\x82", "\x00"};
  for (const auto& name : PreTokenizer::supported_names()) {
    PreTokenizer p(name);
    for (int iter = 0; iter < 300; ++iter) {
      std::string text;
      const int n = rng() % 30;
      for (int i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
      std::vector<Piece> pieces;
      p.split(text, pieces);
      std::string joined;
      uint32_t expect_off = 0;
      for (auto& x : pieces) {
        ASSERT_EQ(x.offset, expect_off) << name;
        ASSERT_GT(x.length, 0u) << name;
        expect_off += x.length;
        joined += text.substr(x.offset, x.length);
      }
      ASSERT_EQ(joined, text) << name;
    }
  }
}

TEST(TokenizerPreTok, UnknownNameIsAClearError) {
  try {
    PreTokenizer p("no-such-pre");
    FAIL() << "no error";
  } catch (const strata::Error& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("no-such-pre"));
    EXPECT_THAT(e.what(), testing::HasSubstr("qwen2"));  // lists what is supported
  }
  for (const char* n : {"qwen2", "qwen35", "llama3", "llama-bpe", "deepseek-llm", "deepseek-v3"})
    EXPECT_TRUE(PreTokenizer::is_supported(n)) << n;
}

// Long runs of one class must neither fail (PCRE2's match limit) nor lose text, for every family.
TEST(TokenizerPreTok, LongRunsSplitWithoutError) {
  const std::string runs[] = {std::string(200000, ' ') + "\xE4\xB8\xAD" + "x",
                              std::string(200000, 'a'), std::string(100000, '1'),
                              std::string(100000, '\n') + "a", std::string(50000, '!') + " "};
  for (const auto& name : PreTokenizer::supported_names()) {
    PreTokenizer p(name);
    for (const auto& text : runs) {
      std::vector<Piece> pieces;
      ASSERT_NO_THROW(p.split(text, pieces)) << name;
      size_t total = 0;
      for (auto& x : pieces) total += x.length;
      EXPECT_EQ(total, text.size()) << name;
    }
  }
}
