#pragma once
// Reader of the fixtures' SLG1 logits files (../shared/fixtures/README.md) and the distribution
// metrics the model tests use.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::test {

struct Slg {
  uint32_t n_prompt = 0, n_vocab = 0, n_gen = 0;
  std::vector<int32_t> prompt;     // [n_prompt]
  std::vector<float> logits;       // [n_prompt][n_vocab]
  std::vector<int32_t> gen;        // [n_gen]
  std::vector<float> gen_logits;   // [n_gen][n_vocab]
};

inline Slg read_slg(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[4];
  Slg s;
  f.read(magic, 4);
  if (std::memcmp(magic, "SLG1", 4) != 0) throw std::runtime_error("not SLG1: " + path);
  f.read(reinterpret_cast<char*>(&s.n_prompt), 4);
  f.read(reinterpret_cast<char*>(&s.n_vocab), 4);
  f.read(reinterpret_cast<char*>(&s.n_gen), 4);
  auto rd = [&](auto& v, size_t n) {
    v.resize(n);
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(v[0])));
  };
  rd(s.prompt, s.n_prompt);
  rd(s.logits, size_t(s.n_prompt) * s.n_vocab);
  rd(s.gen, s.n_gen);
  rd(s.gen_logits, size_t(s.n_gen) * s.n_vocab);
  if (!f) throw std::runtime_error("truncated SLG1: " + path);
  return s;
}

// KL(softmax(ref) || softmax(got)) in double.
inline double kl_div(const float* ref, const float* got, size_t n) {
  auto lse = [n](const float* x) {
    double m = x[0];
    for (size_t i = 1; i < n; ++i) m = std::max(m, double(x[i]));
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
    return m + std::log(s);
  };
  const double lr = lse(ref), lg = lse(got);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double pr = ref[i] - lr;
    kl += std::exp(pr) * (pr - (got[i] - lg));
  }
  return std::max(kl, 0.0);
}

inline int32_t argmax(const float* x, size_t n) {
  size_t b = 0;
  for (size_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return int32_t(b);
}

}  // namespace strata::test
