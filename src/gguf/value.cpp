// Metadata values: type names and the typed accessors (get, get_array) with errors that name the
// key, the expected type and the type found.
#include <fmt/format.h>

#include "gguf/gguf.h"
#include "gguf/parse.h"

namespace strata::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "u8";
    case ValueType::INT8: return "i8";
    case ValueType::UINT16: return "u16";
    case ValueType::INT16: return "i16";
    case ValueType::UINT32: return "u32";
    case ValueType::INT32: return "i32";
    case ValueType::FLOAT32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "u64";
    case ValueType::INT64: return "i64";
    case ValueType::FLOAT64: return "f64";
  }
  return "unknown";
}

std::string describe_type(const Value& v) {
  if (v.type != ValueType::ARRAY) return std::string(value_type_name(v.type));
  if (v.elem_type == ValueType::ARRAY && !v.arr.empty()) return "array of " + describe_type(v.arr.front());
  return fmt::format("array of {}", value_type_name(v.elem_type));
}

namespace detail {
std::string quoted(std::string_view s) {
  constexpr size_t kMax = 96;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'') out += static_cast<char>(ch);
    else out += fmt::format("\\x{:02x}", ch);
  }
  if (s.size() > kMax) out += fmt::format("...' ({} bytes)", s.size());
  else out += "'";
  return out;
}
}  // namespace detail

namespace {

using detail::value_type_of;

// v.type is value_type_of<T>() (callers check).
template <typename T>
T unpack(const Value& v) {
  if constexpr (std::is_same_v<T, std::string>) return v.str;
  else if constexpr (std::is_same_v<T, bool>) return v.num.b;
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(v.num.f);
  else if constexpr (std::is_signed_v<T>) return static_cast<T>(v.num.i);
  else return static_cast<T>(v.num.u);
}

}  // namespace

template <typename T>
T File::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw FormatError(fmt::format("{}: missing metadata key {} (expected {})", path(), detail::quoted(key),
                                        value_type_name(value_type_of<T>())));
  if (v->type != value_type_of<T>())
    throw FormatError(fmt::format("{}: metadata key {}: expected {}, found {}", path(), detail::quoted(key),
                                  value_type_name(value_type_of<T>()), describe_type(*v)));
  return unpack<T>(*v);
}

template <typename T>
std::vector<T> File::get_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v)
    throw FormatError(fmt::format("{}: missing metadata key {} (expected array of {})", path(), detail::quoted(key),
                                  value_type_name(value_type_of<T>())));
  if (v->type != ValueType::ARRAY || v->elem_type != value_type_of<T>())
    throw FormatError(fmt::format("{}: metadata key {}: expected array of {}, found {}", path(),
                                  detail::quoted(key), value_type_name(value_type_of<T>()), describe_type(*v)));
  std::vector<T> out;
  out.reserve(v->arr.size());
  for (const Value& e : v->arr) out.push_back(unpack<T>(e));
  return out;
}

#define STRATA_GGUF_INSTANTIATE(T)                              \
  template T File::get<T>(std::string_view) const;              \
  template std::vector<T> File::get_array<T>(std::string_view) const;
STRATA_GGUF_INSTANTIATE(uint8_t)
STRATA_GGUF_INSTANTIATE(int8_t)
STRATA_GGUF_INSTANTIATE(uint16_t)
STRATA_GGUF_INSTANTIATE(int16_t)
STRATA_GGUF_INSTANTIATE(uint32_t)
STRATA_GGUF_INSTANTIATE(int32_t)
STRATA_GGUF_INSTANTIATE(uint64_t)
STRATA_GGUF_INSTANTIATE(int64_t)
STRATA_GGUF_INSTANTIATE(float)
STRATA_GGUF_INSTANTIATE(double)
STRATA_GGUF_INSTANTIATE(bool)
STRATA_GGUF_INSTANTIATE(std::string)
#undef STRATA_GGUF_INSTANTIATE

}  // namespace strata::gguf
