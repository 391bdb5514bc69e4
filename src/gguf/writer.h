#pragma once
// GGUF v3 writer for tests and tools (quantize, mkmodel, demo export). Metadata keeps insertion order;
// tensor data is laid out in insertion order, each tensor padded to the alignment (general.alignment,
// default 32), exactly as ggml writes it, so re-writing a llama.cpp file reproduces its bytes.
//
//   gguf::Writer w;
//   w.set("general.architecture", std::string("qwen3moe"));
//   w.set("qwen3moe.block_count", uint32_t{2});
//   w.set_array("tokenizer.ggml.tokens", std::vector<std::string>{...});
//   w.add_tensor("output_norm.weight", GgmlType::F32, {256}, bytes);   // bytes: std::span<const uint8_t>
//   w.write("out.gguf");                                               // or w.to_bytes()
//
// Everything is validated when added (dims 1..4 and non-zero, row length a multiple of the block
// size, byte count matching type and shape, unique names, well-formed values): a bad call throws
// strata::Error, so a writer never produces a file the reader rejects.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gguf/gguf.h"

namespace strata::gguf {

// Value builders. T: uint8_t..int64_t, float, double, bool, std::string.
template <typename T> Value make_value(T v);
template <typename T> Value make_array(const std::vector<T>& v);
// An array whose elements are themselves values of `elem` (e.g. arrays: nested arrays).
Value make_array(ValueType elem, std::vector<Value> elems);

class Writer {
 public:
  Writer() = default;
  // Copies `f`'s metadata and refers to its tensor data (no copy: `f` must outlive the writer's use).
  static Writer from_file(const File& f);

  // Adds a key, or replaces its value in place when the key exists.
  void set_value(const std::string& key, Value v);
  template <typename T> void set(const std::string& key, T v) { set_value(key, make_value<T>(std::move(v))); }
  void set(const std::string& key, const char* s) { set_value(key, make_value<std::string>(s)); }
  template <typename T> void set_array(const std::string& key, const std::vector<T>& v) {
    set_value(key, make_array<T>(v));
  }
  bool remove(const std::string& key);
  const std::vector<KeyValue>& metadata() const { return kv_; }
  void set_alignment(uint32_t a);  // sets general.alignment (a power of two)
  uint64_t alignment() const;

  // dims fastest-varying first (dims[0] = row length), as in GGUF.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                  std::span<const uint8_t> bytes);  // copies the bytes
  void add_tensor_view(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                       const uint8_t* data, uint64_t nbytes);  // no copy: data must outlive write()
  // The bytes are made at write time, one tensor at a time, by `produce` (it must fill all of `out`),
  // so a tool converting a model larger than memory holds one tensor at once.
  using TensorProducer = std::function<void(std::span<uint8_t> out)>;
  void add_tensor_producer(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                           TensorProducer produce);
  size_t n_tensors() const { return tensors_.size(); }

  // Streams the file to `sink` in order; to_bytes() collects it, write() puts it at `path` (through a
  // temporary file renamed into place, so a failed write never leaves a half file under `path`).
  void write_to(const std::function<void(const void* data, size_t n)>& sink) const;
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    const uint8_t* data;             // owned.data() or a caller's buffer
    uint64_t nbytes;
    std::vector<uint8_t> owned;
    TensorProducer produce;          // set for add_tensor_producer
  };
  static uint64_t expected_bytes(GgmlType type, const std::vector<uint64_t>& dims);
  void check_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                    uint64_t nbytes) const;
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string, size_t> key_pos_;  // key -> index in kv_
  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> tensor_names_;
};

}  // namespace strata::gguf
