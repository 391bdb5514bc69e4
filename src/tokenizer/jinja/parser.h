#pragma once
// Recursive-descent parser for the Jinja statements and expressions chat templates use, with
// jinja2 3.1's grammar and operator precedence (parser.py). Nesting is bounded so hostile input
// cannot exhaust the stack.
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace strata::jinja {

// Throws TemplateError("template line L col C: ...") on a syntax error.
Body parse_template(std::string_view source);

}  // namespace strata::jinja
