// The tokenizer against ground truth: llama.cpp's ids for the real Qwen2/3 vocabulary
// (fixtures/vocab), round trips, an independent reference BPE, and the tiny fixture model's vocab.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8_decode.h"
#include "tokenizer_reference_bpe.h"

using namespace strata;
using namespace strata::tokenizer;
using Ids = std::vector<TokenId>;
using strata::tokenizer::reference::ReferenceBpe;

namespace {

const std::string kVocabDir = std::string(STRATA_FIXTURES_DIR) + "/vocab";
const std::string kQwen2Vocab = kVocabDir + "/ggml-vocab-qwen2.gguf";
const std::string kTinyModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q8_0.gguf";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// .inp: strings separated by lines "__ggml_vocab_test__", each less the newline that ends it.
std::vector<std::string> read_inp(const std::string& path) {
  const std::string all = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> r;
  size_t p = 0;
  for (size_t q; (q = all.find(sep, p)) != std::string::npos; p = q + sep.size())
    r.push_back(all.substr(p, q - p));
  return r;
}

std::vector<Ids> read_out(const std::string& path) {
  std::ifstream in(path);
  std::vector<Ids> r;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    Ids ids;
    for (TokenId x; ls >> x;) ids.push_back(x);
    r.push_back(ids);
  }
  return r;
}

// Random valid UTF-8 from a mix of scripts, whitespace, digits, marks, emoji and any code point.
std::string random_utf8(std::mt19937& rng, int max_chars) {
  static const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x20, 0x7E},     {0x20, 0x7E},       {0x09, 0x0D},   {0x30, 0x39},   {0xA0, 0xFF},
      {0x400, 0x4FF},   {0x300, 0x36F},     {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x3040, 0x30FF},
      {0x1F300, 0x1FAFF}, {0x2000, 0x206F}, {0x1, 0x10FFFF}};
  std::string s;
  const int n = rng() % (max_chars + 1);
  for (int i = 0; i < n; ++i) {
    const auto [lo, hi] = ranges[rng() % std::size(ranges)];
    uint32_t cp = lo + rng() % (hi - lo + 1);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    append_utf8(s, cp);
  }
  return s;
}

class TokenizerQwen2Vocab : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new gguf::File(gguf::File::open(kQwen2Vocab));
    tok_ = new Tokenizer(Tokenizer::from_gguf(*file_));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
  }
  static gguf::File* file_;
  static Tokenizer* tok_;
};
gguf::File* TokenizerQwen2Vocab::file_ = nullptr;
Tokenizer* TokenizerQwen2Vocab::tok_ = nullptr;

}  // namespace

TEST_F(TokenizerQwen2Vocab, MetadataAsInTheFile) {
  EXPECT_EQ(tok_->n_vocab(), 151936);
  EXPECT_EQ(tok_->pre(), "qwen2");
  EXPECT_EQ(tok_->bos(), 151643);
  EXPECT_EQ(tok_->eos(), 151643);
  EXPECT_FALSE(tok_->add_bos());  // no add_bos_token key, and qwen2's default is no BOS
  EXPECT_EQ(tok_->token_text(151644), "<|im_start|>");
  EXPECT_TRUE(tok_->is_eog(151645));  // <|im_end|>
}

TEST_F(TokenizerQwen2Vocab, EveryFixtureStringGivesLlamaCppIds) {
  const auto inputs = read_inp(kQwen2Vocab + ".inp");
  const auto expected = read_out(kQwen2Vocab + ".out");
  ASSERT_GE(inputs.size(), 40u);
  ASSERT_EQ(inputs.size(), expected.size());
  int exact = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Ids ids = tok_->tokenize(inputs[i], {.add_special = true, .parse_special = false});
    EXPECT_EQ(ids, expected[i]) << "string #" << i << ": '" << inputs[i] << "'";
    exact += ids == expected[i];
    EXPECT_EQ(tok_->detokenize(ids), inputs[i]) << "round trip of string #" << i;
    // Streaming the same ids one by one gives the same text.
    StreamDecoder dec(*tok_);
    std::string streamed;
    for (TokenId id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    EXPECT_EQ(streamed, inputs[i]);
  }
  EXPECT_EQ(exact, int(inputs.size()));
}

TEST_F(TokenizerQwen2Vocab, RoundTripAndReferenceBpeOnRandomUtf8) {
  ReferenceBpe ref(*file_, *tok_);
  std::mt19937 rng(20240611);
  for (int iter = 0; iter < 3000; ++iter) {
    const std::string s = random_utf8(rng, 40);
    const Ids ids = tok_->tokenize(s);
    ASSERT_EQ(tok_->detokenize(ids), s) << "iteration " << iter;
    if (iter % 10 == 0) ASSERT_EQ(ids, ref.encode(s)) << "iteration " << iter << ": '" << s << "'";
  }
}

TEST_F(TokenizerQwen2Vocab, ArbitraryBytesAreKeptByteForByte) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string raw;
    for (int i = rng() % 40; i > 0; --i) raw += char(rng() % 256);
    std::string back;
    for (TokenId id : tok_->tokenize(raw, {.parse_special = true})) back += tok_->token_bytes(id);
    ASSERT_EQ(back, raw);
    ASSERT_EQ(tok_->detokenize(tok_->tokenize(raw)), sanitize_utf8(raw));
  }
}

TEST_F(TokenizerQwen2Vocab, SpecialTokensOnlyWhenAsked) {
  const std::string s = "<|im_start|>user\nHi<|im_end|>";
  const Ids with = tok_->tokenize(s, {.parse_special = true});
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), 151644);
  EXPECT_EQ(with.back(), 151645);
  const Ids without = tok_->tokenize(s, {.parse_special = false});
  for (TokenId id : without) EXPECT_TRUE(id != 151644 && id != 151645);
  EXPECT_GT(without.size(), with.size());
  EXPECT_EQ(tok_->detokenize(without), s);  // the user's text survives as text
  EXPECT_EQ(tok_->detokenize(with), s);
  EXPECT_EQ(tok_->detokenize(with, /*render_special=*/false), "user\nHi");
}

TEST(TokenizerTinyModel, TokenizesWithTheModelsOwnVocab) {
  auto f = gguf::File::open(kTinyModel);
  auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.n_vocab(), 512);
  EXPECT_EQ(tok.pre(), "qwen2");
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.eos(), 511);
  ReferenceBpe ref(f, tok);
  const std::string texts[] = {"Once upon a time, there was a little girl.",
                               "the theory of the thing", "  indented\n\tcode();  ",
                               "\xC3\x84pfel und \xF0\x9F\x98\x80 1234"};
  for (const auto& s : texts) {
    const Ids ids = tok.tokenize(s);
    for (TokenId id : ids) EXPECT_TRUE(id >= 0 && id < 509);
    EXPECT_EQ(ids, ref.encode(s)) << s;
    EXPECT_EQ(tok.detokenize(ids), s);
  }
  // The vocabulary's merges are used: common words take fewer tokens than bytes.
  EXPECT_LT(tok.tokenize("the theory of the thing").size(), std::string("the theory of the thing").size());
  const Ids chat = tok.tokenize("<|im_start|>user\nhi<|im_end|>", {.parse_special = true});
  EXPECT_EQ(chat.front(), 510);
  EXPECT_EQ(chat.back(), 511);
}
