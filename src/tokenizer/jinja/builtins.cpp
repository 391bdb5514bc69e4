// Builtin filters, tests, methods and globals of the sandbox (jinja2 3.1 filters.py/tests.py,
// Python str/dict/list methods, and HF's tojson/raise_exception/strftime_now).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "tokenizer/jinja/interpreter.h"

namespace strata::jinja {
namespace {

// ---- argument binding (Python-style positional/keyword) ----
struct Bound {
  std::vector<std::optional<Value>> v;
  const Value* get(size_t k) const { return v[k] ? &*v[k] : nullptr; }
};
Bound bind(const char* fn, const Args& args, std::initializer_list<const char*> names) {
  Bound b;
  b.v.resize(names.size());
  std::vector<const char*> ns(names);
  if (args.pos.size() > ns.size())
    throw TemplateError(std::string(fn) + "() takes at most " + std::to_string(ns.size()) + " argument(s)");
  for (size_t k = 0; k < args.pos.size(); ++k) b.v[k] = args.pos[k];
  for (auto& kv : args.kw) {
    const std::string& key = kv.first;
    const Value& val = kv.second;
    auto it = std::find_if(ns.begin(), ns.end(), [&](const char* n) { return key == n; });
    if (it == ns.end()) throw TemplateError(std::string(fn) + "() got an unexpected keyword argument '" + key + "'");
    size_t k = static_cast<size_t>(it - ns.begin());
    if (b.v[k]) throw TemplateError(std::string(fn) + "() got multiple values for argument '" + key + "'");
    b.v[k] = val;
  }
  return b;
}

std::string need_str(const Value* v, const char* what) {
  if (!v || !v->is_string()) throw TemplateError(std::string(what) + " must be a string");
  return v->s;
}
int64_t need_int(const Value* v, const char* what) {
  if (!v || (v->kind != Kind::Int && v->kind != Kind::Bool)) throw TemplateError(std::string(what) + " must be an integer");
  return v->i;
}
bool arg_true(const Value* v, bool def) { return v ? truthy(*v) : def; }

// ---- string helpers (Python str semantics on code points) ----
// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (the scripts chat
// templates meet); other code points are left as they are.
uint32_t ascii_lower(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
    return c % 2 == 0 ? c + 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 == 1 ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
uint32_t ascii_upper(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
    return c % 2 == 1 ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 == 0 ? c - 1 : c;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
bool is_alpha_cp(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0xC0; }

std::string map_cps(const std::string& s, uint32_t (*f)(uint32_t)) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) utf8_append(out, f(c));
  return out;
}
std::string str_lower(const std::string& s) { return map_cps(s, ascii_lower); }
std::string str_upper(const std::string& s) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) {
    if (c == 0xDF)
      out += "SS";  // Python: 'ß'.upper() == 'SS'
    else
      utf8_append(out, ascii_upper(c));
  }
  return out;
}
std::string str_capitalize(const std::string& s) {
  auto cps = utf8_decode(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) utf8_append(out, k == 0 ? ascii_upper(cps[k]) : ascii_lower(cps[k]));
  return out;
}
// Python str.title(): a letter after a non-letter is upper-cased, other letters lower-cased.
std::string str_title(const std::string& s) {
  std::string out;
  bool prev_alpha = false;
  for (uint32_t c : utf8_decode(s)) {
    bool a = is_alpha_cp(c);
    utf8_append(out, a ? (prev_alpha ? ascii_lower(c) : ascii_upper(c)) : c);
    prev_alpha = a;
  }
  return out;
}
// jinja's |title: words split at runs of [-\s({\[<]; each word: first char upper, rest lower.
std::string jinja_title(const std::string& s) {
  auto cps = utf8_decode(s);
  std::string out;
  auto sep = [](uint32_t c) { return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  bool at_start = true;
  for (uint32_t c : cps) {
    if (sep(c)) {
      utf8_append(out, c);
      at_start = true;
    } else {
      utf8_append(out, at_start ? ascii_upper(c) : ascii_lower(c));
      at_start = false;
    }
  }
  return out;
}

std::string str_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<uint32_t> set;
  bool ws = !chars || chars->is_none();
  if (!ws) set = utf8_decode(need_str(chars, "strip chars"));
  auto strip_me = [&](uint32_t c) { return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && strip_me(cps[a])) ++a;
  if (right)
    while (b > a && strip_me(cps[b - 1])) --b;
  return utf8_encode(cps, a, b);
}

