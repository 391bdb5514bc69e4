#pragma once
// Pre-tokenizers of byte-level BPE models, selected by the GGUF key tokenizer.ggml.pre. Each one is
// a list of regexes (PCRE2, JIT-compiled) applied in turn, exactly as llama.cpp applies them: every
// regex re-splits each piece the previous one produced, and the text between matches is kept as a
// piece of its own, so the pieces always cover the input exactly. Each piece is then BPE-encoded
// on its own.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

struct Piece {
  uint32_t offset, length;  // byte range in the text given to split()
};

class PreTokenizer {
 public:
  // Throws strata::Error naming the supported names when `name` is not one of them.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Names accepted by the constructor (aliases included), for messages and tests.
  static std::vector<std::string> supported_names();
  static bool is_supported(std::string_view name);

  const std::string& name() const { return name_; }
  // llama3-style: a piece that is a whole token in the vocabulary is taken as is, without merges.
  bool ignore_merges() const { return ignore_merges_; }
  // BOS default of this family when the GGUF does not say (tokenizer.ggml.add_bos_token).
  bool default_add_bos() const { return default_add_bos_; }

  // Appends the pieces of `text` (any bytes: ill-formed UTF-8 never matches a regex and ends up
  // in the pieces between matches). Thread-safe. Offsets are relative to text.data().
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  struct Regex;
  std::string name_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
  std::vector<std::shared_ptr<const Regex>> regexes_;
};

}  // namespace strata::tokenizer
