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

// A family's kernel (or reference) with its format fixed: q4k_gemm.h's Gemm16Fn.
template <auto F, auto Format>
void bound(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok, float* out,
           int64_t os) {
  F(Format, cols, w, row_bytes, xq, xs, n_tok, out, os);
}

// Every type with a 16-row kernel: the kernel, its reference and the fewest tokens matmul gives it (the IQ2
// and IQ1 formats: 16, their scalar decode costs more than the decode kernels save below that).
struct Gemm16Entry {
  Gemm16Fn kernel = nullptr, ref = nullptr;
  int64_t min_tok = kQ4kGemmMinTok;
};
template <GgmlType T>
constexpr Gemm16Entry iq_entry(int64_t min_tok) {
  return {bound<iq_gemm16_avx512, T>, bound<iq_gemm16_ref, T>, min_tok};
}
template <Q32 F>
constexpr Gemm16Entry q32_entry() {
  return {bound<q32_gemm16_avx512, F>, bound<q32_gemm16_ref, F>};
}
Gemm16Entry gemm16_entry(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return {q2k_gemm16_avx512, q2k_gemm16_ref};
    case GgmlType::Q3_K: return {q3k_gemm16_avx512, q3k_gemm16_ref};
    case GgmlType::Q4_K: return {q4k_gemm16_avx512, q4k_gemm16_ref};
    case GgmlType::Q5_K: return {q5k_gemm16_avx512, q5k_gemm16_ref};
    case GgmlType::Q6_K: return {q6k_gemm16_avx512, q6k_gemm16_ref};
    case GgmlType::IQ4_XS: return {iq4xs_gemm16_avx512, iq4xs_gemm16_ref};
    case GgmlType::IQ2_XXS: return iq_entry<GgmlType::IQ2_XXS>(16);
    case GgmlType::IQ2_XS: return iq_entry<GgmlType::IQ2_XS>(16);
    case GgmlType::IQ2_S: return iq_entry<GgmlType::IQ2_S>(16);
    case GgmlType::IQ3_XXS: return iq_entry<GgmlType::IQ3_XXS>(kQ4kGemmMinTok);
    case GgmlType::IQ3_S: return iq_entry<GgmlType::IQ3_S>(kQ4kGemmMinTok);
    case GgmlType::IQ1_S: return iq_entry<GgmlType::IQ1_S>(16);
    case GgmlType::IQ1_M: return iq_entry<GgmlType::IQ1_M>(16);
    case GgmlType::Q4_0: return q32_entry<Q32::Q4_0>();
    case GgmlType::Q4_1: return q32_entry<Q32::Q4_1>();
    case GgmlType::Q5_0: return q32_entry<Q32::Q5_0>();
    case GgmlType::Q5_1: return q32_entry<Q32::Q5_1>();
    case GgmlType::Q8_0: return q32_entry<Q32::Q8_0>();
    case GgmlType::IQ4_NL: return q32_entry<Q32::IQ4_NL>();
    default: return {};
  }
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

Gemm16Fn gemm16_kernel(GgmlType t) { return gemm16_entry(t).kernel; }
Gemm16Fn gemm16_reference(GgmlType t) { return gemm16_entry(t).ref; }
int64_t gemm16_min_tokens(GgmlType t) { return gemm16_entry(t).min_tok; }

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

namespace {

// The references of the formats on Q6_K's kernel (16-value sub-blocks): per super-block the codes u (bytes),
// one integer scale per 16 values, and either a code offset (T = S - off M, one float step) or integer
// mins with dmin (Q2_K: two float steps). The arithmetic of q4k_gemm.h for each.
struct Sub16 {
  uint8_t u[256];
  int32_t sc[16], mn[16];
  float d, dmin;
  int off;  // 0: mins
};

template <typename Decode>  // decode(block bytes, Sub16&)
void sub16_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, int64_t block_bytes, const uint8_t* xq,
                      int64_t xs, int64_t n_tok, float* out, int64_t os, Decode decode) {
  const int64_t nb = cols / QK_K;
  Sub16 k;
  for (int r = 0; r < kQ4kGemmRows; ++r) {
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        decode(w + r * row_bytes + b * block_bytes, k);
        int32_t S = 0, M = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) dot += k.u[16 * s + i] * x[b].qs[16 * s + i];
          S += k.sc[s] * dot;
          M += (k.off ? k.sc[s] : k.mn[s]) * x[b].bsums[s];
        }
        if (k.off) {
          acc = std::fma(k.d * x[b].d, static_cast<float>(S - k.off * M), acc);
        } else {
          acc = std::fma(k.d * x[b].d, static_cast<float>(S), acc);
          acc = std::fma(-(k.dmin * x[b].d), static_cast<float>(M), acc);
        }
      }
      out[t * os + r] = acc;
    }
  }
}