List str_split(Interpreter& in, const std::string& s, const Value* sepv, int64_t maxsplit, bool from_right) {
  List out;
  if (!sepv || sepv->is_none()) {  // runs of whitespace, no empty strings
    auto cps = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && py_isspace(cps[k])) ++k;
      if (k >= cps.size()) break;
      size_t st = k;
      while (k < cps.size() && !py_isspace(cps[k])) ++k;
      words.emplace_back(st, k);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      if (!from_right) {  // the remainder keeps its trailing whitespace
        size_t st = words[maxsplit].first, en = cps.size();
        words.resize(maxsplit);
        words.emplace_back(st, en);
      } else {
        size_t cut = words.size() - maxsplit - 1;
        std::pair<size_t, size_t> first{0, words[cut].second};  // keeps leading whitespace
        words.erase(words.begin(), words.begin() + cut + 1);
        words.insert(words.begin(), first);
      }
    }
    for (auto [a, b] : words) out.push_back(Value::string(utf8_encode(cps, a, b)));
    return out;
  }
  std::string sep = need_str(sepv, "separator");
  if (sep.empty()) throw TemplateError("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t p = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      size_t q = s.find(sep, p);
      if (q == std::string::npos) break;
      parts.push_back(s.substr(p, q - p));
      p = q + sep.size();
      ++n;
    }
    parts.push_back(s.substr(p));
  } else {
    size_t end = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n < maxsplit) {
      if (end < sep.size()) break;
      size_t q = s.rfind(sep, end - sep.size());
      if (q == std::string::npos) break;
      rev.push_back(s.substr(q + sep.size(), end - q - sep.size()));
      end = q;
      ++n;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  in.check_items(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string str_replace(Interpreter& in, const std::string& s, const std::string& old, const std::string& neu,
                        int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `neu` before every code point and at the end
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += neu;
        ++done;
      }
      if (k < cps.size()) utf8_append(out, cps[k]);
      in.check_string(out.size());
    }
    return out;
  }
  size_t p = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t q = s.find(old, p);
    if (q == std::string::npos) break;
    out.append(s, p, q - p);
    out += neu;
    in.check_string(out.size());
    p = q + old.size();
    ++done;
  }
  out.append(s, p, std::string::npos);
  in.check_string(out.size());
  return out;
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_pos)));
}

int64_t py_len(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_length(v.s));
    case Kind::List: return static_cast<int64_t>(v.items().size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->size());
    default: throw TemplateError("object of type '" + type_name(v) + "' has no len()");
  }
}

// Python float(str): surrounding whitespace, sign, digits with '_', inf/nan.
std::optional<double> parse_py_float(const std::string& raw) {
  std::string s = str_strip(raw, nullptr, true, true);
  std::string t;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_') {
      if (k == 0 || k + 1 >= s.size() || !isdigit(static_cast<unsigned char>(s[k - 1])) ||
          !isdigit(static_cast<unsigned char>(s[k + 1])))
        return std::nullopt;
      continue;
    }
    t += s[k];
  }
  if (t.empty()) return std::nullopt;
  std::string low = str_lower(t);
  std::string body = (low[0] == '+' || low[0] == '-') ? low.substr(1) : low;
  double sign = low[0] == '-' ? -1 : 1;
  if (body == "inf" || body == "infinity") return sign * INFINITY;
  if (body == "nan") return NAN;
  for (char c : body)
    if (!(isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}
std::optional<int64_t> parse_py_int(const std::string& raw, int base) {
  std::string s = str_strip(raw, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  bool neg = false;
  size_t k = 0;
  if (s[0] == '+' || s[0] == '-') neg = s[0] == '-', k = 1;
  std::string low = str_lower(s.substr(k));
  if ((base == 16 && low.rfind("0x", 0) == 0) || (base == 8 && low.rfind("0o", 0) == 0) ||
      (base == 2 && low.rfind("0b", 0) == 0))
    low = low.substr(2);
  if (low.empty()) return std::nullopt;
  int64_t v = 0;
  for (size_t j = 0; j < low.size(); ++j) {
    char c = low[j];
    if (c == '_' && j > 0 && j + 1 < low.size() && low[j - 1] != '_') continue;
    int d = isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
      throw TemplateError("integer too large: " + raw);
  }
  return neg ? -v : v;
}

// Attribute getter of map/selectattr/sort(attribute=...): dotted path, integer parts index.
Value attr_path(Interpreter& in, Value v, const Value& attr) {
  if (attr.kind == Kind::Int) return in.getitem(v, attr);
  std::string path = need_str(&attr, "attribute");
  size_t p = 0;
  while (true) {
    size_t q = path.find('.', p);
    std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
    Value key = Value::string(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return isdigit(static_cast<unsigned char>(c)); }))
      key = Value::integer(std::strtoll(part.c_str(), nullptr, 10));
    v = in.getitem(v, key);
    if (q == std::string::npos) return v;
    p = q + 1;
  }
}

Value case_fold(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(str_lower(v.s));
  return v;
}

