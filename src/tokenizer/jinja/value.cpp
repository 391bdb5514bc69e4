// Python semantics of sandbox values: truthiness, str/repr, ==, <, json.dumps.
#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/callable.h"
#include "tokenizer/utf8_decode.h"

namespace strata::jinja {

// ---- construction ----
Value Value::undefined(std::string hint) {
  Value v;
  v.kind = Kind::Undefined;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  v.i = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x, bool markup) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(x);
  v.markup = markup;
  return v;
}
static uint16_t nested_depth(const Value& x) {
  return x.kind == Kind::List || x.kind == Kind::Dict ? x.depth : 0;
}
static uint16_t container_depth(uint16_t max_child) {
  if (max_child >= kMaxValueDepth)
    throw TemplateError("value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  return static_cast<uint16_t>(max_child + 1);
}

Value Value::make_list(List items, bool tuple) {
  Value v;
  uint16_t d = 0;
  for (auto& x : items) d = std::max(d, nested_depth(x));
  v.depth = container_depth(d);
  v.kind = Kind::List;
  v.list = std::make_shared<const List>(std::move(items));
  v.tuple = tuple;
  return v;
}
Value Value::make_dict(std::shared_ptr<Dict> d) {
  Value v;
  uint16_t md = 0;
  for (auto& kv : d->items()) md = std::max(md, nested_depth(kv.second));
  v.depth = container_depth(md);
  v.kind = Kind::Dict;
  v.dict = std::move(d);
  return v;
}
Value Value::make_dict(Dict d) { return make_dict(std::make_shared<Dict>(std::move(d))); }
Value Value::callable(std::shared_ptr<const Callable> c) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::move(c);
  return v;
}
const List& Value::items() const {
  static const List empty;
  return list ? *list : empty;
}

// ---- Dict ----
const Value* Dict::find(std::string_view key) const {
  if (items_.size() <= 8) {
    for (auto& [k, v] : items_)
      if (k == key) return &v;
    return nullptr;
  }
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}
void Dict::set(const std::string& key, Value v) {
  if (items_.size() <= 8) {
    for (auto& [k, old] : items_)
      if (k == key) {
        old = std::move(v);
        return;
      }
  } else if (auto it = index_.find(key); it != index_.end()) {
    items_[it->second].second = std::move(v);
    return;
  }
  items_.emplace_back(key, std::move(v));
  if (items_.size() == 9)
    for (size_t i = 0; i < items_.size(); ++i) index_[items_[i].first] = i;
  else if (items_.size() > 9)
    index_[key] = items_.size() - 1;
}

// ---- UTF-8 ---- (one decoder for the project: tokenizer/utf8_decode.h)
bool utf8_valid(std::string_view s) { return tokenizer::is_valid_utf8(s); }

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const tokenizer::Utf8Step st = tokenizer::utf8_step(p + i, s.size() - i);
    // Values are valid UTF-8 (checked where strings enter); a stray byte would pass through as itself.
    out.push_back(st.kind == tokenizer::Utf8Step::kValid ? st.codepoint : p[i]);
    i += st.kind == tokenizer::Utf8Step::kValid ? st.len : 1;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) { tokenizer::append_utf8(out, cp); }

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) utf8_append(out, cps[k]);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<uint8_t>(c) & 0xC0) != 0x80) ++n;
  return n;
}

bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// ---- truthiness, names ----
bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0.0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return !v.items().empty();
    case Kind::Dict: return v.dict && v.dict->size() > 0;
    default: return true;
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.markup ? "Markup" : "str";
    case Kind::List: return v.tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Callable: return v.fn && v.fn->type == Callable::Type::Macro ? "Macro" : "function";
    case Kind::Namespace: return "Namespace";
    case Kind::Loop: return "LoopContext";
  }
  return "object";
}

// ---- str / repr ----
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  std::string sign;
  size_t p = 0;
  if (sci[0] == '-') sign = "-", p = 1;
  size_t epos = sci.find('e');
  std::string digits;
  for (size_t k = p; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  int e = std::stoi(sci.substr(epos + 1));
  std::string out = sign;
  if (e >= -4 && e < 16) {
    if (e >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), e + 1));
      while (ip.size() < static_cast<size_t>(e + 1)) ip += '0';
      std::string fp = digits.size() > static_cast<size_t>(e + 1) ? digits.substr(e + 1) : "0";
      out += ip + "." + fp;
    } else {
      out += "0." + std::string(-e - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += eb;
  }
  return out;
}

static bool py_printable(uint32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD) return false;
  if ((c >= 0x2028 && c <= 0x202F) || (c >= 0x200B && c <= 0x200F) || (c >= 0x2060 && c <= 0x206F))
    return false;
  if (c == 0x3000 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF)) return false;
  if ((c >= 0x2000 && c <= 0x200A) || c == 0x1680 || c == 0x205F) return false;
  return true;
}

