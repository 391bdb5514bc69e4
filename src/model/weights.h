#pragma once
// A weight tensor as the forward pass sees it, and the loader that checks each one's name, shape and
// type against what the architecture expects, with errors that say what was expected and found.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace strata {

struct Weight {
  const gguf::TensorInfo* info = nullptr;  // nullptr: absent (optional tensor)
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;           // into the mapping
  int64_t ne[4] = {1, 1, 1, 1};            // fastest-varying first, as in GGUF
  explicit operator bool() const { return info != nullptr; }
  int64_t row_bytes() const { return static_cast<int64_t>(strata::row_bytes(type, ne[0])); }
  // Matrix i of a 3-D stack ([ne0][ne1][ne2]: ne2 matrices of ne1 rows): e.g. expert i.
  const uint8_t* matrix(int64_t i) const { return data + i * ne[1] * row_bytes(); }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
};

class WeightLoader {
 public:
  explicit WeightLoader(const gguf::File& f) : f_(f) {}
  // A matrix (or stack of matrices) used by matmul: any ggml type whose block divides ne[0].
  Weight matrix(const std::string& name, std::initializer_list<int64_t> shape) const;
  // A vector of f32 values (norm weights, biases).
  Weight f32(const std::string& name, std::initializer_list<int64_t> shape) const;
  // As matrix(), but an absent tensor gives an empty Weight.
  Weight optional_matrix(const std::string& name, std::initializer_list<int64_t> shape) const;
  // Number of tensors the loader has handed out (to spot unused ones).
  size_t used() const { return used_; }

 private:
  Weight get(const std::string& name, std::initializer_list<int64_t> shape, bool f32_only) const;
  const gguf::File& f_;
  mutable size_t used_ = 0;
};

std::string shape_str(const int64_t* ne, int n);

}  // namespace strata
