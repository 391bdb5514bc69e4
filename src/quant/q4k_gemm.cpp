// Q4_K x Q8_K prefill product: switch and scalar reference (arithmetic in q4k_gemm.h).
#include "quant/q4k_gemm.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "quant/blocks.h"
#include "quant/iq_gemm_decode.h"
#include "quant/iq_tables.h"
#include "quant/q32_gemm.h"

namespace strata::q {
namespace {

template <GgmlType T>
void iq_gemm16_avx512_of(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                         int64_t n_tok, float* out, int64_t os) {
  iq_gemm16_avx512(T, cols, w, row_bytes, xq, xs, n_tok, out, os);
}
template <GgmlType T>
void iq_gemm16_ref_of(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                      float* out, int64_t os) {
  iq_gemm16_ref(T, cols, w, row_bytes, xq, xs, n_tok, out, os);
}

std::atomic<int>& enabled_flag() {  // -1: not read yet
  static std::atomic<int> f{-1};
  return f;
}

}  // namespace

bool q4k_gemm_enabled() {
  int v = enabled_flag().load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("STRATA_Q4K_GEMM");
    v = 1;
    if (e && *e) {
      STRATA_REQUIRE(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0, "STRATA_Q4K_GEMM must be 0 or 1, got '{}'", e);
      v = e[0] == '1';
    }
    enabled_flag().store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void q4k_gemm_set_enabled(bool on) { enabled_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

bool q4k_gemm_cpu_ok() { return cpu_level() == CpuLevel::Avx512 && cpu_features().avx512vnni; }

Gemm16Fn gemm16_kernel(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return q2k_gemm16_avx512;
    case GgmlType::Q3_K: return q3k_gemm16_avx512;
    case GgmlType::Q4_K: return q4k_gemm16_avx512;
    case GgmlType::Q5_K: return q5k_gemm16_avx512;
    case GgmlType::Q6_K: return q6k_gemm16_avx512;
    case GgmlType::IQ4_XS: return iq4xs_gemm16_avx512;
    case GgmlType::IQ2_XXS: return iq_gemm16_avx512_of<GgmlType::IQ2_XXS>;
    case GgmlType::IQ2_XS: return iq_gemm16_avx512_of<GgmlType::IQ2_XS>;
    case GgmlType::IQ2_S: return iq_gemm16_avx512_of<GgmlType::IQ2_S>;
    case GgmlType::IQ3_XXS: return iq_gemm16_avx512_of<GgmlType::IQ3_XXS>;
    case GgmlType::IQ3_S: return iq_gemm16_avx512_of<GgmlType::IQ3_S>;
    case GgmlType::Q4_0: return q32_gemm16_avx512_of<Q32::Q4_0>;
    case GgmlType::Q4_1: return q32_gemm16_avx512_of<Q32::Q4_1>;
    case GgmlType::Q5_0: return q32_gemm16_avx512_of<Q32::Q5_0>;
    case GgmlType::Q5_1: return q32_gemm16_avx512_of<Q32::Q5_1>;
    case GgmlType::Q8_0: return q32_gemm16_avx512_of<Q32::Q8_0>;
    case GgmlType::IQ4_NL: return q32_gemm16_avx512_of<Q32::IQ4_NL>;
    default: return nullptr;
  }
}

int64_t gemm16_min_tokens(GgmlType t) {
  return t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS || t == GgmlType::IQ2_S ? 16 : kQ4kGemmMinTok;
}

Gemm16Fn gemm16_reference(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return q2k_gemm16_ref;
    case GgmlType::Q3_K: return q3k_gemm16_ref;
    case GgmlType::Q4_K: return q4k_gemm16_ref;
    case GgmlType::Q5_K: return q5k_gemm16_ref;
    case GgmlType::Q6_K: return q6k_gemm16_ref;
    case GgmlType::IQ4_XS: return iq4xs_gemm16_ref;
    case GgmlType::IQ2_XXS: return iq_gemm16_ref_of<GgmlType::IQ2_XXS>;
    case GgmlType::IQ2_XS: return iq_gemm16_ref_of<GgmlType::IQ2_XS>;
    case GgmlType::IQ2_S: return iq_gemm16_ref_of<GgmlType::IQ2_S>;
    case GgmlType::IQ3_XXS: return iq_gemm16_ref_of<GgmlType::IQ3_XXS>;
    case GgmlType::IQ3_S: return iq_gemm16_ref_of<GgmlType::IQ3_S>;
    case GgmlType::Q4_0: return q32_gemm16_ref_of<Q32::Q4_0>;
    case GgmlType::Q4_1: return q32_gemm16_ref_of<Q32::Q4_1>;
    case GgmlType::Q5_0: return q32_gemm16_ref_of<Q32::Q5_0>;
    case GgmlType::Q5_1: return q32_gemm16_ref_of<Q32::Q5_1>;
    case GgmlType::Q8_0: return q32_gemm16_ref_of<Q32::Q8_0>;
    case GgmlType::IQ4_NL: return q32_gemm16_ref_of<Q32::IQ4_NL>;
    default: return nullptr;
  }
}

namespace {

// Q4_K (kQ5 false) or Q5_K: the same formula, Q5_K's codes with bit 4 from qh.
template <bool kQ5>
void k45_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  using Block = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nb = cols / QK_K;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    const auto* a = reinterpret_cast<const Block*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* s = a[b].scales;
        int32_t S = 0, M = 0;
        for (int sb = 0; sb < 8; ++sb) {
          int sc, m;
          if (sb < 4) {
            sc = s[sb] & 63;
            m = s[sb + 4] & 63;
          } else {
            sc = (s[sb + 4] & 0xF) | ((s[sb - 4] >> 6) << 4);
            m = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
          }
          int32_t dot = 0;
          for (int i = 0; i < 32; ++i) {
            const uint8_t byte = a[b].qs[32 * (sb / 2) + i];
            int qv = sb % 2 ? byte >> 4 : byte & 0xF;
            if constexpr (kQ5) qv |= ((a[b].qh[i] >> sb) & 1) << 4;
            dot += qv * x[b].qs[32 * sb + i];
          }
          S += sc * dot;
          M += m * (x[b].bsums[2 * sb] + x[b].bsums[2 * sb + 1]);
        }
        const float dd = fp16_to_fp32(a[b].d) * x[b].d, dm = fp16_to_fp32(a[b].dmin) * x[b].d;
        acc = std::fma(dd, static_cast<float>(S), acc);
        acc = std::fma(-dm, static_cast<float>(M), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

}  // namespace

void q4k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  k45_gemm16_ref<false>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

void q5k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  k45_gemm16_ref<true>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

void iq4xs_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                      float* out, int64_t os) {
  const int64_t nb = cols / QK_K;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    const auto* a = reinterpret_cast<const BlockIQ4_XS*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t S = 0, M = 0;
        for (int ib = 0; ib < 8; ++ib) {
          const int sc = (((a[b].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((a[b].scales_h >> 2 * ib) & 3) << 4)) - 32;
          int32_t dot = 0;
          for (int j = 0; j < 16; ++j) {
            const uint8_t byte = a[b].qs[16 * ib + j];
            dot += (iq::kIq4nlValues[byte & 0xF] + 128) * x[b].qs[32 * ib + j];
            dot += (iq::kIq4nlValues[byte >> 4] + 128) * x[b].qs[32 * ib + 16 + j];
          }
          S += sc * dot;
          M += sc * (x[b].bsums[2 * ib] + x[b].bsums[2 * ib + 1]);
        }
        const float d = fp16_to_fp32(a[b].d);
        const float dd = d * x[b].d, dm = (d * 128.f) * x[b].d;
        acc = std::fma(dd, static_cast<float>(S), acc);
        acc = std::fma(-dm, static_cast<float>(M), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

void q6k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  const int64_t nb = cols / QK_K;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    const auto* a = reinterpret_cast<const BlockQ6_K*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t S = 0, M = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) {
            const int v = 16 * s + i, n = v / 128, quarter = (v % 128) / 32, l = v % 32;
            const uint8_t lo = a[b].ql[64 * n + 32 * (quarter % 2) + l];
            const int u = (quarter < 2 ? lo & 0xF : lo >> 4) | (((a[b].qh[32 * n + l] >> (2 * quarter)) & 3) << 4);
            dot += u * x[b].qs[v];
          }
          S += a[b].scales[s] * dot;
          M += a[b].scales[s] * x[b].bsums[s];
        }
        const float dd = fp16_to_fp32(a[b].d) * x[b].d;
        acc = std::fma(dd, static_cast<float>(S - 32 * M), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

// Value v of a Q2_K / Q3_K super-block: bits 2 j of qs[32 h + l] (h = v / 128, j = (v % 128) / 32, l = v % 32);
// Q3_K's third bit is bit 4 h + j of hmask[l].
static inline int q23_low_bits(const uint8_t* qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3; }

void q3k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  const int64_t nb = cols / QK_K;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    const auto* a = reinterpret_cast<const BlockQ3_K*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int8_t sc[16];
        q3k_scales(a[b].scales, sc);
        int32_t S = 0, M = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) {
            const int v = 16 * s + i;
            const int hbit = (a[b].hmask[v % 32] >> (4 * (v / 128) + (v % 128) / 32)) & 1;
            dot += (q23_low_bits(a[b].qs, v) | (hbit << 2)) * x[b].qs[v];
          }
          S += sc[s] * dot;
          M += sc[s] * x[b].bsums[s];
        }
        acc = std::fma(fp16_to_fp32(a[b].d) * x[b].d, static_cast<float>(S - 4 * M), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

void q2k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  const int64_t nb = cols / QK_K;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    const auto* a = reinterpret_cast<const BlockQ2_K*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t S = 0, M = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) dot += q23_low_bits(a[b].qs, 16 * s + i) * x[b].qs[16 * s + i];
          S += (a[b].scales[s] & 0xF) * dot;
          M += (a[b].scales[s] >> 4) * x[b].bsums[s];
        }
        const float dd = fp16_to_fp32(a[b].d) * x[b].d, dm = fp16_to_fp32(a[b].dmin) * x[b].d;
        acc = std::fma(dd, static_cast<float>(S), acc);
        acc = std::fma(-dm, static_cast<float>(M), acc);
      }
      out[t * os + r] = acc;
    }
  }
}

void iq_gemm16_ref(GgmlType t, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                   int64_t n_tok, float* out, int64_t os) {
  const int64_t nb = cols / QK_K, bb = int64_t(type_traits(t).type_size);
  IqBlockInts blk;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    for (int64_t tk = 0; tk < n_tok; ++tk) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + tk * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        iq_decode_ints(t, w + r * row_bytes + b * bb, blk);
        int32_t S = 0, M = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) dot += blk.u[16 * s + i] * x[b].qs[16 * s + i];
          S += blk.sc[s] * dot;
          M += blk.sc[s] * x[b].bsums[s];
        }
        acc = std::fma(blk.d * x[b].d, static_cast<float>(S - 64 * M), acc);
      }
      out[tk * os + r] = acc;
    }
  }
}

}  // namespace strata::q
