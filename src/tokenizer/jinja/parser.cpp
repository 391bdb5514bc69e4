// Jinja parser: tokens -> Body (see parser.h). Mirrors jinja2/parser.py method by method.
#include "tokenizer/jinja/parser.h"

#include <set>

#include "tokenizer/jinja/lexer.h"

namespace strata::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression/statement nesting (stack safety)

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse() {
    Body b = subparse({});
    if (cur().type != Tok::Eof) fail("unexpected '" + cur().text + "'");
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::set<std::string>> macro_names_;  // names referenced in each open macro body

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& look(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::Data: return "template data";
      case Tok::String: return "string";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(cur(), msg); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& msg) {
    throw TemplateError("template line " + std::to_string(t.line) + " col " + std::to_string(t.col) + ": " + msg);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  void expect_name(const char* n) {
    if (!skip_name(n)) fail(std::string("expected '") + n + "', got " + describe(cur()));
  }
  std::string expect_any_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected end of statement block, got " + describe(cur()));
    next();
  }

  template <typename N>
  std::unique_ptr<N> node(typename N::K k, const Token& at) {
    auto n = std::make_unique<N>();
    n->k = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }
  ExprP expr(Expr::K k, const Token& at) { return node<Expr>(k, at); }

  // ---- statements ----
  // Parses until a block whose first name is one of `ends` (left current), or the end of input.
  Body subparse(const std::set<std::string>& ends) {
    DepthGuard g(*this);
    Body body;
    while (cur().type != Tok::Eof) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        auto s = node<Stmt>(Stmt::K::Text, t);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = node<Stmt>(Stmt::K::Print, t);
        s->e.push_back(parse_tuple(false, true, {}, false));
        if (cur().type != Tok::VarEnd) fail("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type == Tok::Name && ends.count(cur().text)) return body;
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
    if (!ends.empty()) fail("unexpected end of template, expected one of: " + join(ends));
    return body;
  }
  static std::string join(const std::set<std::string>& s) {
    std::string out;
    for (auto& x : s) out += (out.empty() ? "'" : ", '") + x + "'";
    return out;
  }
  // After the statement's own header: `%}` body up to one of `ends`; consumes the end name when drop.
  Body parse_statements(const std::set<std::string>& ends, bool drop_needle) {
    expect_block_end();
    Body b = subparse(ends);
    if (drop_needle) next();
    return b;
  }

  StmtP parse_statement() {
    DepthGuard g(*this);
    const Token& t = cur();
    if (t.type != Tok::Name) fail("tag name expected");
    const std::string& n = t.text;
    StmtP s;
    if (n == "for") s = parse_for();
    else if (n == "if") s = parse_if();
    else if (n == "set") s = parse_set();
    else if (n == "macro") s = parse_macro();
    else if (n == "call") s = parse_call_block();
    else if (n == "filter") s = parse_filter_block();
    else if (n == "with") s = parse_with();
    else if (n == "generation") {
      next();
      s = node<Stmt>(Stmt::K::Scope, t);
      s->bodies.push_back(parse_statements({"endgeneration"}, true));
    } else if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail("'" + n + "' outside of a loop");
      next();
      s = node<Stmt>(n == "break" ? Stmt::K::Break : Stmt::K::Continue, t);
    } else {
      static const std::set<std::string> unsupported = {"include", "import", "from", "extends", "block",
                                                        "autoescape", "trans", "do"};
      if (unsupported.count(n)) fail("tag '" + n + "' is not supported in the chat template sandbox");
      fail("encountered unknown tag '" + n + "'");
    }
    expect_block_end();
    return s;
  }

  StmtP parse_for() {
    auto s = node<Stmt>(Stmt::K::For, next());
    s->e.push_back(parse_assign_target(true, false, "in", false));
    expect_name("in");
    s->e.push_back(parse_tuple(false, false, "recursive", false));
    if (skip_name("if"))
      s->e.push_back(parse_expression(true));
    else
      s->e.push_back(nullptr);
    if (is_name("recursive")) fail("recursive loops are not supported");
    ++loop_depth_;
    s->bodies.push_back(parse_statements({"endfor", "else"}, false));
    --loop_depth_;
    if (next().text == "else") s->bodies.push_back(parse_statements({"endfor"}, true));
    return s;
  }

  StmtP parse_if() {
    auto s = node<Stmt>(Stmt::K::If, next());
    while (true) {
      s->e.push_back(parse_tuple(false, false, {}, false));
      s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") s->bodies.push_back(parse_statements({"endif"}, true));
      break;
    }
    return s;
  }

  StmtP parse_set() {
    const Token& at = next();
    ExprP target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = node<Stmt>(Stmt::K::Set, at);
      s->e.push_back(std::move(target));
      s->e.push_back(parse_tuple(false, true, {}, false));
      return s;
    }
    if (target->k != Expr::K::Name) fail("block set needs a plain name as target");
    auto s = node<Stmt>(Stmt::K::SetBlock, at);
    s->e.push_back(std::move(target));
    s->e.push_back(is_op("|") ? parse_filter(nullptr, false) : nullptr);
    s->bodies.push_back(parse_statements({"endset"}, true));
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (cur().type != Tok::Name) fail("expected a parameter name, got " + describe(cur()));
      s.params.push_back(next().text);
      if (skip_op("="))
        s.defaults.push_back(parse_expression(true));
      else {
        for (auto& d : s.defaults)
          if (d) fail("non-default argument follows default argument");
        s.defaults.push_back(nullptr);
      }
    }
    expect_op(")");
  }

  StmtP parse_macro() {
    auto s = node<Stmt>(Stmt::K::Macro, next());
    s->text = expect_any_name();
    parse_signature(*s);
    parse_callable_body(*s, "endmacro");
    return s;
  }

  StmtP parse_call_block() {
    auto s = node<Stmt>(Stmt::K::CallBlock, next());
    if (is_op("(")) parse_signature(*s);
    ExprP call = parse_expression(true);
    if (call->k != Expr::K::Call) fail("expected a call in {% call %}");
    s->e.push_back(std::move(call));
    parse_callable_body(*s, "endcall");
    return s;
  }

  // The body of a macro or a call block, up to `end_tag`: its own scope for the names varargs, kwargs and
  // caller (recorded on s), and outside any loop.
  void parse_callable_body(Stmt& s, const char* end_tag) {
    macro_names_.emplace_back();
    int saved_loop = loop_depth_;
    loop_depth_ = 0;
    s.bodies.push_back(parse_statements({end_tag}, true));
    loop_depth_ = saved_loop;
    auto& names = macro_names_.back();
    s.uses_varargs = names.count("varargs");
    s.uses_kwargs = names.count("kwargs");
    s.uses_caller = names.count("caller");
    macro_names_.pop_back();
  }

  StmtP parse_filter_block() {
    auto s = node<Stmt>(Stmt::K::FilterBlock, next());
    s->e.push_back(parse_filter(nullptr, true));
    s->bodies.push_back(parse_statements({"endfilter"}, true));
    return s;
  }

  StmtP parse_with() {
    auto s = node<Stmt>(Stmt::K::With, next());
    while (cur().type != Tok::BlockEnd) {
      if (!s->params.empty()) expect_op(",");
      s->params.push_back(expect_any_name());
      expect_op("=");
      s->e.push_back(parse_expression(true));
    }
    s->bodies.push_back(parse_statements({"endwith"}, true));
    return s;
  }

  // Name, tuple of names, or (with_namespace) name.attr.
  ExprP parse_assign_target(bool with_tuple, bool name_only, const char* extra_end, bool with_namespace) {
    const Token& at = cur();
    if (with_namespace && at.type == Tok::Name && look().type == Tok::Op && look().text == ".") {
      auto obj = expr(Expr::K::Name, at);
      obj->name = next().text;
      next();
      auto e = expr(Expr::K::Getattr, at);
      e->name = expect_any_name();
      e->a.push_back(std::move(obj));
      return e;
    }
    ExprP target;
    if (name_only) {
      target = expr(Expr::K::Name, at);
      target->name = expect_any_name();
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false);
    } else {
      target = parse_primary();
    }
    auto assignable = [](const Expr& x) { return x.k == Expr::K::Name; };
    bool ok = assignable(*target);
    if (target->k == Expr::K::Tuple) {
      ok = !target->a.empty();
      for (auto& x : target->a) ok = ok && assignable(*x);
    }
    if (!ok) fail_at(at, "can't assign to this expression");
    return target;
  }

  // ---- expressions ----
  bool is_tuple_end(const char* extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof) return true;
    if (is_op(")")) return true;
    return extra_end && is_name(extra_end);
  }

  ExprP parse_tuple(bool simplified, bool with_condexpr, const char* extra_end, bool explicit_parens) {
    const Token& at = cur();
    std::vector<ExprP> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto t = expr(Expr::K::Tuple, at);
    t->a = std::move(items);
    return t;
  }

  ExprP parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprP parse_condexpr() {
    const Token& at = cur();
    ExprP e1 = parse_or();
    while (skip_name("if")) {
      ExprP test = parse_or();
      ExprP e3 = skip_name("else") ? parse_condexpr() : nullptr;
      auto c = expr(Expr::K::Cond, at);
      c->a.push_back(std::move(e1));
      c->a.push_back(std::move(test));
      c->a.push_back(std::move(e3));
      e1 = std::move(c);
    }
    return e1;
  }

  ExprP bin(const char* op, ExprP l, ExprP r, const Token& at) {
    auto e = expr(Expr::K::Bin, at);
    e->name = op;
    e->a.push_back(std::move(l));
    e->a.push_back(std::move(r));
    return e;
  }

  ExprP parse_or() {
    const Token& at = cur();
    ExprP l = parse_and();
    while (skip_name("or")) l = bin("or", std::move(l), parse_and(), at);
    return l;
  }
  ExprP parse_and() {
    const Token& at = cur();
    ExprP l = parse_not();
    while (skip_name("and")) l = bin("and", std::move(l), parse_not(), at);
    return l;
  }
  ExprP parse_not() {
    DepthGuard g(*this);
    const Token& at = cur();
    if (skip_name("not")) {
      auto e = expr(Expr::K::Not, at);
      e->a.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const Token& at = cur();
    ExprP first = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = expr(Expr::K::Compare, at);
        cmp->a.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->a.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprP parse_math1() {
    const Token& at = cur();
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = bin(op == "+" ? "+" : "-", std::move(l), parse_concat(), at);
    }
    return l;
  }
  ExprP parse_concat() {
    const Token& at = cur();
    ExprP l = parse_math2();
    while (skip_op("~")) l = bin("~", std::move(l), parse_math2(), at);
    return l;
  }
  ExprP parse_math2() {
    const Token& at = cur();
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      const char* o = op == "*" ? "*" : op == "/" ? "/" : op == "//" ? "//" : "%";
      l = bin(o, std::move(l), parse_pow(), at);
    }
    return l;
  }
  ExprP parse_pow() {
    const Token& at = cur();
    ExprP l = parse_unary(true);
    while (skip_op("**")) l = bin("**", std::move(l), parse_unary(true), at);
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    DepthGuard g(*this);
    const Token& at = cur();
    ExprP n;
    if (skip_op("-")) {
      n = expr(Expr::K::Neg, at);
      n->a.push_back(parse_unary(false));
    } else if (skip_op("+")) {
      n = expr(Expr::K::Pos, at);
      n->a.push_back(parse_unary(false));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprP parse_primary() {
    DepthGuard g(*this);
    const Token& t = cur();
    switch (t.type) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = expr(Expr::K::Const, t);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = expr(Expr::K::Const, t);
          e->value = Value::none();
          return e;
        }
        auto e = expr(Expr::K::Name, t);
        e->name = t.text;
        for (auto& names : macro_names_) names.insert(t.text);
        return e;
      }
      case Tok::String: {
        std::string s = next().text;
        while (cur().type == Tok::String) s += next().text;
        auto e = expr(Expr::K::Const, t);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Int: {
        next();
        auto e = expr(Expr::K::Const, t);
        e->value = Value::integer(t.ival);
        return e;
      }
      case Tok::Float: {
        next();
        auto e = expr(Expr::K::Const, t);
        e->value = Value::floating(t.fval);
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          ExprP e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail("unexpected " + describe(t));
  }

  ExprP parse_list() {
    auto e = expr(Expr::K::List, next());
    while (!is_op("]")) {
      if (!e->a.empty()) expect_op(",");
      if (is_op("]")) break;
      e->a.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }
  ExprP parse_dict() {
    auto e = expr(Expr::K::Dict, next());
    while (!is_op("}")) {
      if (!e->a.empty()) expect_op(",");
      if (is_op("}")) break;
      e->a.push_back(parse_expression(true));
      expect_op(":");
      e->a.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprP parse_postfix(ExprP n) {
    while (true) {
      if (is_op(".") || is_op("["))
        n = parse_subscript(std::move(n));
      else if (is_op("("))
        n = parse_call(std::move(n));
      else
        return n;
    }
  }
  ExprP parse_filter_expr(ExprP n) {
    while (true) {
      if (is_op("|"))
        n = parse_filter(std::move(n), false);
      else if (is_name("is"))
        n = parse_test(std::move(n));
      else if (is_op("("))
        n = parse_call(std::move(n));
      else
        return n;
    }
  }

  ExprP parse_subscript(ExprP n) {
    DepthGuard g(*this);
    const Token& at = next();
    if (at.text == ".") {
      const Token& a = cur();
      if (a.type == Tok::Name) {
        next();
        auto e = expr(Expr::K::Getattr, at);
        e->name = a.text;
        e->a.push_back(std::move(n));
        return e;
      }
      if (a.type == Tok::Int) {
        next();
        auto e = expr(Expr::K::Getitem, at);
        e->a.push_back(std::move(n));
        auto idx = expr(Expr::K::Const, a);
        idx->value = Value::integer(a.ival);
        e->a.push_back(std::move(idx));
        return e;
      }
      fail("expected name or number after '.'");
    }
    std::vector<ExprP> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() == 1 && args[0]->k == Expr::K::Slice) {
      args[0]->a[0] = std::move(n);
      return std::move(args[0]);
    }
    auto e = expr(Expr::K::Getitem, at);
    e->a.push_back(std::move(n));
    if (args.size() == 1) {
      e->a.push_back(std::move(args[0]));
    } else {
      for (auto& x : args)
        if (x->k == Expr::K::Slice) fail_at(at, "multi-dimensional slices are not supported");
      auto tup = expr(Expr::K::Tuple, at);
      tup->a = std::move(args);
      e->a.push_back(std::move(tup));
    }
    return e;
  }
  ExprP parse_subscribed() {
    const Token& at = cur();
    std::vector<ExprP> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprP n = parse_expression(true);
      if (!skip_op(":")) return n;
      parts.push_back(std::move(n));
    }
    if (is_op(":"))
      parts.push_back(nullptr);
    else if (!is_op("]") && !is_op(","))
      parts.push_back(parse_expression(true));
    else
      parts.push_back(nullptr);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(","))
        parts.push_back(parse_expression(true));
      else
        parts.push_back(nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = expr(Expr::K::Slice, at);
    s->a.push_back(nullptr);  // the sliced object, filled in by parse_subscript
    for (auto& x : parts) s->a.push_back(std::move(x));
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args / **kwargs in calls are not supported");
      if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        std::string key = next().text;
        next();
        e.kw.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kw.empty()) fail("positional argument follows keyword argument");
        e.a.push_back(parse_expression(true));
      }
      need_comma = true;
    }
    expect_op(")");
  }
  ExprP parse_call(ExprP n) {
    DepthGuard g(*this);
    auto e = expr(Expr::K::Call, cur());
    e->a.push_back(std::move(n));
    parse_call_args(*e);
    return e;
  }
  ExprP parse_filter(ExprP n, bool start_inline) {
    while (is_op("|") || start_inline) {
      DepthGuard g(*this);
      if (!start_inline) next();
      start_inline = false;
      const Token& at = cur();
      auto e = expr(Expr::K::Filter, at);
      e->name = expect_any_name();
      while (skip_op(".")) e->name += "." + expect_any_name();
      e->a.push_back(std::move(n));
      if (is_op("(")) parse_call_args(*e);
      n = std::move(e);
    }
    return n;
  }
  ExprP parse_test(ExprP n) {
    DepthGuard g(*this);
    const Token& at = next();  // 'is'
    bool negated = skip_name("not");
    auto e = expr(Expr::K::Test, at);
    e->name = expect_any_name();
    while (skip_op(".")) e->name += "." + expect_any_name();
    e->a.push_back(std::move(n));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->a.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto neg = expr(Expr::K::Not, at);
    neg->a.push_back(std::move(e));
    return neg;
  }
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse(); }

}  // namespace strata::jinja