std::string py_str_repr(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : utf8_decode(s)) {
    if (c == static_cast<uint32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!py_printable(c)) {
      char b[16];
      if (c < 0x100)
        std::snprintf(b, sizeof b, "\\x%02x", c);
      else if (c < 0x10000)
        std::snprintf(b, sizeof b, "\\u%04x", c);
      else
        std::snprintf(b, sizeof b, "\\U%08x", c);
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

static void repr_into(std::string& out, const Value& v, int depth);

static void str_into(std::string& out, const Value& v, int depth) {
  switch (v.kind) {
    case Kind::Undefined: return;
    case Kind::String: out += v.s; return;
    default: repr_into(out, v, depth);
  }
}

static void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > 300) throw TemplateError("value nested too deeply to print");
  switch (v.kind) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.b ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float: out += py_float_repr(v.f); return;
    case Kind::String:
      if (v.markup) out += "Markup(";
      out += py_str_repr(v.s);
      if (v.markup) out += ")";
      return;
    case Kind::List: {
      out += v.tuple ? '(' : '[';
      bool first = true;
      for (auto& x : v.items()) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, x, depth + 1);
      }
      if (v.tuple && v.items().size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      if (v.kind == Kind::Namespace) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (auto& [k, x] : v.dict->items()) {
        if (!first) out += ", ";
        first = false;
        out += py_str_repr(k);
        out += ": ";
        repr_into(out, x, depth + 1);
      }
      out += '}';
      if (v.kind == Kind::Namespace) out += '>';
      return;
    }
    case Kind::Loop: {
      const Value* idx = v.dict->find("index");
      const Value* len = v.dict->find("length");
      out += "<LoopContext " + std::to_string(idx ? idx->i : 0) + "/" + std::to_string(len ? len->i : 0) + ">";
      return;
    }
    case Kind::Callable:
      if (v.fn->type == Callable::Type::Macro)
        out += "<Macro '" + v.fn->name + "'>";
      else
        out += "<built-in function " + v.fn->name + ">";
      return;
  }
}

std::string to_str(const Value& v) {
  std::string out;
  str_into(out, v, 0);
  return out;
}
std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

// ---- comparison ----
static bool num_eq(const Value& a, const Value& b) {
  if (a.kind == Kind::Float || b.kind == Kind::Float) {
    double x = a.kind == Kind::Float ? a.f : static_cast<double>(a.i);
    double y = b.kind == Kind::Float ? b.f : static_cast<double>(b.i);
    return x == y;
  }
  return a.i == b.i;
}

static bool equals_depth(const Value& a, const Value& b, int depth) {
  if (depth > 300) throw TemplateError("values nested too deeply to compare");
  if (a.is_number() && b.is_number()) return num_eq(a, b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List: {
      if (a.tuple != b.tuple) return false;
      auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equals_depth(x[k], y[k], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (auto& [k, v] : a.dict->items()) {
        const Value* o = b.dict->find(k);
        if (!o || !equals_depth(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}
bool equals(const Value& a, const Value& b) { return equals_depth(a, b, 0); }

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = a.kind == Kind::Float ? a.f : static_cast<double>(a.i);
      double y = b.kind == Kind::Float ? b.f : static_cast<double>(b.i);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;  // UTF-8 order = code point order
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    auto &x = a.items(), &y = b.items();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals(x[k], y[k])) continue;
      return compare(x[k], y[k]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    throw TemplateError(a.is_undefined() && !a.s.empty() ? a.s : b.is_undefined() && !b.s.empty() ? b.s
                                                                                                 : "undefined value in a comparison");
  throw TemplateError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// ---- json.dumps ----
static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  auto hex4 = [&](uint32_t c) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", c);
    out += b;
  };
  for (uint32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            uint32_t v = c - 0x10000;
            hex4(0xD800 | (v >> 10));
            hex4(0xDC00 | (v & 0x3FF));
          } else {
            hex4(c);
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

static void json_into(std::string& out, const Value& v, const JsonOptions& o, int level) {
  if (level > 300) throw TemplateError("tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += o.indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(v.f);
      return;
    case Kind::String: json_string(out, v.s, o.ensure_ascii); return;
    case Kind::List: {
      auto& xs = v.items();
      if (xs.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.has_indent) newline(level + 1);
      for (size_t k = 0; k < xs.size(); ++k) {
        if (k) {
          out += o.item_sep;
          if (o.has_indent) newline(level + 1);
        }
        json_into(out, xs[k], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      auto items = v.dict->items();
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += '{';
      if (o.has_indent) newline(level + 1);
      bool first = true;
      for (auto& [k, x] : items) {
        if (!first) {
          out += o.item_sep;
          if (o.has_indent) newline(level + 1);
        }
        first = false;
        json_string(out, k, o.ensure_ascii);
        out += o.key_sep;
        json_into(out, x, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      throw TemplateError("tojson: Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_into(out, v, opt, 0);
  return out;
}

}  // namespace strata::jinja