std::string html_escape_str(const std::string& s) {
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

// ---- filters ----
Value f_abs(Interpreter&, const Value& v, Args&) {
  if (v.kind == Kind::Float) return Value::floating(std::fabs(v.f));
  if (v.kind == Kind::Int || v.kind == Kind::Bool) {
    if (v.i == INT64_MIN) throw TemplateError("integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.is_undefined()) undefined_error(v);
  throw TemplateError("bad operand type for abs(): '" + type_name(v) + "'");
}
Value f_attr(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("attr", a, {"name"});
  return in.getattr(v, need_str(b.get(0), "attr name"));
}
Value f_batch(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("batch", a, {"linecount", "fill_with"});
  int64_t n = need_int(b.get(0), "batch linecount");
  if (n <= 0) throw TemplateError("batch linecount must be positive");
  List out, cur;
  for (auto& x : in.iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::make_list(std::move(cur))), cur.clear();
  }
  if (!cur.empty()) {
    if (const Value* fill = b.get(1); fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    out.push_back(Value::make_list(std::move(cur)));
  }
  return Value::make_list(std::move(out));
}
Value f_capitalize(Interpreter&, const Value& v, Args&) { return Value::string(str_capitalize(to_str(v))); }
Value f_length(Interpreter&, const Value& v, Args&) { return Value::integer(py_len(v)); }
Value f_default(Interpreter&, const Value& v, Args& a) {
  auto b = bind("default", a, {"default_value", "boolean"});
  bool boolean = arg_true(b.get(1), false);
  if (v.is_undefined() || (boolean && !truthy(v))) return b.get(0) ? *b.get(0) : Value::string("");
  return v;
}
Value f_dictsort(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("dictsort", a, {"case_sensitive", "by", "reverse"});
  bool cs = arg_true(b.get(0), false), rev = arg_true(b.get(2), false);
  std::string by = b.get(1) ? need_str(b.get(1), "by") : "key";
  if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
  if (v.is_undefined()) undefined_error(v);
  if (v.kind != Kind::Dict) throw TemplateError("dictsort expects a mapping, got '" + type_name(v) + "'");
  List items;
  for (auto& [k, x] : v.dict->items()) items.push_back(Value::make_list({Value::string(k), x}, true));
  size_t idx = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = compare(case_fold(x.items()[idx], cs), case_fold(y.items()[idx], cs));
    return rev ? c > 0 : c < 0;
  });
  in.step();
  return Value::make_list(std::move(items));
}
Value f_escape(Interpreter&, const Value& v, Args&) {
  if (v.is_string() && v.markup) return v;
  return Value::string(html_escape_str(to_str(v)), true);
}
Value f_first(Interpreter& in, const Value& v, Args&) {
  if (v.is_list()) return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items()[0];
  auto xs = in.iterate(v);
  return xs.empty() ? Value::undefined("No first item, sequence was empty.") : xs[0];
}
Value f_last(Interpreter& in, const Value& v, Args&) {
  if (v.is_undefined()) undefined_error(v);
  auto xs = in.iterate(v);
  return xs.empty() ? Value::undefined("No last item, sequence was empty.") : xs.back();
}
Value f_float(Interpreter&, const Value& v, Args& a) {
  auto b = bind("float", a, {"default"});
  Value def = b.get(0) ? *b.get(0) : Value::floating(0.0);
  switch (v.kind) {
    case Kind::Float: return v;
    case Kind::Int:
    case Kind::Bool: return Value::floating(static_cast<double>(v.i));
    case Kind::String: {
      auto d = parse_py_float(v.s);
      return d ? Value::floating(*d) : def;
    }
    case Kind::Undefined: undefined_error(v);
    default: return def;
  }
}
Value f_int(Interpreter&, const Value& v, Args& a) {
  auto b = bind("int", a, {"default", "base"});
  Value def = b.get(0) ? *b.get(0) : Value::integer(0);
  int base = b.get(1) ? static_cast<int>(need_int(b.get(1), "base")) : 10;
  if (base < 2 || base > 36) throw TemplateError("int() base must be >= 2 and <= 36");
  switch (v.kind) {
    case Kind::Int:
    case Kind::Bool: return Value::integer(v.i);
    case Kind::Float:
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
      return Value::integer(static_cast<int64_t>(v.f));
    case Kind::String: {
      if (auto i = parse_py_int(v.s, base)) return Value::integer(*i);
      auto d = parse_py_float(v.s);
      if (d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value::integer(static_cast<int64_t>(*d));
      return def;
    }
    case Kind::Undefined: undefined_error(v);
    default: return def;
  }
}
Value f_items(Interpreter&, const Value& v, Args&) {
  if (v.is_undefined()) return Value::make_list({});
  if (v.kind != Kind::Dict) throw TemplateError("Can only get item pairs from a mapping.");
  List items;
  for (auto& [k, x] : v.dict->items()) items.push_back(Value::make_list({Value::string(k), x}, true));
  return Value::make_list(std::move(items));
}
Value f_join(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("join", a, {"d", "attribute"});
  std::string d = b.get(0) ? to_str(*b.get(0)) : "";
  std::string out;
  bool first = true;
  for (auto& x : in.iterate(v)) {
    if (!first) out += d;
    first = false;
    out += to_str(b.get(1) ? attr_path(in, x, *b.get(1)) : x);
    in.check_string(out.size());
  }
  return Value::string(std::move(out));
}
Value f_list(Interpreter& in, const Value& v, Args&) { return Value::make_list(in.iterate(v)); }
Value f_lower(Interpreter&, const Value& v, Args&) { return Value::string(str_lower(to_str(v))); }
Value f_upper(Interpreter&, const Value& v, Args&) { return Value::string(str_upper(to_str(v))); }
Value f_map(Interpreter& in, const Value& v, Args& a) {
  List out;
  auto xs = in.iterate(v);
  if (const Value* attr = a.find_kw("attribute")) {
    const Value* def = a.find_kw("default");
    for (auto& x : xs) {
      Value r = attr_path(in, x, *attr);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return Value::make_list(std::move(out));
  }
  if (a.pos.empty()) throw TemplateError("map requires a filter name or attribute=");
  std::string name = need_str(&a.pos[0], "map filter name");
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (auto& x : xs) {
    in.step();
    Args copy = rest;
    out.push_back(in.filter(name, x, copy));
  }
  return Value::make_list(std::move(out));
}
Value minmax(Interpreter& in, const Value& v, Args& a, bool want_max) {
  auto b = bind(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  bool cs = arg_true(b.get(0), false);
  auto xs = in.iterate(v);
  if (xs.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](const Value& x) { return case_fold(b.get(1) ? attr_path(in, x, *b.get(1)) : x, cs); };
  for (size_t k = 1; k < xs.size(); ++k) {
    int c = compare(key(xs[k]), key(xs[best]));
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return xs[best];
}
Value f_max(Interpreter& in, const Value& v, Args& a) { return minmax(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, Args& a) { return minmax(in, v, a, false); }

Value select_impl(Interpreter& in, const Value& v, Args& a, bool by_attr, bool keep_if) {
  size_t k = 0;
  Value attr;
  if (by_attr) {
    if (a.pos.empty()) throw TemplateError("selectattr/rejectattr require an attribute name");
    attr = a.pos[k++];
  }
  std::string test;
  if (k < a.pos.size()) test = need_str(&a.pos[k++], "test name");
  Args targs;
  targs.pos.assign(a.pos.begin() + static_cast<long>(std::min(k, a.pos.size())), a.pos.end());
  targs.kw = a.kw;
  List out;
  for (auto& x : in.iterate(v)) {
    in.step();
    Value subject = by_attr ? attr_path(in, x, attr) : x;
    bool r;
    if (test.empty()) {
      r = truthy(subject);
    } else {
      Args copy = targs;
      r = in.test(test, subject, copy);
    }
    if (r == keep_if) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, Args& a) { return select_impl(in, v, a, true, false); }

Value f_replace(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("replace", a, {"old", "new", "count"});
  int64_t count = b.get(2) && !b.get(2)->is_none() ? need_int(b.get(2), "count") : -1;
  std::string old = to_str(b.get(0) ? *b.get(0) : Value::undefined());
  std::string neu = to_str(b.get(1) ? *b.get(1) : Value::undefined());
  if (!b.get(0) || !b.get(1)) throw TemplateError("replace() requires old and new");
  return Value::string(str_replace(in, to_str(v), old, neu, count), v.markup);
}
Value f_reverse(Interpreter& in, const Value& v, Args&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8_encode(cps, 0, cps.size()));
  }
  auto xs = in.iterate(v);
  std::reverse(xs.begin(), xs.end());
  return Value::make_list(std::move(xs));
}
Value f_round(Interpreter&, const Value& v, Args& a) {
  auto b = bind("round", a, {"precision", "method"});
  int64_t prec = b.get(0) ? need_int(b.get(0), "precision") : 0;
  std::string method = b.get(1) ? need_str(b.get(1), "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    throw TemplateError("method must be common, ceil or floor");
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_number()) throw TemplateError("round: '" + type_name(v) + "' is not a number");
  if (prec < -30 || prec > 30) throw TemplateError("round: precision out of range");
  double x = v.kind == Kind::Float ? v.f : static_cast<double>(v.i);
  double scale = std::pow(10.0, static_cast<double>(prec));
  double r;
  if (method == "common") {
    if (v.kind != Kind::Float) {  // round(int, n) stays an int
      if (prec >= 0) return Value::integer(v.i);
      return Value::integer(static_cast<int64_t>(std::nearbyint(x * scale) / scale));
    }
    r = std::nearbyint(x * scale) / scale;  // Python rounds half to even
  } else {
    r = (method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale;
  }
  return Value::floating(r);
}
Value f_safe(Interpreter&, const Value& v, Args&) { return Value::string(to_str(v), true); }
Value f_sort(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool rev = arg_true(b.get(0), false), cs = arg_true(b.get(1), false);
  auto xs = in.iterate(v);
  auto key = [&](const Value& x) { return case_fold(b.get(2) ? attr_path(in, x, *b.get(2)) : x, cs); };
  std::stable_sort(xs.begin(), xs.end(), [&](const Value& x, const Value& y) {
    int c = compare(key(x), key(y));
    return rev ? c > 0 : c < 0;
  });
  return Value::make_list(std::move(xs));
}
Value f_string(Interpreter&, const Value& v, Args&) {
  if (v.is_string()) return v;
  return Value::string(to_str(v));
}
Value f_sum(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("sum", a, {"attribute", "start"});
  Value acc = b.get(1) ? *b.get(1) : Value::integer(0);
  for (auto& x : in.iterate(v)) {
    Value item = b.get(0) ? attr_path(in, x, *b.get(0)) : x;
    if (!acc.is_number() || !item.is_number())
      throw TemplateError("unsupported operand type(s) for +: '" + type_name(acc) + "' and '" + type_name(item) + "'");
    if (acc.kind != Kind::Float && item.kind != Kind::Float) {
      int64_t r;
      if (__builtin_add_overflow(acc.i, item.i, &r)) throw TemplateError("integer overflow");
      acc = Value::integer(r);
    } else {
      acc = Value::floating((acc.kind == Kind::Float ? acc.f : acc.i) + (item.kind == Kind::Float ? item.f : item.i));
    }
  }
  return acc;
}
Value f_title(Interpreter&, const Value& v, Args&) { return Value::string(jinja_title(to_str(v))); }
Value f_tojson(Interpreter&, const Value& v, Args& a) {
  // HF: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> json.dumps(...)
  auto b = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = arg_true(b.get(0), false);
  if (const Value* ind = b.get(1); ind && !ind->is_none()) {
    o.has_indent = true;
    if (ind->is_string())
      o.indent = ind->s;
    else if (ind->kind == Kind::Int || ind->kind == Kind::Bool)
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(ind->i, 0, 64)), ' ');
    else
      throw TemplateError("tojson: indent must be an integer or a string");
    o.item_sep = ",";
  }
  if (const Value* sep = b.get(2); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->items().size() != 2 || !sep->items()[0].is_string() || !sep->items()[1].is_string())
      throw TemplateError("tojson: separators must be a pair of strings");
    o.item_sep = sep->items()[0].s;
    o.key_sep = sep->items()[1].s;
  }
  o.sort_keys = arg_true(b.get(3), false);
  return Value::string(to_json(v, o));
}
Value f_trim(Interpreter&, const Value& v, Args& a) {
  auto b = bind("trim", a, {"chars"});
  return Value::string(str_strip(to_str(v), b.get(0), true, true), v.markup);
}
Value f_unique(Interpreter& in, const Value& v, Args& a) {
  auto b = bind("unique", a, {"case_sensitive", "attribute"});
  bool cs = arg_true(b.get(0), false);
  List out, seen;
  for (auto& x : in.iterate(v)) {
    in.step();
    Value key = case_fold(b.get(1) ? attr_path(in, x, *b.get(1)) : x, cs);
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); });
    if (!dup) {
      seen.push_back(key);
      out.push_back(x);
    }
  }
  return Value::make_list(std::move(out));
}
Value f_wordcount(Interpreter&, const Value& v, Args&) {
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : utf8_decode(to_str(v))) {
    bool w = c == '_' || (c >= '0' && c <= '9') || is_alpha_cp(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_format(Interpreter& in, const Value& v, Args& a);  // below, next to percent_format

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> m = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"count", f_length},
      {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"format", f_format}, {"int", f_int}, {"items", f_items},
      {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower},
      {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
      {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
      {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
      {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
      {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return m;
}

// ---- tests ----
const Value& arg0(const Args& a, const char* test) {
  if (a.pos.empty()) throw TemplateError(std::string("test '") + test + "' needs an argument");
  return a.pos[0];
}
bool t_defined(Interpreter&, const Value& v, Args&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, Args&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, Args&) { return v.is_none(); }
bool t_true(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Bool && v.b; }
bool t_false(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Bool && !v.b; }
bool t_boolean(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Bool; }
bool t_number(Interpreter&, const Value& v, Args&) { return v.is_number(); }
bool t_integer(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Int; }
bool t_float(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Float; }
bool t_string(Interpreter&, const Value& v, Args&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Dict; }
bool t_iterable(Interpreter&, const Value& v, Args&) {
  return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::Undefined;
}
bool t_sequence(Interpreter& in, const Value& v, Args& a) { return t_iterable(in, v, a); }
bool t_callable(Interpreter&, const Value& v, Args&) { return v.kind == Kind::Callable; }
bool t_escaped(Interpreter&, const Value& v, Args&) { return v.is_string() && v.markup; }
bool t_eq(Interpreter&, const Value& v, Args& a) { return equals(v, arg0(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, Args& a) { return !equals(v, arg0(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, Args& a) { return compare(v, arg0(a, "lt")) < 0; }
bool t_le(Interpreter&, const Value& v, Args& a) { return compare(v, arg0(a, "le")) <= 0; }
bool t_gt(Interpreter&, const Value& v, Args& a) { return compare(v, arg0(a, "gt")) > 0; }
bool t_ge(Interpreter&, const Value& v, Args& a) { return compare(v, arg0(a, "ge")) >= 0; }
bool t_in(Interpreter& in, const Value& v, Args& a) { return in.contains(arg0(a, "in"), v); }
bool t_sameas(Interpreter&, const Value& v, Args& a) {
  const Value& o = arg0(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None:
    case Kind::Undefined: return true;
    case Kind::Bool: return v.b == o.b;
    case Kind::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
    case Kind::List: return v.list == o.list;
    case Kind::Dict:
    case Kind::Namespace:
    case Kind::Loop: return v.dict == o.dict;
    case Kind::Callable: return v.fn == o.fn;
    default: return false;
  }
}
bool int_arg(const Value& v, const char* test) {
  if (v.kind != Kind::Int && v.kind != Kind::Bool) {
    if (v.is_undefined()) undefined_error(v);
    throw TemplateError(std::string("test '") + test + "' needs an integer");
  }
  return true;
}
bool t_odd(Interpreter&, const Value& v, Args&) { return int_arg(v, "odd") && (v.i % 2 != 0); }
bool t_even(Interpreter&, const Value& v, Args&) { return int_arg(v, "even") && (v.i % 2 == 0); }
bool t_divisibleby(Interpreter&, const Value& v, Args& a) {
  const Value& d = arg0(a, "divisibleby");
  int_arg(v, "divisibleby");
  int_arg(d, "divisibleby");
  if (d.i == 0) throw TemplateError("integer division or modulo by zero");
  if (d.i == -1) return true;
  return v.i % d.i == 0;
}
bool t_lower(Interpreter&, const Value& v, Args&) {
  std::string s = to_str(v);
  return str_lower(s) == s && str_upper(s) != s;
}
bool t_upper(Interpreter&, const Value& v, Args&) {
  std::string s = to_str(v);
  return str_upper(s) == s && str_lower(s) != s;
}
bool t_filter(Interpreter&, const Value& v, Args&) { return v.is_string() && find_filter(v.s) != nullptr; }
bool t_test(Interpreter&, const Value& v, Args&) { return v.is_string() && find_test(v.s) != nullptr; }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"true", t_true},
      {"false", t_false}, {"boolean", t_boolean}, {"number", t_number}, {"integer", t_integer},
      {"float", t_float}, {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable}, {"escaped", t_escaped}, {"eq", t_eq},
      {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt},
      {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt},
      {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"odd", t_odd}, {"even", t_even},
      {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper}, {"filter", t_filter},
      {"test", t_test},
  };
  return m;
}

// ---- globals ----
Value g_range(Interpreter& in, Args& a) {
  if (!a.kw.empty()) throw TemplateError("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) throw TemplateError("range expected 1 to 3 arguments");
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = need_int(&a.pos[0], "range() argument");
  } else {
    start = need_int(&a.pos[0], "range() argument");
    stop = need_int(&a.pos[1], "range() argument");
    if (a.pos.size() == 3) step = need_int(&a.pos[2], "range() argument");
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 astep = step > 0 ? step : -static_cast<__int128>(step);
  __int128 n = span <= 0 ? 0 : (span + astep - 1) / astep;
  if (n > static_cast<__int128>(in.options().limits.max_items))
    throw TemplateError("sandbox: range() of " + std::to_string(static_cast<long long>(n > INT64_MAX ? INT64_MAX : n)) +
                        " items exceeds the limit of " + std::to_string(in.options().limits.max_items));
  List out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) out.push_back(Value::integer(start + k * step));
  return Value::make_list(std::move(out));
}
Value g_namespace(Interpreter& in, Args& a) {
  Value ns = in.new_namespace();
  if (a.pos.size() > 1) throw TemplateError("namespace() takes at most one positional argument");
  if (!a.pos.empty()) {
    if (a.pos[0].kind != Kind::Dict) throw TemplateError("namespace() positional argument must be a mapping");
    for (auto& [k, v] : a.pos[0].dict->items()) ns.dict->set(k, v);
  }
  for (auto& [k, v] : a.kw) ns.dict->set(k, v);
  return ns;
}
Value g_dict(Interpreter&, Args& a) {
  Dict d;
  if (a.pos.size() > 1) throw TemplateError("dict expected at most 1 argument");
  if (!a.pos.empty()) {
    if (a.pos[0].kind != Kind::Dict) throw TemplateError("dict() positional argument must be a mapping");
    for (auto& [k, v] : a.pos[0].dict->items()) d.set(k, v);
  }
  for (auto& [k, v] : a.kw) d.set(k, v);
  return Value::make_dict(std::move(d));
}
Value g_raise_exception(Interpreter&, Args& a) {
  std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
  throw TemplateError("raise_exception: " + msg);
}
Value g_strftime_now(Interpreter& in, Args& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) throw TemplateError("strftime_now() takes one format string");
  const std::string& fmt = a.pos[0].s;
  if (fmt.size() > 256) throw TemplateError("strftime_now: format too long");
  std::optional<int64_t> fixed = in.options().now_unix;
  if (!fixed)
    if (const char* env = std::getenv("STRATA_TEMPLATE_NOW"); env && *env) fixed = std::strtoll(env, nullptr, 10);
  std::tm tm{};
  if (fixed) {
    std::time_t t = static_cast<std::time_t>(*fixed);
    gmtime_r(&t, &tm);
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  if (fmt.empty()) return Value::string("");
  char buf[4096];
  size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
  if (n == 0) throw TemplateError("strftime_now: format produced no output or was too long");
  return Value::string(std::string(buf, n));
}

Value make_builtin(const char* name, Value (*fn)(Interpreter&, Args&)) {
  auto c = std::make_shared<Callable>();
  c->type = Callable::Type::Builtin;
  c->name = name;
  c->builtin = fn;
  return Value::callable(c);
}

// ---- methods ----
bool str_startswith(const std::string& s, const Value& p, bool ends) {
  auto one = [&](const Value& x) {
    std::string t = need_str(&x, ends ? "endswith argument" : "startswith argument");
    if (t.size() > s.size()) return false;
    return ends ? s.compare(s.size() - t.size(), t.size(), t) == 0 : s.compare(0, t.size(), t) == 0;
  };
  if (p.is_list() && p.tuple) {
    for (auto& x : p.items())
      if (one(x)) return true;
    return false;
  }
  return one(p);
}

// %-formatting of one value for one conversion (flags, width, precision already parsed).
std::string format_one(Interpreter& in, char conv, const std::string& flags, int width, int prec, const Value& v) {
  std::string body;
  auto num_spec = [&](const char* len, char c) {
    std::string f = "%" + flags;
    if (width >= 0) f += std::to_string(width);
    if (prec >= 0) f += "." + std::to_string(prec);
    return f + len + c;
  };
  switch (conv) {
    case 's':
    case 'r':
    case 'a': {
      body = conv == 's' ? to_str(v) : repr(v);
      if (prec >= 0) {
        auto cps = utf8_decode(body);
        if (static_cast<size_t>(prec) < cps.size()) body = utf8_encode(cps, 0, prec);
      }
      int64_t len = static_cast<int64_t>(utf8_length(body));
      if (width > len) {
        std::string pad(static_cast<size_t>(width - len), ' ');
        body = flags.find('-') != std::string::npos ? body + pad : pad + body;
      }
      return body;
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': {
      if (v.is_undefined()) undefined_error(v);
      int64_t x;
      if (v.kind == Kind::Int || v.kind == Kind::Bool) x = v.i;
      else if (v.kind == Kind::Float && std::isfinite(v.f) && std::fabs(v.f) < 9.2e18) x = static_cast<int64_t>(v.f);
      else throw TemplateError(std::string("%") + conv + " format: a number is required, not " + type_name(v));
      char buf[512];
      char c = conv == 'i' || conv == 'u' ? 'd' : conv;
      if (x < 0 && c != 'd') {  // Python prints -ff, not the two's complement
        if (x == INT64_MIN) throw TemplateError("integer overflow in format");
        std::snprintf(buf, sizeof buf, (std::string("%ll") + c).c_str(), static_cast<long long>(-x));
        std::string r = std::string("-") + buf;
        if (width > static_cast<int>(r.size()))
          r = flags.find('-') != std::string::npos ? r + std::string(width - r.size(), ' ')
                                                   : std::string(width - r.size(), ' ') + r;
        return r;
      }
      std::snprintf(buf, sizeof buf, num_spec("ll", c).c_str(), static_cast<long long>(x));
      return buf;
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G': {
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) throw TemplateError(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
      double x = v.kind == Kind::Float ? v.f : static_cast<double>(v.i);
      char buf[512];
      std::snprintf(buf, sizeof buf, num_spec("", conv).c_str(), x);
      return buf;
    }
    case 'c': {
      if (v.is_string() && utf8_length(v.s) == 1) return v.s;
      if (v.kind == Kind::Int && v.i >= 0 && v.i <= 0x10FFFF && !(v.i >= 0xD800 && v.i <= 0xDFFF)) {
        std::string out;
        utf8_append(out, static_cast<uint32_t>(v.i));
        return out;
      }
      throw TemplateError("%c requires an int or a single character");
    }
    default: throw TemplateError(std::string("unsupported format character '") + conv + "'");
  }
  (void)in;
}

}  // namespace

// Python's printf-style `fmt % args` (args: a tuple, a mapping for %(name)s, or one value).
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  bool mapping = args.kind == Kind::Dict;
  if (args.is_list() && args.tuple)
    pos = args.items();
  else
    pos.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) throw TemplateError("incomplete format");
    const Value* arg = nullptr;
    if (fmt[k] == '(') {
      size_t e = fmt.find(')', k);
      if (e == std::string::npos) throw TemplateError("incomplete format key");
      if (!mapping) throw TemplateError("format requires a mapping");
      const Value* v = args.dict->find(fmt.substr(k + 1, e - k - 1));
      if (!v) throw TemplateError("KeyError: " + py_str_repr(fmt.substr(k + 1, e - k - 1)));
      arg = v;
      used_mapping = true;
      k = e + 1;
    }
    std::string flags;
    while (k < fmt.size() && std::string_view("-+ #0").find(fmt[k]) != std::string_view::npos) flags += fmt[k++];
    auto number = [&]() -> int {
      int n = -1;
      if (k < fmt.size() && fmt[k] == '*') throw TemplateError("'*' width in format is not supported");
      while (k < fmt.size() && isdigit(static_cast<unsigned char>(fmt[k]))) {
        n = (n < 0 ? 0 : n) * 10 + (fmt[k++] - '0');
        if (n > 10000) throw TemplateError("format width too large");
      }
      return n;
    };
    int width = number();
    int prec = -1;
    if (k < fmt.size() && fmt[k] == '.') {
      ++k;
      prec = std::max(0, number());
    }
    while (k < fmt.size() && (fmt[k] == 'l' || fmt[k] == 'h' || fmt[k] == 'L')) ++k;
    if (k >= fmt.size()) throw TemplateError("incomplete format");
    char conv = fmt[k];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (mapping && !used_mapping && pos.size() == 1 && next == 0) {
        arg = &pos[0];
        ++next;
      } else {
        if (next >= pos.size()) throw TemplateError("not enough arguments for format string");
        arg = &pos[next++];
      }
    }
    out += format_one(in, conv, flags, width, prec, *arg);
    in.check_string(out.size());
  }
  if (!mapping && next < pos.size()) throw TemplateError("not all arguments converted during string formatting");
  return out;
}

namespace {
Value f_format(Interpreter& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) throw TemplateError("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Dict d;
    for (auto& [k, x] : a.kw) d.set(k, x);
    return Value::string(percent_format(in, to_str(v), Value::make_dict(std::move(d))));
  }
  return Value::string(percent_format(in, to_str(v), Value::make_list(a.pos, true)));
}
}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}
TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

