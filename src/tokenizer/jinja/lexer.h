#pragma once
// Jinja lexer with the whitespace rules of the reference environment (HF transformers:
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False), mirroring jinja2 3.1's
// lexer.py: `{%-`/`-%}` strip all whitespace on that side, `{%+`/`+%}` disable lstrip/trim,
// trim_blocks removes one newline after a block or comment tag, lstrip_blocks removes spaces and
// tabs between the start of a line and a block or comment tag, newlines are normalised to "\n"
// and one trailing newline of the source is dropped.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // Data text, name, operator, decoded string literal
  int64_t ival = 0;
  double fval = 0;
  int line = 1, col = 1;
};

// Throws TemplateError("line L col C: ...") on malformed input (unterminated tag/comment/string,
// unexpected character, unbalanced brackets, invalid UTF-8).
std::vector<Token> tokenize(std::string_view source);

}  // namespace strata::jinja
