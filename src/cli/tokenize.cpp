// `strata tokenize`: prints the token ids of a text under a model's tokenizer.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/command.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

std::string read_all(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TokenizeArgs {
  std::string model, text, file;
  bool no_bos = false, special = false, pieces = false;
};

int run_tokenize(const TokenizeArgs& a) {
  std::string text;
  if (!a.file.empty()) {
    std::ifstream in(a.file, std::ios::binary);
    STRATA_REQUIRE(in, "cannot open {}", a.file);
    text = read_all(in);
  } else if (!a.text.empty()) {
    text = a.text;
  } else {
    text = read_all(std::cin);
  }
  auto tok = tokenizer::Tokenizer::from_gguf(gguf::File::open(a.model));
  const auto ids = tok.tokenize(text, {.add_special = !a.no_bos, .parse_special = a.special});
  if (a.pieces) {
    for (auto id : ids) {
      std::string piece(tok.token_bytes(id));
      std::printf("%d\t%s\n", id, tokenizer::sanitize_utf8(piece).c_str());
    }
    return 0;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

const CommandRegistrar reg(
    "tokenize", "Print the token ids of a text (TEXT, -f FILE, or stdin)", [](CLI::App& sub) {
      auto a = std::make_shared<TokenizeArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file")->required()->check(CLI::ExistingFile);
      sub.add_flag("--no-bos", a->no_bos, "do not add BOS/EOS even where the model asks for them");
      sub.add_flag("--special", a->special,
                   "match control tokens written in the text (e.g. <|im_start|>); without it they "
                   "are plain text");
      sub.add_flag("--pieces", a->pieces, "print one token per line: id, tab, its text");
      sub.add_option("-f,--file", a->file, "read the text from FILE (bytes as is)");
      sub.add_option("text", a->text, "the text (default: stdin)");
      return [a] { return run_tokenize(*a); };
    });

}  // namespace
}  // namespace strata::cli
