// `strata detokenize`: prints the text of token ids under a model's tokenizer.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/command.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct DetokenizeArgs {
  std::string model;
  std::vector<std::string> ids;
  bool no_special = false, no_newline = false;
};

// Ids separated by spaces, commas or newlines; "[1, 2, 3]" (a JSON array) works too.
void parse_ids(const std::string& s, std::vector<tokenizer::TokenId>& out) {
  static constexpr std::string_view kSeparators = " ,\n\r\t[]";
  size_t i = 0;
  while (i < s.size()) {
    if (kSeparators.find(s[i]) != std::string_view::npos) {
      ++i;
      continue;
    }
    size_t j = s.find_first_of(kSeparators, i);
    if (j == std::string::npos) j = s.size();
    const std::string_view word(s.data() + i, j - i);
    long long v = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    STRATA_REQUIRE(ec == std::errc() && end == word.data() + word.size(),
                   "not a token id: '{}'", tokenizer::sanitize_utf8(word.substr(0, 32)));
    STRATA_REQUIRE(v >= INT32_MIN && v <= INT32_MAX, "token id {} is out of range", word);
    out.push_back(static_cast<tokenizer::TokenId>(v));
    i = j;
  }
}

int run_detokenize(const DetokenizeArgs& a) {
  std::vector<tokenizer::TokenId> ids;
  if (a.ids.empty()) {
    std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    parse_ids(in, ids);
  } else {
    for (const auto& s : a.ids) parse_ids(s, ids);
  }
  auto tok = tokenizer::Tokenizer::from_gguf(gguf::File::open(a.model));
  const std::string text = tok.detokenize(ids, !a.no_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!a.no_newline) std::fputc('\n', stdout);
  return 0;
}

const CommandRegistrar reg(
    "detokenize", "Print the text of token ids (arguments or stdin)", [](CLI::App& sub) {
      auto a = std::make_shared<DetokenizeArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file")->required()->check(CLI::ExistingFile);
      sub.add_flag("--no-special", a->no_special, "omit control tokens (e.g. <|im_end|>)");
      sub.add_flag("-n,--no-newline", a->no_newline, "do not end the output with a newline");
      sub.add_option("ids", a->ids, "token ids (default: read from stdin)");
      return [a] { return run_detokenize(*a); };
    });

}  // namespace
}  // namespace strata::cli
