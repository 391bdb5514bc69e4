// libFuzzer target: the tokenizer on arbitrary bytes and the streaming decoder on arbitrary ids.
// Uses the real Qwen2 vocabulary (loaded once) from $STRATA_FIXTURES_DIR/vocab or
// ../shared/fixtures/vocab (scripts/fuzz runs from the repository root); without it, a small
// built-in byte-level vocabulary with merges and special tokens.
//
// Input: byte 0 selects the mode, the rest is the payload.
//   even: tokenize the payload (bit 1: parse_special); the tokens' bytes must concatenate back
//         to the payload exactly, and the detokenized text must be valid UTF-8 (equal to the
//         payload when the payload is valid UTF-8).
//   odd:  the payload as little-endian u16 (bit 1: u32) ids (some out of range) into a StreamDecoder;
//         every chunk must be valid UTF-8 and the whole must equal detokenize() of the valid ids.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8_decode.h"

using namespace strata;
using namespace strata::tokenizer;

namespace {

#define FUZZ_CHECK(cond)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      std::fprintf(stderr, "fuzz_tokenizer: check failed: %s\n", #cond); \
      std::abort();                                               \
    }                                                             \
  } while (0)

Tokenizer builtin_vocab() {
  VocabData d;
  d.pre = "qwen2";
  for (int b = 0; b < 256; ++b) d.tokens.emplace_back(byte_to_unicode(uint8_t(b)));
  d.token_types.assign(256, 1);
  const char* extra[] = {"he", "ll", "hell", "hello", "\xC4\xA0hello", "<|im_start|>", "<think>"};
  const int types[] = {1, 1, 1, 1, 1, 3, 4};
  for (int i = 0; i < 7; ++i) {
    d.tokens.push_back(extra[i]);
    d.token_types.push_back(types[i]);
  }
  d.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 hello"};
  return Tokenizer::from_data(d);
}

const Tokenizer& vocab() {
  static const Tokenizer tok = [] {
    const char* env = std::getenv("STRATA_FIXTURES_DIR");
    const std::string dir = env ? env : "../shared/fixtures";
    const std::string path = dir + "/vocab/ggml-vocab-qwen2.gguf";
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      std::fclose(f);
      return Tokenizer::from_gguf(gguf::File::open(path));
    }
    std::fprintf(stderr, "fuzz_tokenizer: %s not found; using a built-in vocabulary\n",
                 path.c_str());
    return builtin_vocab();
  }();
  return tok;
}

void fuzz_tokenize(const Tokenizer& tok, std::string_view text, bool parse_special) {
  const auto ids = tok.tokenize(text, {.add_special = false, .parse_special = parse_special});
  std::string back;
  for (TokenId id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
    back += tok.token_bytes(id);
  }
  FUZZ_CHECK(back == text);
  const std::string s = tok.detokenize(ids);
  FUZZ_CHECK(is_valid_utf8(s));
  if (is_valid_utf8(text)) FUZZ_CHECK(s == text);
}

void fuzz_stream(const Tokenizer& tok, bool wide, const uint8_t* p, size_t n) {
  StreamDecoder dec(tok);
  std::vector<TokenId> valid;
  std::string streamed;
  const size_t w = wide ? 4 : 2;
  for (size_t i = 0; i + w <= n; i += w) {
    uint32_t v = 0;
    std::memcpy(&v, p + i, w);
    // Mostly in range; a few past the end or negative.
    const TokenId id = static_cast<TokenId>(int64_t(v % (uint32_t(tok.n_vocab()) + 64)) - 32);
    try {
      const std::string chunk = dec.push(id);
      FUZZ_CHECK(is_valid_utf8(chunk));
      streamed += chunk;
      valid.push_back(id);
    } catch (const Error&) {
      FUZZ_CHECK(id < 0 || id >= tok.n_vocab());
    }
  }
  streamed += dec.flush();
  FUZZ_CHECK(streamed == tok.detokenize(valid));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = vocab();
  const uint8_t mode = data[0];
  if ((mode & 1) == 0) {
    fuzz_tokenize(tok, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
                  (mode & 2) != 0);
  } else {
    fuzz_stream(tok, (mode & 2) != 0, data + 1, size - 1);
  }
  return 0;
}
