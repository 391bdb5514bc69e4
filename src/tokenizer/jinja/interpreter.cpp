// Tree-walking evaluator: statements, expressions, scoping, macros, sandbox limits.
#include "tokenizer/jinja/interpreter.h"

#include <cmath>
#include <exception>
#include <set>

#include "common/checked_math.h"
#include "tokenizer/jinja/parser.h"

namespace strata::jinja {

[[noreturn]] void undefined_error(const Value& v) {
  throw TemplateError(v.s.empty() ? std::string("undefined value used") : v.s);
}

// Tracks nesting depth and the innermost node's position (restored only on normal exit, so an
// error reports where it happened).
struct Interpreter::Frame {
  Interpreter& in;
  int line, col, uncaught;
  Frame(Interpreter& interp, int l, int c) : in(interp), line(interp.line_), col(interp.col_),
                                             uncaught(std::uncaught_exceptions()) {
    if (++in.depth_ > in.opt_.limits.max_depth)
      throw TemplateError("sandbox: nesting deeper than " + std::to_string(in.opt_.limits.max_depth));
    if (l > 0) in.line_ = l, in.col_ = c;
  }
  ~Frame() {
    --in.depth_;
    if (std::uncaught_exceptions() == uncaught) in.line_ = line, in.col_ = col;
  }
};

Interpreter::Interpreter(const Dict& context, const RenderOptions& opt) : ctx_(context), opt_(opt) {
  install_globals(globals_);
}

Interpreter::~Interpreter() {
  for (auto& ns : namespaces_) ns->clear();
}

std::string Interpreter::run(const Body& body, const std::vector<std::string>& root_undefined) {
  std::string out;
  auto root = std::make_shared<Scope>();
  for (auto& n : root_undefined) root->vars[n] = Value::undefined("'" + n + "' is undefined");
  try {
    exec_body(body, root, out);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (line_ > 0 && msg.rfind("template line ", 0) != 0)
      msg = "template line " + std::to_string(line_) + " col " + std::to_string(col_) + ": " + msg;
    throw TemplateError(msg);
  }
  return out;
}

// ---- limits ----
void Interpreter::step() {
  if (++steps_ > opt_.limits.max_steps)
    throw TemplateError("sandbox: template exceeded " + std::to_string(opt_.limits.max_steps) + " steps");
}
// Copying big values costs work too (s = s ~ x in a loop is quadratic): 1 step per 256 bytes or
// 16 list items built.
void Interpreter::charge_bytes(uint64_t bytes) {
  steps_ += bytes / 256;
  step();
}
void Interpreter::charge_items(uint64_t n) {
  steps_ += n / 16;
  step();
}

void Interpreter::check_string(uint64_t bytes) const {
  if (bytes > opt_.limits.max_string)
    throw TemplateError("sandbox: string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                        std::to_string(opt_.limits.max_string));
}
void Interpreter::check_items(uint64_t n) const {
  if (n > opt_.limits.max_items)
    throw TemplateError("sandbox: sequence of " + std::to_string(n) + " items exceeds the limit of " +
                        std::to_string(opt_.limits.max_items));
}
void Interpreter::write(std::string& out, std::string_view s) const {
  if (out.size() + s.size() > opt_.limits.max_output)
    throw TemplateError("sandbox: output exceeds the limit of " + std::to_string(opt_.limits.max_output) + " bytes");
  out += s;
}
Value Interpreter::new_namespace() {
  Value v;
  v.kind = Kind::Namespace;
  v.dict = std::make_shared<Dict>();
  namespaces_.push_back(v.dict);
  return v;
}

// ---- statements ----
Interpreter::Flow Interpreter::exec_body(const Body& body, const ScopeP& scope, std::string& out) {
  for (auto& s : body) {
    Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const ScopeP& scope, std::string& out) {
  Frame fr(*this, s.line, s.col);
  step();
  switch (s.k) {
    case Stmt::K::Text: write(out, s.text); return Flow::Normal;
    case Stmt::K::Print: {
      Value v = eval(*s.e[0], scope);
      if (v.kind == Kind::String)
        write(out, v.s);
      else
        write(out, to_str(v));
      return Flow::Normal;
    }
    case Stmt::K::If:
      for (size_t k = 0; k < s.e.size(); ++k)
        if (truthy(eval(*s.e[k], scope))) return exec_body(s.bodies[k], scope, out);
      if (s.bodies.size() > s.e.size()) return exec_body(s.bodies.back(), scope, out);
      return Flow::Normal;
    case Stmt::K::For: return exec_for(s, scope, out);
    case Stmt::K::Set: assign(*s.e[0], eval(*s.e[1], scope), scope); return Flow::Normal;
    case Stmt::K::SetBlock: {
      std::string buf;
      exec_body(s.bodies[0], std::make_shared<Scope>(scope), buf);
      Value v = Value::string(std::move(buf));
      if (s.e[1]) v = eval_filter(*s.e[1], v, scope);
      assign(*s.e[0], v, scope);
      return Flow::Normal;
    }
    case Stmt::K::Macro: {
      auto c = std::make_shared<Callable>();
      c->type = Callable::Type::Macro;
      c->name = s.text;
      c->macro = &s;
      c->closure = scope;
      scope->vars[s.text] = Value::callable(c);
      return Flow::Normal;
    }
    case Stmt::K::CallBlock: {
      auto c = std::make_shared<Callable>();
      c->type = Callable::Type::Macro;
      c->name = "caller";
      c->macro = &s;
      c->closure = scope;
      Value caller = Value::callable(c);
      Value v = eval_call(*s.e[0], scope, &caller);
      write(out, to_str(v));
      return Flow::Normal;
    }
    case Stmt::K::FilterBlock: {
      std::string buf;
      exec_body(s.bodies[0], std::make_shared<Scope>(scope), buf);
      write(out, to_str(eval_filter(*s.e[0], Value::string(std::move(buf)), scope)));
      return Flow::Normal;
    }
    case Stmt::K::With: {
      auto inner = std::make_shared<Scope>(scope);
      for (size_t k = 0; k < s.params.size(); ++k) inner->vars[s.params[k]] = eval(*s.e[k], scope);
      return exec_body(s.bodies[0], inner, out);
    }
    case Stmt::K::Break: return Flow::Break;
    case Stmt::K::Continue: return Flow::Continue;
    case Stmt::K::Scope: return exec_body(s.bodies[0], std::make_shared<Scope>(scope), out);  // a caller body
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopeP& scope, std::string& out) {
  std::vector<Value> items = iterate(eval(*s.e[1], scope));
  charge_items(items.size());
  if (s.e[2]) {  // `for x in xs if cond`: filter first; loop.* counts the kept items
    std::vector<Value> kept;
    for (auto& it : items) {
      step();
      auto tmp = std::make_shared<Scope>(scope);
      assign(*s.e[0], it, tmp);
      if (truthy(eval(*s.e[2], tmp))) kept.push_back(it);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (s.bodies.size() > 1) return exec_body(s.bodies[1], std::make_shared<Scope>(scope), out);
    return Flow::Normal;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    step();
    auto iter = std::make_shared<Scope>(scope);
    assign(*s.e[0], items[k], iter);
    auto d = std::make_shared<Dict>();
    d->set("index0", Value::integer(k));
    d->set("index", Value::integer(k + 1));
    d->set("revindex0", Value::integer(n - k - 1));
    d->set("revindex", Value::integer(n - k));
    d->set("first", Value::boolean(k == 0));
    d->set("last", Value::boolean(k == n - 1));
    d->set("length", Value::integer(n));
    d->set("depth", Value::integer(1));
    d->set("depth0", Value::integer(0));
    d->set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
    d->set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
    Value loop;
    loop.kind = Kind::Loop;
    loop.dict = d;
    iter->vars["loop"] = loop;
    Flow f = exec_body(s.bodies[0], iter, out);
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Expr& target, const Value& v, const ScopeP& scope) {
  switch (target.k) {
    case Expr::K::Name: scope->vars[target.name] = v; return;
    case Expr::K::Tuple: {
      std::vector<Value> parts = iterate(v);
      if (parts.size() != target.a.size())
        throw TemplateError(parts.size() > target.a.size()
                                ? "too many values to unpack (expected " + std::to_string(target.a.size()) + ")"
                                : "not enough values to unpack (expected " + std::to_string(target.a.size()) +
                                      ", got " + std::to_string(parts.size()) + ")");
      for (size_t k = 0; k < parts.size(); ++k) assign(*target.a[k], parts[k], scope);
      return;
    }
    case Expr::K::Getattr: {
      Value ns = lookup(target.a[0]->name, scope);
      if (ns.kind != Kind::Namespace) throw TemplateError("cannot assign attribute on non-namespace object");
      ns.dict->set(target.name, v);
      return;
    }
    default: throw TemplateError("can't assign to this expression");
  }
}

// ---- expressions ----
Value Interpreter::lookup(const std::string& name, const ScopeP& scope) const {
  for (const Scope* s = scope.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* v = ctx_.find(name)) return *v;
  if (const Value* v = globals_.find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::eval(const Expr& e, const ScopeP& scope) {
  Frame fr(*this, e.line, e.col);
  switch (e.k) {
    case Expr::K::Const: return e.value;
    case Expr::K::Name: return lookup(e.name, scope);
    case Expr::K::List:
    case Expr::K::Tuple: {
      List items;
      items.reserve(e.a.size());
      for (auto& x : e.a) items.push_back(eval(*x, scope));
      return Value::make_list(std::move(items), e.k == Expr::K::Tuple);
    }
    case Expr::K::Dict: {
      auto d = std::make_shared<Dict>();
      for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
        Value key = eval(*e.a[k], scope);
        if (!key.is_string()) throw TemplateError("dict keys must be strings in the template sandbox");
        d->set(key.s, eval(*e.a[k + 1], scope));
      }
      return Value::make_dict(d);
    }
    case Expr::K::Getattr: return getattr(eval(*e.a[0], scope), e.name);
    case Expr::K::Getitem: {
      Value obj = eval(*e.a[0], scope);
      return getitem(obj, eval(*e.a[1], scope));
    }
    case Expr::K::Slice: {
      Value obj = eval(*e.a[0], scope);
      auto part = [&](size_t k) { return e.a[k] ? eval(*e.a[k], scope) : Value::none(); };
      Value a = part(1), b = part(2), c = part(3);
      return slice(obj, a, b, c);
    }
    case Expr::K::Call: return eval_call(e, scope, nullptr);
    case Expr::K::Filter: return eval_filter(e, e.a[0] ? eval(*e.a[0], scope) : Value::undefined(), scope);
    case Expr::K::Test: {
      Value v = eval(*e.a[0], scope);
      Args args = eval_args(e, 1, scope);
      return Value::boolean(test(e.name, v, args));
    }
    case Expr::K::Not: return Value::boolean(!truthy(eval(*e.a[0], scope)));
    case Expr::K::Neg:
    case Expr::K::Pos: {
      Value v = eval(*e.a[0], scope);
      if (v.is_undefined()) undefined_error(v);
      if (v.kind == Kind::Float) return Value::floating(e.k == Expr::K::Neg ? -v.f : v.f);
      if (v.kind == Kind::Int || v.kind == Kind::Bool) {
        if (e.k == Expr::K::Pos) return Value::integer(v.i);
        if (v.i == INT64_MIN) throw TemplateError("integer overflow");
        return Value::integer(-v.i);
      }
      throw TemplateError(std::string("bad operand type for unary ") + (e.k == Expr::K::Neg ? "-" : "+") + ": '" +
                          type_name(v) + "'");
    }
    case Expr::K::Bin: {
      if (e.name == "and") {
        Value l = eval(*e.a[0], scope);
        return truthy(l) ? eval(*e.a[1], scope) : l;
      }
      if (e.name == "or") {
        Value l = eval(*e.a[0], scope);
        return truthy(l) ? l : eval(*e.a[1], scope);
      }
      Value l = eval(*e.a[0], scope);
      Value r = eval(*e.a[1], scope);
      return binop(e.name, l, r);
    }
    case Expr::K::Compare: {
      Value l = eval(*e.a[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value r = eval(*e.a[k + 1], scope);
        if (!compare_op(e.ops[k], l, r)) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case Expr::K::Cond:
      if (truthy(eval(*e.a[1], scope))) return eval(*e.a[0], scope);
      if (e.a[2]) return eval(*e.a[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value::undefined();
}

Args Interpreter::eval_args(const Expr& e, size_t first, const ScopeP& scope) {
  Args args;
  for (size_t k = first; k < e.a.size(); ++k) args.pos.push_back(eval(*e.a[k], scope));
  for (auto& [name, x] : e.kw) args.kw.emplace_back(name, eval(*x, scope));
  return args;
}

Value Interpreter::eval_call(const Expr& e, const ScopeP& scope, const Value* caller) {
  Value f = eval(*e.a[0], scope);
  Args args = eval_args(e, 1, scope);
  if (caller) args.kw.emplace_back("caller", *caller);
  return call(f, args);
}

// True when the filter chain bottoms out in null (a block filter).
static bool is_block_chain(const Expr& e) {
  const Expr* x = &e;
  while (x && x->k == Expr::K::Filter) {
    if (!x->a[0]) return true;
    x = x->a[0].get();
  }
  return false;
}

Value Interpreter::eval_filter(const Expr& e, const Value& operand, const ScopeP& scope) {
  // `operand` is the value of e.a[0]. In {% filter %} / {% set %} blocks the chain starts from null
  // and `operand` is the block's text: apply the inner filters of the chain first.
  Value v = operand;
  if (e.a[0] && e.a[0]->k == Expr::K::Filter && is_block_chain(*e.a[0])) v = eval_filter(*e.a[0], operand, scope);
  Args args = eval_args(e, 1, scope);
  return filter(e.name, v, args);
}

Value Interpreter::call(const Value& f, Args& args) {
  step();
  if (f.is_undefined()) undefined_error(f);
  if (f.kind != Kind::Callable) throw TemplateError("'" + type_name(f) + "' object is not callable");
  const Callable& c = *f.fn;
  switch (c.type) {
    case Callable::Type::Builtin: return c.builtin(*this, args);
    case Callable::Type::Method: return call_method(*this, c.self, c.name, args);
    case Callable::Type::Macro: return call_macro(c, args);
  }
  return Value::undefined();
}

Value Interpreter::call_macro(const Callable& c, Args& args) {
  const Stmt& m = *c.macro;
  auto closure = c.closure.lock();
  if (!closure) throw TemplateError("macro '" + c.name + "' called after its defining scope ended");
  if (macro_depth_ >= opt_.limits.max_macro_depth)
    throw TemplateError("sandbox: macro calls nested deeper than " + std::to_string(opt_.limits.max_macro_depth) +
                        " (infinite recursion?)");
  ++macro_depth_;
  struct Dec {
    int& d;
    ~Dec() { --d; }
  } dec{macro_depth_};
  auto sc = std::make_shared<Scope>(closure);
  const size_t np = m.params.size();
  if (args.pos.size() > np && !m.uses_varargs)
    throw TemplateError("macro '" + c.name + "' takes not more than " + std::to_string(np) + " argument(s)");
  std::vector<bool> used_kw(args.kw.size(), false);
  for (size_t k = 0; k < np; ++k) {
    const std::string& p = m.params[k];
    int kw_index = -1;
    for (size_t j = 0; j < args.kw.size(); ++j)
      if (args.kw[j].first == p) kw_index = static_cast<int>(j);
    if (k < args.pos.size()) {
      if (kw_index >= 0)
        throw TemplateError("macro '" + c.name + "' got multiple values for argument '" + p + "'");
      sc->vars[p] = args.pos[k];
    } else if (kw_index >= 0) {
      sc->vars[p] = args.kw[kw_index].second;
      used_kw[kw_index] = true;
    } else if (m.defaults[k]) {
      sc->vars[p] = eval(*m.defaults[k], sc);
    } else {
      sc->vars[p] = Value::undefined("parameter '" + p + "' was not provided");
    }
  }
  Dict extra;
  for (size_t j = 0; j < args.kw.size(); ++j) {
    if (used_kw[j]) continue;
    if (args.kw[j].first == "caller" && c.name != "caller") {
      if (!m.uses_caller)
        throw TemplateError("macro '" + c.name + "' was invoked with two values for the special caller argument");
      sc->vars["caller"] = args.kw[j].second;
      continue;
    }
    if (!m.uses_kwargs)
      throw TemplateError("macro '" + c.name + "' takes no keyword argument '" + args.kw[j].first + "'");
    extra.set(args.kw[j].first, args.kw[j].second);
  }
  if (m.uses_kwargs) sc->vars["kwargs"] = Value::make_dict(std::move(extra));
  if (m.uses_varargs) {
    List rest;
    for (size_t k = np; k < args.pos.size(); ++k) rest.push_back(args.pos[k]);
    sc->vars["varargs"] = Value::make_list(std::move(rest), true);
  }
  std::string buf;
  exec_body(m.bodies[0], sc, buf);
  return Value::string(std::move(buf));
}

Value Interpreter::filter(const std::string& name, const Value& v, Args& args) {
  FilterFn f = find_filter(name);
  if (!f) throw TemplateError("No filter named '" + name + "'.");
  return f(*this, v, args);
}

bool Interpreter::test(const std::string& name, const Value& v, Args& args) {
  TestFn t = find_test(name);
  if (!t) throw TemplateError("No test named '" + name + "'.");
  return t(*this, v, args);
}

// ---- attribute and item access (SandboxedEnvironment.getattr / getitem) ----
static Value bound_method(const Value& self, const std::string& name) {
  auto c = std::make_shared<Callable>();
  c->type = Callable::Type::Method;
  c->name = name;
  c->self = self;
  return Value::callable(c);
}

static std::string object_desc(const Value& v) {
  if (v.kind == Kind::Namespace) return "'Namespace object'";
  return "'" + type_name(v) + " object'";
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!name.empty() && name[0] == '_') {
    // A JSON key like "_meta" is data (Python: no such dict attribute -> the key); anything else
    // starting with '_' names interpreter internals and is refused outright.
    bool dunder = name.size() > 1 && name[1] == '_';
    if (obj.kind == Kind::Dict && !dunder)
      if (const Value* v = obj.dict->find(name)) return *v;
    throw TemplateError("sandbox: access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe");
  }
  switch (method_kind(obj, name)) {
    case MethodKind::Safe: return bound_method(obj, name);
    case MethodKind::Unsafe:
      return Value::undefined("sandbox: access to attribute '" + name + "' of '" + type_name(obj) +
                              "' object is unsafe (the sandbox is immutable)");
    case MethodKind::None: break;
  }
  if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace || obj.kind == Kind::Loop) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined(object_desc(obj) + " has no attribute '" + name + "'");
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.kind == Kind::Dict && key.is_string()) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
  } else if ((obj.kind == Kind::List || obj.kind == Kind::String) &&
             (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    if (obj.kind == Kind::List) {
      const auto& xs = obj.items();
      int64_t n = static_cast<int64_t>(xs.size()), k = key.i < 0 ? key.i + n : key.i;
      if (k >= 0 && k < n) return xs[k];
      return Value::undefined(object_desc(obj) + " has no element " + std::to_string(key.i));
    }
    auto cps = utf8_decode(obj.s);
    int64_t n = static_cast<int64_t>(cps.size()), k = key.i < 0 ? key.i + n : key.i;
    if (k >= 0 && k < n) return Value::string(utf8_encode(cps, k, k + 1));
    return Value::undefined(object_desc(obj) + " has no element " + std::to_string(key.i));
  }
  if (key.is_string()) return getattr(obj, key.s);  // jinja falls back to the attribute
  return Value::undefined(object_desc(obj) + " has no element " + repr(key));
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return v.items();
    case Kind::Dict: {
      std::vector<Value> keys;
      for (auto& [k, x] : v.dict->items()) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (uint32_t c : utf8_decode(v.s)) {
        std::string s;
        utf8_append(s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    default: throw TemplateError("'" + type_name(v) + "' object is not iterable");
  }
}

static int64_t slice_index(const Value& v) {
  if (v.kind == Kind::Int || v.kind == Kind::Bool) return v.i;
  throw TemplateError("slice indices must be integers or None");
}

Value Interpreter::slice(const Value& obj, const Value& start, const Value& stop, const Value& stepv) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.kind != Kind::List && obj.kind != Kind::String) return Value::undefined(object_desc(obj) + " is not sliceable");
  int64_t step = stepv.is_none() ? 1 : slice_index(stepv);
  if (step == 0) throw TemplateError("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.kind == Kind::String) {
    cps = utf8_decode(obj.s);
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(obj.items().size());
  }
  // PySlice_AdjustIndices
  auto adjust = [&](const Value& v, bool is_start) -> int64_t {
    if (v.is_none()) return step > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
    int64_t x = slice_index(v);
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t a = adjust(start, true), b = adjust(stop, false);
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t k = a; k < b; k += step) idx.push_back(k);
  else
    for (int64_t k = a; k > b; k += step) idx.push_back(k);
  if (obj.kind == Kind::String) {
    std::string out;
    for (int64_t k : idx) utf8_append(out, cps[k]);
    return Value::string(std::move(out));
  }
  List out;
  for (int64_t k : idx) out.push_back(obj.items()[k]);
  return Value::make_list(std::move(out), obj.tuple);
}

// ---- operators ----
static std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

static double as_double(const Value& v) { return v.kind == Kind::Float ? v.f : static_cast<double>(v.i); }

static int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value Interpreter::binop(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {  // str(a) + str(b); the size is checked before anything is built
    if (a.is_string() && b.is_string()) {
      check_string(static_cast<uint64_t>(a.s.size()) + b.s.size());
      charge_bytes(a.s.size() + b.s.size());
      std::string r;
      r.reserve(a.s.size() + b.s.size());
      r += a.s;
      r += b.s;
      return Value::string(std::move(r));
    }
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_string(static_cast<uint64_t>(s.size()) + t.size());
    charge_bytes(s.size() + t.size());
    return Value::string(s + t);
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(*this, a.s, b));  // printf-style
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto unsupported = [&]() -> Value {
    throw TemplateError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && a.kind != Kind::Float && b.kind != Kind::Float;
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.i, b.i, &r)) throw TemplateError("integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::floating(as_double(a) + as_double(b));
    if (a.is_string() && b.is_string()) {
      check_string(static_cast<uint64_t>(a.s.size()) + b.s.size());
      charge_bytes(a.s.size() + b.s.size());
      if (a.markup || b.markup)  // Markup.__add__/__radd__ escape the plain operand
        return Value::string((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)), true);
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      check_items(static_cast<uint64_t>(a.items().size()) + b.items().size());
      charge_items(a.items().size() + b.items().size());
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::make_list(std::move(out), a.tuple);
    }
    if (a.is_string())
      throw TemplateError("can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (a.is_list())
      throw TemplateError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.i, b.i, &r)) throw TemplateError("integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::floating(as_double(a) - as_double(b));
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.i, b.i, &r)) throw TemplateError("integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::floating(as_double(a) * as_double(b));
    const Value* seq = nullptr;
    const Value* cnt = nullptr;
    if ((a.is_string() || a.is_list()) && (b.kind == Kind::Int || b.kind == Kind::Bool)) seq = &a, cnt = &b;
    if ((b.is_string() || b.is_list()) && (a.kind == Kind::Int || a.kind == Kind::Bool)) seq = &b, cnt = &a;
    if (!seq) return unsupported();
    uint64_t times = cnt->i < 0 ? 0 : static_cast<uint64_t>(cnt->i);
    // An empty sequence repeated any number of times is empty: no loop over `times` (which the size
    // limits do not bound when the total is 0; '' * 10**15 used to spin for hours).
    if (seq->is_string() ? seq->s.empty() : seq->items().empty()) times = 0;
    if (seq->is_string()) {
      auto total = checked_mul(seq->s.size(), times);
      check_string(total ? *total : UINT64_MAX);
      charge_bytes(*total);
      std::string out;
      out.reserve(*total);
      for (uint64_t k = 0; k < times; ++k) out += seq->s;
      return Value::string(std::move(out), seq->markup);
    }
    auto total = checked_mul(seq->items().size(), times);
    check_items(total ? *total : UINT64_MAX);
    charge_items(*total);
    List out;
    out.reserve(*total);
    for (uint64_t k = 0; k < times; ++k) out.insert(out.end(), seq->items().begin(), seq->items().end());
    return Value::make_list(std::move(out), seq->tuple);
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (as_double(b) == 0) throw TemplateError("division by zero");
    return Value::floating(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (!nums) {
      return unsupported();
    }
    if (ints) {
      if (b.i == 0) throw TemplateError(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (a.i == INT64_MIN && b.i == -1) {
        if (op == "%") return Value::integer(0);
        throw TemplateError("integer overflow");
      }
      if (op == "//") return Value::integer(py_floordiv(a.i, b.i));
      int64_t r = a.i % b.i;
      if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;
      return Value::integer(r);
    }
    double x = as_double(a), y = as_double(b);
    if (y == 0) throw TemplateError("float division by zero");
    if (op == "//") return Value::floating(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::floating(r);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && b.i >= 0) {
      if (a.i == 0 || a.i == 1) return Value::integer(b.i == 0 ? 1 : a.i);
      if (a.i == -1) return Value::integer(b.i % 2 ? -1 : 1);
      // |base| >= 2: once base overflows while bits remain, the result overflows too.
      int64_t r = 1, base = a.i;
      for (int64_t e = b.i; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) throw TemplateError("integer overflow in **");
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) throw TemplateError("integer overflow in **");
      }
      return Value::integer(r);
    }
    if (as_double(a) == 0 && as_double(b) < 0) throw TemplateError("0.0 cannot be raised to a negative power");
    return Value::floating(std::pow(as_double(a), as_double(b)));
  }
  return unsupported();
}

bool Interpreter::contains(const Value& container, const Value& item) { return compare_op("in", item, container); }

bool Interpreter::compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    switch (b.kind) {
      case Kind::String:
        if (!a.is_string())
          throw TemplateError("'in <string>' requires string as left operand, not " + type_name(a));
        found = b.s.find(a.s) != std::string::npos;
        break;
      case Kind::List:
        for (auto& x : b.items())
          if (equals(a, x)) {
            found = true;
            break;
          }
        break;
      case Kind::Dict: found = a.is_string() && b.dict->find(a.s) != nullptr; break;
      case Kind::Undefined: found = false; break;
      default: throw TemplateError("argument of type '" + type_name(b) + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

// ---- root-frame symbol analysis (jinja2 idtracking.py) ----
// jinja2 decides statically, per template-level name, where its value starts: a name whose first
// mention in the template's own frame is a definite `set` (or macro) starts *undefined* — it hides
// the context variable of that name even from loop bodies and macros that run before the set —
// while any other name is resolved from the context. A set inside an if counts as definite only if
// the if-body, the elif chain and the else branch all set it (jinja2's branch_update).
namespace {
struct RootSymbols {
  std::set<std::string> refs, stores, undefined_init;
};
void visit_loads(const Expr* e, RootSymbols& s) {
  if (!e) return;
  if (e->k == Expr::K::Name) s.refs.insert(e->name);
  for (auto& c : e->a) visit_loads(c.get(), s);
  for (auto& kv : e->kw) visit_loads(kv.second.get(), s);
}
void store(const std::string& n, RootSymbols& s) {
  s.stores.insert(n);
  if (s.refs.insert(n).second) s.undefined_init.insert(n);
}
void store_target(const Expr& t, RootSymbols& s) {
  if (t.k == Expr::K::Name) store(t.name, s);
  if (t.k == Expr::K::Tuple)
    for (auto& x : t.a) store_target(*x, s);
  if (t.k == Expr::K::Getattr) visit_loads(t.a[0].get(), s);  // ns.x = ...: loads ns
}
void analyze_root(const Body& body, RootSymbols& s);
void analyze_if(const Stmt& st, size_t first, RootSymbols& s) {
  // jinja2's If: test, body, elif_ (a chain of Ifs visited as one branch), else_
  visit_loads(st.e[first].get(), s);
  RootSymbols body = s, chain = s, other = s;
  analyze_root(st.bodies[first], body);
  const size_t n_cond = st.e.size();
  for (size_t k = first + 1; k < n_cond; ++k) {  // each elif is an If with no elif/else of its own
    visit_loads(st.e[k].get(), chain);
    RootSymbols b = chain;
    analyze_root(st.bodies[k], b);
    for (auto& n : b.stores)
      if (!chain.stores.count(n)) b.undefined_init.erase(n);  // stored in one of three branches only
    chain.refs.insert(b.refs.begin(), b.refs.end());
    chain.stores.insert(b.stores.begin(), b.stores.end());
    for (auto& n : b.refs)
      if (!b.undefined_init.count(n)) chain.undefined_init.erase(n);
  }
  if (st.bodies.size() > n_cond) analyze_root(st.bodies.back(), other);
  RootSymbols out = s;
  for (const RootSymbols* b : {&body, &chain, &other}) {
    out.refs.insert(b->refs.begin(), b->refs.end());
    out.stores.insert(b->stores.begin(), b->stores.end());
  }
  for (auto& n : out.stores) {
    if (s.stores.count(n)) continue;
    bool definite = body.stores.count(n) && chain.stores.count(n) && other.stores.count(n);
    bool undef = other.undefined_init.count(n) > 0;  // the last branch's start wins (loads.update order)
    if (definite && undef)
      out.undefined_init.insert(n);
    else
      out.undefined_init.erase(n);
  }
  s = std::move(out);
}
void analyze_root(const Body& body, RootSymbols& s) {
  for (auto& st : body) {
    switch (st->k) {
      case Stmt::K::Print: visit_loads(st->e[0].get(), s); break;
      case Stmt::K::If: analyze_if(*st, 0, s); break;
      case Stmt::K::For: visit_loads(st->e[1].get(), s); break;
      case Stmt::K::Set:
        visit_loads(st->e[1].get(), s);
        store_target(*st->e[0], s);
        break;
      case Stmt::K::SetBlock: store_target(*st->e[0], s); break;
      case Stmt::K::Macro: store(st->text, s); break;
      case Stmt::K::CallBlock:
      case Stmt::K::FilterBlock: visit_loads(st->e[0].get(), s); break;
      case Stmt::K::With:
        for (auto& x : st->e) visit_loads(x.get(), s);
        break;
      default: break;
    }
  }
}
}  // namespace

// ---- Template ----
Template Template::parse(std::string_view source) {
  Template t;
  t.body_ = std::make_shared<const Body>(parse_template(source));
  RootSymbols s;
  analyze_root(*t.body_, s);
  t.root_undefined_ = std::make_shared<const std::vector<std::string>>(s.undefined_init.begin(), s.undefined_init.end());
  return t;
}

std::string Template::render(const Dict& context, const RenderOptions& opt) const {
  Interpreter in(context, opt);
  return in.run(*body_, *root_undefined_);
}

}  // namespace strata::jinja
