#pragma once
// Helpers for the quant tests: random weight rows of any ggml type (random bits everywhere, with the
// half-precision scale fields set to sane values so no inf/nan appears), random activations.
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "quant/blocks.h"
#include "quant/types.h"
#include "quant/vec_dot.h"

namespace strata::test {

// (offset, is_iq1m_split) of each fp16 scale field inside one block of `t`.
inline std::vector<int> fp16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    case GgmlType::IQ1_M: return {};
    default: return {0};
  }
}

inline uint16_t random_scale(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.25f, 1.f);
  return q::fp32_to_fp16(u(rng) * 0.02f);
}

// n values (a multiple of the block size) of type t: [row_bytes(t, n)] bytes.
inline std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const auto& tt = type_traits(t);
  std::vector<uint8_t> buf(row_bytes(t, n));
  std::normal_distribution<float> nd(0.f, 0.05f);
  if (t == GgmlType::F32) {
    for (int64_t i = 0; i < n; ++i) { float v = nd(rng); std::memcpy(&buf[4 * i], &v, 4); }
    return buf;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      float v = nd(rng);
      uint16_t h;
      if (t == GgmlType::F16) h = q::fp32_to_fp16(v);
      else { uint32_t b; std::memcpy(&b, &v, 4); h = static_cast<uint16_t>(b >> 16); }
      std::memcpy(&buf[2 * i], &h, 2);
    }
    return buf;
  }
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const int64_t nb = n / tt.block_size;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = buf.data() + b * tt.type_size;
    for (int off : fp16_fields(t)) {
      const uint16_t h = random_scale(rng);
      std::memcpy(blk + off, &h, 2);
    }
    if (t == GgmlType::IQ1_M) {  // the fp16 scale is spread over the top nibbles of 4 words
      const uint16_t h = random_scale(rng);
      uint16_t sc[4];
      std::memcpy(sc, blk + 48, 8);
      for (int i = 0; i < 4; ++i) sc[i] = static_cast<uint16_t>((sc[i] & 0x0fff) | (((h >> (4 * i)) & 0xf) << 12));
      std::memcpy(blk + 48, sc, 8);
    }
  }
  return buf;
}

inline std::vector<float> random_acts(int64_t n, std::mt19937& rng, float sigma = 1.f) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

// n_tok rows of random_acts, every third one 4x larger: [n_tok][cols].
inline std::vector<float> random_tokens(int64_t n_tok, int64_t cols, std::mt19937& rng) {
  std::vector<float> x;
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto row = random_acts(cols, rng, t % 3 == 0 ? 4.f : 1.f);
    x.insert(x.end(), row.begin(), row.end());
  }
  return x;
}

// x: [n_tok][cols] -> n_tok activation rows of `act` (q::act_row_bytes(act, cols) bytes each).
inline std::vector<uint8_t> quantize_act_rows(q::ActType act, const std::vector<float>& x, int64_t cols) {
  const int64_t xb = q::act_row_bytes(act, cols), n_tok = static_cast<int64_t>(x.size()) / cols;
  std::vector<uint8_t> xq(static_cast<size_t>(xb * n_tok));
  for (int64_t t = 0; t < n_tok; ++t) q::quantize_act_row(act, x.data() + t * cols, xq.data() + t * xb, cols);
  return xq;
}

}  // namespace strata::test