MethodKind method_kind(const Value& self, const std::string& name) {
  static const std::unordered_map<std::string, int> str_methods = {
      {"strip", 0}, {"lstrip", 0}, {"rstrip", 0}, {"split", 0}, {"rsplit", 0}, {"splitlines", 0},
      {"startswith", 0}, {"endswith", 0}, {"upper", 0}, {"lower", 0}, {"title", 0}, {"capitalize", 0},
      {"replace", 0}, {"find", 0}, {"rfind", 0}, {"index", 0}, {"count", 0}, {"join", 0}, {"isdigit", 0},
      {"isalpha", 0}, {"isalnum", 0}, {"isspace", 0}, {"islower", 0}, {"isupper", 0}, {"format", 0}};
  switch (self.kind) {
    case Kind::String: return str_methods.count(name) ? MethodKind::Safe : MethodKind::None;
    case Kind::Dict:
      if (name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy") return MethodKind::Safe;
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
        return MethodKind::Unsafe;
      return MethodKind::None;
    case Kind::List:
      if (name == "index" || name == "count" || (name == "copy" && !self.tuple)) return MethodKind::Safe;
      if (!self.tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                          name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return MethodKind::Unsafe;
      return MethodKind::None;
    case Kind::Loop: return name == "cycle" ? MethodKind::Safe : MethodKind::None;
    default: return MethodKind::None;
  }
}

Value call_method(Interpreter& in, const Value& self, const std::string& name, Args& a) {
  if (self.kind == Kind::String) {
    const std::string& s = self.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      auto b = bind(name.c_str(), a, {"chars"});
      return Value::string(str_strip(s, b.get(0), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      auto b = bind(name.c_str(), a, {"sep", "maxsplit"});
      int64_t maxsplit = b.get(1) ? need_int(b.get(1), "maxsplit") : -1;
      return Value::make_list(str_split(in, s, b.get(0), maxsplit, name == "rsplit"));
    }
    if (name == "splitlines") {
      auto b = bind(name.c_str(), a, {"keepends"});
      bool keep = arg_true(b.get(0), false);
      List out;
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find_first_of("\n\r", p);
        if (q == std::string::npos) {
          out.push_back(Value::string(s.substr(p)));
          break;
        }
        size_t e = q + ((s[q] == '\r' && q + 1 < s.size() && s[q + 1] == '\n') ? 2 : 1);
        out.push_back(Value::string(s.substr(p, (keep ? e : q) - p)));
        p = e;
      }
      return Value::make_list(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
      if (a.pos.size() != 1 || !a.kw.empty()) throw TemplateError(name + "() takes exactly one argument here");
      return Value::boolean(str_startswith(s, a.pos[0], name == "endswith"));
    }
    if (name == "upper") return Value::string(str_upper(s));
    if (name == "lower") return Value::string(str_lower(s));
    if (name == "title") return Value::string(str_title(s));
    if (name == "capitalize") return Value::string(str_capitalize(s));
    if (name == "replace") {
      auto b = bind("replace", a, {"old", "new", "count"});
      if (!b.get(0) || !b.get(1)) throw TemplateError("replace() requires old and new");
      int64_t count = b.get(2) ? need_int(b.get(2), "count") : -1;
      return Value::string(str_replace(in, s, need_str(b.get(0), "old"), need_str(b.get(1), "new"), count));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      if (a.pos.size() != 1 || !a.kw.empty()) throw TemplateError(name + "() takes exactly one argument here");
      std::string sub = need_str(&a.pos[0], "substring");
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") throw TemplateError("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, p));
    }
    if (name == "join") {
      if (a.pos.size() != 1) throw TemplateError("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (auto& x : in.iterate(a.pos[0])) {
        if (!x.is_string()) throw TemplateError("sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s;
        first = false;
        out += x.s;
        in.check_string(out.size());
      }
      return Value::string(std::move(out));
    }
    if (name == "format") throw TemplateError("str.format() is not supported in the template sandbox");
    auto all = [&](auto pred) {
      auto cps = utf8_decode(s);
      return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
    };
    if (name == "isdigit") return all([](uint32_t c) { return c >= '0' && c <= '9'; });
    if (name == "isalpha") return all(is_alpha_cp);
    if (name == "isalnum") return all([](uint32_t c) { return is_alpha_cp(c) || (c >= '0' && c <= '9'); });
    if (name == "isspace") return all(py_isspace);
    if (name == "islower") return Value::boolean(str_lower(s) == s && str_upper(s) != s);
    if (name == "isupper") return Value::boolean(str_upper(s) == s && str_lower(s) != s);
  } else if (self.kind == Kind::Dict) {
    if (name == "get") {
      if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty()) throw TemplateError("get expected 1 or 2 arguments");
      const Value* v = a.pos[0].is_string() ? self.dict->find(a.pos[0].s) : nullptr;
      return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
    }
    if (!a.pos.empty() || !a.kw.empty()) throw TemplateError(name + "() takes no arguments");
    if (name == "copy") return Value::make_dict(std::make_shared<Dict>(*self.dict));
    List out;
    for (auto& [k, v] : self.dict->items()) {
      if (name == "items")
        out.push_back(Value::make_list({Value::string(k), v}, true));
      else if (name == "keys")
        out.push_back(Value::string(k));
      else
        out.push_back(v);
    }
    return Value::make_list(std::move(out));
  } else if (self.kind == Kind::List) {
    if (name == "copy") return Value::make_list(self.items());
    if (a.pos.size() != 1 || !a.kw.empty()) throw TemplateError(name + "() takes exactly one argument");
    const auto& xs = self.items();
    if (name == "count")
      return Value::integer(std::count_if(xs.begin(), xs.end(), [&](const Value& x) { return equals(x, a.pos[0]); }));
    for (size_t k = 0; k < xs.size(); ++k)
      if (equals(xs[k], a.pos[0])) return Value::integer(static_cast<int64_t>(k));
    throw TemplateError(repr(a.pos[0]) + " is not in list");
  } else if (self.kind == Kind::Loop && name == "cycle") {
    if (a.pos.empty()) throw TemplateError("no items for cycling given");
    int64_t i0 = self.dict->find("index0")->i;
    return a.pos[static_cast<size_t>(i0) % a.pos.size()];
  }
  if (method_kind(self, name) == MethodKind::Unsafe)
    throw TemplateError("sandbox: access to attribute '" + name + "' of '" + type_name(self) + "' object is unsafe");
  throw TemplateError("'" + type_name(self) + "' object has no method '" + name + "'");
}

void install_globals(Dict& g) {
  g.set("range", make_builtin("range", g_range));
  g.set("namespace", make_builtin("namespace", g_namespace));
  g.set("dict", make_builtin("dict", g_dict));
  g.set("raise_exception", make_builtin("raise_exception", g_raise_exception));
  g.set("strftime_now", make_builtin("strftime_now", g_strftime_now));
}

}  // namespace strata::jinja
