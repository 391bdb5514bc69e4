#pragma once
// Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2") built from a model's GGUF metadata, with
// llama.cpp's semantics so that token ids match it exactly:
//   - text is first split at special tokens (see EncodeOptions::parse_special), then each plain
//     fragment is split by the pre-tokenizer of tokenizer.ggml.pre (pretokenizer.h), byte-level
//     encoded and BPE-merged by merge rank (lowest rank first, leftmost first among equals);
//   - BOS/EOS are added per tokenizer.ggml.add_bos_token / add_eos_token.
// All metadata is untrusted: construction validates sizes, token types, merge strings and special
// ids and throws strata::Error saying which key is wrong. Once built, a Tokenizer is immutable,
// cheap to copy (shared state) and safe to use from many threads.
//
//   auto tok = Tokenizer::from_gguf(gguf::File::open(path));
//   auto ids = tok.tokenize(prompt_text, {.add_special = true, .parse_special = true});
//   StreamDecoder dec(tok);  for (id : generated) std::cout << dec.push(id);  std::cout << dec.flush();
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/utf8_decode.h"

namespace strata::gguf {
class File;
}

namespace strata::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <|im_start|> etc.: matched in text only with parse_special
  kUserDefined = 4,  // added tokens that are not special (e.g. <think>): always matched in text
  kUnused = 5,
  kByte = 6,         // <0xAB>
};

// The tokenizer.ggml.* metadata as plain data. Optional fields are the optional GGUF keys.
struct VocabData {
  std::string model = "gpt2";         // tokenizer.ggml.model; only "gpt2" (byte-level BPE)
  std::string pre;                    // tokenizer.ggml.pre; empty = "default" (with a warning)
  std::vector<std::string> tokens;    // tokenizer.ggml.tokens; id = index
  std::vector<int32_t> token_types;   // tokenizer.ggml.token_type; empty = all normal
  std::vector<std::string> merges;    // tokenizer.ggml.merges: "left right"; rank = index
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, sep_id, pad_id;
  std::optional<bool> add_bos, add_eos;  // default: per pre-tokenizer family (llama3: BOS)
};

struct EncodeOptions {
  bool add_special = true;     // add BOS/EOS where the model asks for them
  bool parse_special = false;  // match control tokens written in the text (chat templates: true;
                               // user text: false, so "<|im_start|>" typed by a user stays text)
};

class Tokenizer {
 public:
  static Tokenizer from_data(VocabData data);      // validates; throws strata::Error
  static Tokenizer from_gguf(const gguf::File& f);  // reads tokenizer.ggml.*, then from_data

  // Token ids of `text` (any bytes; ill-formed UTF-8 is kept byte for byte as byte tokens).
  std::vector<TokenId> tokenize(std::string_view text, EncodeOptions opt = {}) const;
  void tokenize(std::string_view text, EncodeOptions opt, std::vector<TokenId>& out) const;

  // The bytes token `id` stands for (may be part of a UTF-8 character). Control/unknown tokens
  // give their text when render_special, else nothing; unused tokens give nothing.
  // Throws strata::Error when id is out of range.
  std::string_view token_bytes(TokenId id, bool render_special = true) const;

  // Text of a whole sequence: valid UTF-8, ill-formed bytes replaced by U+FFFD.
  std::string detokenize(std::span<const TokenId> ids, bool render_special = true) const;

  int32_t n_vocab() const;
  const std::string& token_text(TokenId id) const;  // as stored in the vocabulary
  TokenType token_type(TokenId id) const;
  TokenId find_token(std::string_view text) const;  // kNoToken when absent
  bool is_control(TokenId id) const;                // control or unknown
  bool is_eog(TokenId id) const;                    // ends generation (EOS, EOT, <|im_end|>, ...)
  const std::vector<TokenId>& eog_ids() const;

  TokenId bos() const;  // kNoToken when the model has none
  TokenId eos() const;
  TokenId eot() const;
  TokenId unk() const;
  TokenId pad() const;
  bool add_bos() const;
  bool add_eos() const;
  const std::string& pre() const;  // pre-tokenizer name in use

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer for streaming generation: push() returns the text that is complete so
// far. A token that ends inside a UTF-8 character emits nothing for that character until the
// token(s) completing it arrive; ill-formed bytes become U+FFFD. Never throws for bytes; throws
// strata::Error for an out-of-range id (nothing is lost: the decoder state is unchanged).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = true)
      : tok_(tok), render_special_(render_special) {}
  std::string push(TokenId id);
  void push(TokenId id, std::string& out);
  // End of stream: a held-back incomplete character is released as U+FFFD. Resets the decoder.
  std::string flush();
  size_t pending_bytes() const { return utf8_.pending(); }
  void reset() { utf8_.reset(); }

 private:
  Tokenizer tok_;
  bool render_special_;
  Utf8Sanitizer utf8_;
};

}  // namespace strata::tokenizer
