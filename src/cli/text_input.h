#pragma once
// Reading a text file and tokenizing it with a model's own tokenizer (perplexity, profile).
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_REQUIRE(f, "cannot open {}: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  STRATA_REQUIRE(!f.bad(), "reading {} failed", path);
  return ss.str();
}

// The file's token ids as the model's tokenizer gives them (BOS only where the model asks for it;
// control-token text such as "<|im_end|>" in the file stays text).
inline std::vector<int32_t> tokenize_file(const Model& model, const std::string& path) {
  const auto tok = tokenizer::Tokenizer::from_gguf(model.file());
  const std::string text = read_text_file(path);
  STRATA_REQUIRE(!text.empty(), "{} is empty", path);
  return tok.tokenize(text);
}

}  // namespace strata::cli
