// The 32-value formats x Q8_32 prefill product: the scalar reference (arithmetic in q32_gemm.h).
#include "quant/q32_gemm.h"

#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_tables.h"
#include "quant/vec_dot.h"

namespace strata::q {
namespace {

struct Codes {
  uint8_t u[32];
  float d, m = 0;
  int off;
};

// Block b of a row: q32_gemm.h's codes u, d, m and offset, read from the block's bytes (q32_layout).
Codes decode(Q32 f, const uint8_t* blk) {
  const Q32Layout L = q32_layout(f);
  Codes c;
  uint16_t h16;
  std::memcpy(&h16, blk, 2);
  c.d = fp16_to_fp32(h16);
  if (L.m >= 0) {
    std::memcpy(&h16, blk + L.m, 2);
    c.m = fp16_to_fp32(h16);
  }
  c.off = L.off;
  if (f == Q32::Q8_0) {
    for (int i = 0; i < 32; ++i) c.u[i] = static_cast<uint8_t>(static_cast<int8_t>(blk[L.qs + i]) + 128);
    return c;
  }
  uint32_t qh = 0;
  if (L.qh >= 0) std::memcpy(&qh, blk + L.qh, 4);
  for (int i = 0; i < 16; ++i) {
    c.u[i] = blk[L.qs + i] & 0xF;
    c.u[16 + i] = blk[L.qs + i] >> 4;
  }
  for (int i = 0; i < 32 && L.qh >= 0; ++i) c.u[i] = static_cast<uint8_t>(c.u[i] | (((qh >> i) & 1) << 4));
  if (f == Q32::IQ4_NL)
    for (int i = 0; i < 32; ++i) c.u[i] = static_cast<uint8_t>(iq::kIq4nlValues[c.u[i]] + 128);
  return c;
}

}  // namespace

std::optional<Q32> q32_format(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return Q32::Q4_0;
    case GgmlType::Q4_1: return Q32::Q4_1;
    case GgmlType::Q5_0: return Q32::Q5_0;
    case GgmlType::Q5_1: return Q32::Q5_1;
    case GgmlType::Q8_0: return Q32::Q8_0;
    case GgmlType::IQ4_NL: return Q32::IQ4_NL;
    default: return std::nullopt;
  }
}

void q32_gemm16_ref(Q32 f, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                    int64_t n_tok, float* out, int64_t os) {
  const int64_t nb = cols / QK;
  const Q32Layout L = q32_layout(f);
  for (int r = 0; r < 16; ++r) {
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8A*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const Codes c = decode(f, w + r * row_bytes + b * L.bytes);
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += c.u[i] * x[b].qs[i];
        s -= c.off * x[b].sum;
        acc = std::fma(c.d * x[b].d, static_cast<float>(s), acc);
        if (L.m >= 0) acc = std::fma(c.m * x[b].d, static_cast<float>(x[b].sum), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

}  // namespace strata::q
