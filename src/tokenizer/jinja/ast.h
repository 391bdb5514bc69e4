#pragma once
// Syntax tree of a parsed template. One node type for expressions and one for statements; which
// fields a node uses depends on its kind (listed next to each kind).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace strata::jinja {

struct Expr;
struct Stmt;
using ExprP = std::unique_ptr<Expr>;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Expr {
  enum class K {
    Const,    // value
    Name,     // name
    List,     // a: items
    Tuple,    // a: items
    Dict,     // a: key0, value0, key1, value1, ...
    Getattr,  // a[0].name
    Getitem,  // a[0][a[1]]
    Slice,    // a[0][a[1]:a[2]:a[3]] (null = omitted)
    Call,     // a[0](a[1..], kw)
    Filter,   // a[0] | name(a[1..], kw); a[0] is null inside {% filter %} blocks
    Test,     // a[0] is name(a[1..], kw)
    Not,      // not a[0]
    Neg,      // -a[0]
    Pos,      // +a[0]
    Bin,      // a[0] <name> a[1]; name in + - * / // % ** ~ and or in notin
    Compare,  // a[0] ops[0] a[1] ops[1] a[2] ... (chained like Python)
    Cond,     // a[0] if a[1] else a[2] (a[2] null: undefined)
  };
  K k;
  int line = 0, col = 0;
  Value value;
  std::string name;
  std::vector<ExprP> a;
  std::vector<std::pair<std::string, ExprP>> kw;
  std::vector<std::string> ops;
};

struct Stmt {
  enum class K {
    Text,       // text
    Print,      // {{ e[0] }}
    If,         // e: conditions; bodies: one per condition, then optional else body
    For,        // e[0] target, e[1] iterable, e[2] filter (null); bodies[0] body, bodies[1] else
    Set,        // e[0] target (Name / Tuple of names / Getattr on a namespace) = e[1]
    SetBlock,   // e[0] target (Name), e[1] filter chain (null); bodies[0] captured body
    Macro,      // name, params/defaults, bodies[0]
    CallBlock,  // e[0] call expression; params/defaults of `caller`; bodies[0] caller body
    FilterBlock,  // e[0] filter chain (operand null); bodies[0]
    With,       // params = e (values in e), bodies[0]
    Break,
    Continue,
    Scope,      // bodies[0] rendered as is ({% generation %} of HF's AssistantTracker)
  };
  K k;
  int line = 0, col = 0;
  std::string text;  // Text; Macro name
  std::vector<ExprP> e;
  std::vector<Body> bodies;
  std::vector<std::string> params;  // Macro/CallBlock parameters, With names
  std::vector<ExprP> defaults;      // per param (null = no default)
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;  // Macro
};

}  // namespace strata::jinja
