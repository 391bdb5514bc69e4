#pragma once
// GGUF reader (v2, v3): mmaps the file and validates everything before use. Every count and size
// from the file is untrusted: checked for overflow and bounded by the file size before any allocation.
// A bad file throws gguf::FormatError naming the file, the byte offset and what is wrong.
//
// Contract used across strata (other modules code against exactly this; extend, don't change):
//   auto f = gguf::File::open(path);
//   f.get<uint32_t>("qwen3moe.block_count")     // throws if missing or of another type
//   f.get_or<float>("x.eps", 1e-6f)             // default when missing (throws on a wrong type)
//   f.get_array<std::string>("tokenizer.ggml.tokens"), f.get_array<int32_t>(...), f.get_array<float>(...)
//   const TensorInfo* t = f.find_tensor("blk.0.attn_q.weight");  t->data points into the mapping
// A File is immutable after open: const methods are safe to call from many threads at once.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "quant/types.h"

namespace strata::gguf {

class FormatError : public Error {
 public:
  using Error::Error;
};

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Scalars are stored widened; strings as std::string; arrays as a vector of
// Values of one element type (nested arrays allowed, bounded in depth and total size).
struct Value {
  ValueType type = ValueType::UINT8;
  union {
    uint64_t u;
    int64_t i;
    double f;
    bool b;
  } num{};
  std::string str;                 // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY: element type
  std::vector<Value> arr;          // ARRAY
};

// Arrays of arrays nest at most this deep (a deeper file is rejected, as a nesting bomb).
inline constexpr int kMaxArrayDepth = 8;

// "u32", "string", "array of string", "array of array of i32": for messages and `strata inspect`.
std::string describe_type(const Value& v);

struct KeyValue {
  std::string key;
  Value value;
  uint64_t offset;  // byte offset of the key in the file (for error messages)
};

struct TensorInfo {
  std::string name;
  GgmlType type;
  uint32_t n_dims;               // 1..4
  uint64_t ne[4];                // dims, fastest-varying first (ne[0] = row length); unused dims = 1
  uint64_t offset;               // relative to the start of the data section
  uint64_t nbytes;               // validated: inside the file
  const uint8_t* data;           // points into the mapping
  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

class File {
 public:
  static File open(const std::string& path);          // mmap + parse + validate
  // Parses an in-memory image (fuzzing, tests). The bytes must outlive the File.
  static File from_memory(const uint8_t* data, size_t size, std::string name = "<memory>");
  // Same, owning the bytes (e.g. a file made by gguf::Writer::to_bytes() in a test).
  static File from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t file_size() const;
  uint64_t data_offset() const;                       // start of the tensor data section

  const std::vector<KeyValue>& metadata() const;
  const Value* find(std::string_view key) const;      // nullptr when missing
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // T: uint8_t..int64_t, float, double, bool, std::string. Integer types convert between each other
  // only when the stored type is exactly T (as llama.cpp does); a mismatch throws naming key,
  // expected and found type.
  template <typename T> T get(std::string_view key) const;
  template <typename T> T get_or(std::string_view key, T def) const {
    return has(key) ? get<T>(key) : def;
  }
  // Array of scalars or strings; element type must match T.
  template <typename T> std::vector<T> get_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when missing
  const TensorInfo& tensor(std::string_view name) const;       // throws when missing

 private:
  File();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::gguf
