#pragma once
// Values of the Jinja sandbox: Python's data model, reduced to what chat templates use.
// none, bool, int (int64; overflow is an error, not a bigint), float, str (UTF-8, indexed by code
// point like Python), list / tuple, dict (insertion-ordered, string keys), callables (builtins,
// macros, bound methods), namespace(), the loop object, and Undefined (Jinja's default Undefined:
// prints as "", is falsy and iterates as empty; any other use raises).
// Lists and dicts are shared and never mutated after construction (the reference environment is an
// *immutable* sandbox); only namespace objects are mutable, through `{% set ns.x = ... %}`.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"

namespace strata::jinja {

// Every failure while parsing or rendering a template (syntax, undefined use, type errors, sandbox
// limits, raise_exception). The message carries "line L col C" where the position is known.
class TemplateError : public Error {
 public:
  using Error::Error;
};

struct Value;
struct Callable;
class Dict;
using List = std::vector<Value>;

// Lists/dicts may nest at most this deep (printing, comparing and freeing them recurse).
constexpr uint16_t kMaxValueDepth = 256;

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable, Namespace, Loop };

struct Value {
  Kind kind = Kind::Undefined;
  bool markup = false;  // String: a jinja Markup (|safe, |escape)
  bool tuple = false;   // List: a Python tuple (differs from a list in repr and ==)
  bool b = false;
  uint16_t depth = 0;  // List/Dict: nesting depth (bounded: deep values would overflow the stack)
  int64_t i = 0;
  double f = 0;
  std::string s;                   // String; Undefined: the message used when it is misused
  std::shared_ptr<const List> list;  // List
  std::shared_ptr<Dict> dict;      // Dict, Namespace (attributes), Loop (attributes)
  std::shared_ptr<const Callable> fn;

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v, bool markup = false);
  static Value make_list(List items, bool tuple = false);
  static Value make_dict(std::shared_ptr<Dict> d);
  static Value make_dict(Dict d);
  static Value callable(std::shared_ptr<const Callable> c);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  const List& items() const;  // List only
};

// Insertion-ordered string-keyed map (Python dict semantics for str keys).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);  // replaces in place, or appends
  size_t size() const { return items_.size(); }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  void clear() { items_.clear(); index_.clear(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
};

// ---- Python semantics (value.cpp) ----
bool truthy(const Value& v);
std::string type_name(const Value& v);     // Python's type name: 'str', 'dict', 'NoneType', ...
std::string to_str(const Value& v);        // str(v); Undefined -> ""
std::string repr(const Value& v);          // repr(v)
std::string py_float_repr(double d);       // repr(float): '1.0', '1e+20', '1.5e-07'
std::string py_str_repr(std::string_view s);
bool equals(const Value& a, const Value& b);  // Python ==
// Python <, for the orderable pairs (numbers, str, list/tuple); throws TemplateError otherwise.
int compare(const Value& a, const Value& b);

// ---- UTF-8 helpers: Python indexes strings by code point ----
std::vector<uint32_t> utf8_decode(std::string_view s);  // input is valid UTF-8 (checked at entry)
void utf8_append(std::string& out, uint32_t cp);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t utf8_length(std::string_view s);
bool utf8_valid(std::string_view s);
bool py_isspace(uint32_t cp);  // str.isspace() for one code point

// ---- JSON ----
// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson override calls it.
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;            // the indent unit (int n -> n spaces)
  std::string item_sep = ", ";   // ", " without indent, "," with it (Python's defaults)
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);

}  // namespace strata::jinja
