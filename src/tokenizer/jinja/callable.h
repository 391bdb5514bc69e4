#pragma once
// Callables of the sandbox: builtin functions/filters bound to a name, template macros (with the
// scope they were defined in), and methods bound to a value ('abc'.upper).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace strata::jinja {

class Interpreter;
struct Stmt;
struct Scope;

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* find_kw(std::string_view name) const {
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

struct Callable {
  enum class Type { Builtin, Macro, Method };
  Type type = Type::Builtin;
  std::string name;
  std::function<Value(Interpreter&, Args&)> builtin;  // Builtin
  const Stmt* macro = nullptr;                        // Macro: definition (params, body)
  std::weak_ptr<Scope> closure;                       // Macro: the scope it was defined in
  Value self;                                         // Method: the bound object
};

}  // namespace strata::jinja
