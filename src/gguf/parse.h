#pragma once
// Internal to src/gguf: the byte cursor the reader parses untrusted GGUF images with. Every read is
// bounds-checked against the image size; a failure throws gguf::FormatError "<file>: offset N: what".
#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "gguf/gguf.h"

namespace strata::gguf::detail {

// The GGUF value type that stores a C++ T (reader accessors and writer share it).
template <typename T> constexpr ValueType value_type_of();
template <> constexpr ValueType value_type_of<uint8_t>() { return ValueType::UINT8; }
template <> constexpr ValueType value_type_of<int8_t>() { return ValueType::INT8; }
template <> constexpr ValueType value_type_of<uint16_t>() { return ValueType::UINT16; }
template <> constexpr ValueType value_type_of<int16_t>() { return ValueType::INT16; }
template <> constexpr ValueType value_type_of<uint32_t>() { return ValueType::UINT32; }
template <> constexpr ValueType value_type_of<int32_t>() { return ValueType::INT32; }
template <> constexpr ValueType value_type_of<uint64_t>() { return ValueType::UINT64; }
template <> constexpr ValueType value_type_of<int64_t>() { return ValueType::INT64; }
template <> constexpr ValueType value_type_of<float>() { return ValueType::FLOAT32; }
template <> constexpr ValueType value_type_of<double>() { return ValueType::FLOAT64; }
template <> constexpr ValueType value_type_of<bool>() { return ValueType::BOOL; }
template <> constexpr ValueType value_type_of<std::string>() { return ValueType::STRING; }

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

// Untrusted text (keys, tensor names) quoted for an error message: printable ASCII kept, the rest
// escaped, long strings cut so one message stays one readable line.
std::string quoted(std::string_view s);

class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t left() const { return size_ - pos_; }
  const std::string& name() const { return name_; }

  template <typename... Args>
  [[noreturn]] void fail_at(uint64_t off, fmt::format_string<Args...> f, Args&&... args) const {
    throw FormatError(fmt::format("{}: offset {}: {}", name_, off,
                                  fmt::format(f, std::forward<Args>(args)...)));
  }

  // Throws unless `n` more bytes are present; `what` names what was being read.
  void need(uint64_t n, std::string_view what) const {
    if (n > left())
      fail_at(pos_, "truncated file: {} needs {} bytes but only {} remain (file is {} bytes)", what, n,
              left(), size_);
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // GGUF string: u64 length, then that many bytes (no terminator). The length is checked against the
  // bytes left before anything is allocated.
  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > left())
      fail_at(at, "{}: string length {} runs past the end of the file ({} bytes remain)", what, len, left());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

}  // namespace strata::gguf::detail
