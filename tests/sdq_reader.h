#pragma once
// Reader of the fixtures' SDQ2 files (ggml's dequantized values, fixtures/README.md) for the tests.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"

namespace strata::test {

struct SdqTensor {
  uint32_t type = 0;
  std::vector<uint64_t> dims;
  double sum = 0, sum_sq = 0;
  std::vector<float> head;
};

// SDQ2: "SDQ2" u32 n; per tensor: u32 name_len, name, u32 type, u32 n_dims, u64 dims[], f64 sum,
// f64 sum_sq, u32 n_head, f32 head[n_head].
inline std::map<std::string, SdqTensor> read_sdq(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path);
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t off = 0;
  auto take = [&](void* dst, size_t n) {
    if (off + n > b.size() || off + n < off) throw Error(path + ": truncated");
    std::memcpy(dst, b.data() + off, n);
    off += n;
  };
  auto u32 = [&] { uint32_t v; take(&v, 4); return v; };
  char magic[4];
  take(magic, 4);
  if (std::memcmp(magic, "SDQ2", 4) != 0) throw Error(path + ": not SDQ2");
  std::map<std::string, SdqTensor> out;
  for (uint32_t i = 0, n = u32(); i < n; ++i) {
    std::string name(u32(), '\0');
    take(name.data(), name.size());
    SdqTensor t;
    t.type = u32();
    t.dims.resize(u32());
    for (auto& d : t.dims) take(&d, 8);
    take(&t.sum, 8);
    take(&t.sum_sq, 8);
    t.head.resize(u32());
    take(t.head.data(), t.head.size() * 4);
    out[name] = std::move(t);
  }
  if (off != b.size()) throw Error(path + ": trailing bytes");
  return out;
}

}  // namespace strata::test