// Value v of a Q2_K / Q3_K super-block: bits 2 j of qs[32 h + l] (h = v / 128, j = (v % 128) / 32, l = v % 32);
// Q3_K's third bit is bit 4 h + j of hmask[l].
int q23_low_bits(const uint8_t* qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3; }

}  // namespace

void q6k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  sub16_gemm16_ref(cols, w, row_bytes, sizeof(BlockQ6_K), xq, xs, n_tok, out, os, [](const uint8_t* p, Sub16& k) {
    const auto& a = *reinterpret_cast<const BlockQ6_K*>(p);
    for (int v = 0; v < 256; ++v) {  // u = q + 32: low 4 bits from ql, high 2 from qh
      const int n = v / 128, quarter = (v % 128) / 32, l = v % 32;
      const uint8_t lo = a.ql[64 * n + 32 * (quarter % 2) + l];
      k.u[v] = static_cast<uint8_t>((quarter < 2 ? lo & 0xF : lo >> 4) | (((a.qh[32 * n + l] >> (2 * quarter)) & 3) << 4));
    }
    for (int s = 0; s < 16; ++s) k.sc[s] = a.scales[s];
    k.d = fp16_to_fp32(a.d);
    k.off = 32;
  });
}

void q3k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  sub16_gemm16_ref(cols, w, row_bytes, sizeof(BlockQ3_K), xq, xs, n_tok, out, os, [](const uint8_t* p, Sub16& k) {
    const auto& a = *reinterpret_cast<const BlockQ3_K*>(p);
    for (int v = 0; v < 256; ++v) {  // u = q + 4
      const int hbit = (a.hmask[v % 32] >> (4 * (v / 128) + (v % 128) / 32)) & 1;
      k.u[v] = static_cast<uint8_t>(q23_low_bits(a.qs, v) | (hbit << 2));
    }
    int8_t sc[16];
    q3k_scales(a.scales, sc);
    for (int s = 0; s < 16; ++s) k.sc[s] = sc[s];
    k.d = fp16_to_fp32(a.d);
    k.off = 4;
  });
}

void q2k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  sub16_gemm16_ref(cols, w, row_bytes, sizeof(BlockQ2_K), xq, xs, n_tok, out, os, [](const uint8_t* p, Sub16& k) {
    const auto& a = *reinterpret_cast<const BlockQ2_K*>(p);
    for (int v = 0; v < 256; ++v) k.u[v] = static_cast<uint8_t>(q23_low_bits(a.qs, v));
    for (int s = 0; s < 16; ++s) k.sc[s] = a.scales[s] & 0xF, k.mn[s] = a.scales[s] >> 4;
    k.d = fp16_to_fp32(a.d);
    k.dmin = fp16_to_fp32(a.dmin);
    k.off = 0;
  });
}

void iq_gemm16_ref(GgmlType t, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                   int64_t n_tok, float* out, int64_t os) {
  sub16_gemm16_ref(cols, w, row_bytes, int64_t(type_traits(t).type_size), xq, xs, n_tok, out, os,
                   [t](const uint8_t* p, Sub16& k) {
                     IqBlockInts b;
                     iq_decode_ints(t, p, b);
                     std::memcpy(k.u, b.u, 256);
                     std::memcpy(k.sc, b.sc, sizeof(k.sc));
                     k.d = b.d;
                     k.off = 64;
                   });
}

}  // namespace strata::q
