#pragma once
// The tree-walking evaluator behind Template::render (internal to src/tokenizer/jinja).
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/callable.h"
#include "tokenizer/jinja/jinja.h"

namespace strata::jinja {

// One variable frame: template root, a loop iteration, a macro call, a with/set block.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
};

class Interpreter {
 public:
  Interpreter(const Dict& context, const RenderOptions& opt);
  ~Interpreter();
  // root_undefined: template-level names that start undefined instead of coming from the context.
  std::string run(const Body& body, const std::vector<std::string>& root_undefined);

  // Used by the builtins (builtins.cpp).
  Value call(const Value& callee, Args& args);
  Value filter(const std::string& name, const Value& v, Args& args);
  bool test(const std::string& name, const Value& v, Args& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  std::vector<Value> iterate(const Value& v);
  bool contains(const Value& container, const Value& item);  // Python `item in container`  // Python iter(): list items, dict keys, str chars
  void check_string(uint64_t bytes) const;
  void check_items(uint64_t n) const;
  void step();
  void charge_bytes(uint64_t bytes);  // work of building a value of that size
  void charge_items(uint64_t n);
  Value new_namespace();
  const RenderOptions& options() const { return opt_; }

 private:
  enum class Flow { Normal, Break, Continue };
  using ScopeP = std::shared_ptr<Scope>;

  const Dict& ctx_;
  const RenderOptions& opt_;
  Dict globals_;
  std::vector<std::shared_ptr<Dict>> namespaces_;  // cleared at the end: breaks reference cycles
  uint64_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  int line_ = 0, col_ = 0;  // position of the innermost node being evaluated

  struct Frame;  // RAII: depth + position tracking

  Flow exec_body(const Body& body, const ScopeP& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopeP& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopeP& scope, std::string& out);
  void assign(const Expr& target, const Value& v, const ScopeP& scope);
  void write(std::string& out, std::string_view s) const;

  Value eval(const Expr& e, const ScopeP& scope);
  Value eval_call(const Expr& e, const ScopeP& scope, const Value* caller);
  Value eval_filter(const Expr& e, const Value& operand, const ScopeP& scope);
  Args eval_args(const Expr& e, size_t first, const ScopeP& scope);
  Value lookup(const std::string& name, const ScopeP& scope) const;
  Value binop(const std::string& op, const Value& a, const Value& b);
  bool compare_op(const std::string& op, const Value& a, const Value& b);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  Value call_macro(const Callable& c, Args& args);
};

[[noreturn]] void undefined_error(const Value& v);  // raises the error an Undefined stands for

// ---- builtins.cpp ----
using FilterFn = Value (*)(Interpreter&, const Value&, Args&);
using TestFn = bool (*)(Interpreter&, const Value&, Args&);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// Methods of str / dict / list / loop values: 'safe' ones are callable, 'unsafe' ones (mutating
// list/dict methods) exist but refuse to run in the immutable sandbox.
enum class MethodKind { None, Safe, Unsafe };
MethodKind method_kind(const Value& self, const std::string& name);
Value call_method(Interpreter& in, const Value& self, const std::string& name, Args& args);
void install_globals(Dict& globals);
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);  // fmt % args

}  // namespace strata::jinja
