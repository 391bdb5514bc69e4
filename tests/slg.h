#pragma once
// Reader of the fixtures' SLG1 logits files (../shared/fixtures/README.md) and the distribution
// metrics the model tests use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// How a mean KL over positions is made. A moved top-k in one layer (a routing flip) gives that position
// ~0.1-0.5 on the tiny fixtures; a broken kernel or path moves every position, so the median shows it where
// the mean is decided by a few flips. `big`: positions over kFlipKl, `big_share` their part of the sum.
constexpr double kFlipKl = 0.05;
struct KlShape {
  double mean = 0, median = 0, max = 0, big_share = 0;
  int big = 0;
  size_t n = 0;
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "mean %.2e, median %.2e, %d of %zu positions > %.2f (%.0f%% of the sum), max %.2e",
                  mean, median, big, n, kFlipKl, 100 * big_share, max);
    return b;
  }
};

inline KlShape kl_shape(std::vector<double> kl) {
  KlShape k;
  k.n = kl.size();
  if (kl.empty()) return k;
  std::sort(kl.begin(), kl.end());
  double sum = 0, big_sum = 0;
  for (double v : kl) {
    sum += v;
    if (v > kFlipKl) ++k.big, big_sum += v;
  }
  k.mean = sum / double(kl.size());
  k.median = kl.size() % 2 ? kl[kl.size() / 2] : 0.5 * (kl[kl.size() / 2 - 1] + kl[kl.size() / 2]);
  k.max = kl.back();
  k.big_share = sum > 0 ? big_sum / sum : 0;
  return k;
}

// KL of got's prompt logits against ref's, per position ([n_prompt]; both files of one prompt).
inline std::vector<double> position_kl(const Slg& ref, const Slg& got) {
  if (ref.n_vocab != got.n_vocab || ref.prompt != got.prompt)
    throw std::runtime_error("position_kl: the two logits files are not of one prompt and vocabulary");
  std::vector<double> kl;
  for (uint32_t p = 0; p < ref.n_prompt; ++p)
    kl.push_back(kl_div(&ref.logits[size_t(p) * ref.n_vocab], &got.logits[size_t(p) * ref.n_vocab], ref.n_vocab));
  return kl;
}

inline int32_t argmax(const float* x, size_t n) {
  size_t b = 0;
  for (size_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return int32_t(b);
}

}  // namespace strata::test
