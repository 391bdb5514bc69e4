// F32 attention (AttnMath::F32) for the query heads of one token that share a KV head, AVX-512: the
// cache is walked in blocks of 16 positions, each block's K and V rows converted to f32 once and used by
// every row of the group (GQA: 4-16 query heads read the same KV head), with an online softmax per row.
// Why: the per-(token, head) kernels read K and V once per query head, and reduce every score across a
// vector on its own; here a block's 16 scores of a row come out of 16 FMA chains and one shuffle tree,
// and the V sum is 16 broadcast FMAs a vector. Arithmetic (the contract; tests/test_ops.cpp compares it
// with ops.cpp's scalar F32 path within rounding):
//   s_j = scale * sum_d q[d] k_j[d]            (f32, 16-lane partial sums, then a fixed shuffle tree)
//   online softmax over blocks: M = running max, L = sum exp(s - M), O = sum exp(s - M) v_j  (f32)
//   out = O / L
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "cpu/attention_kernels.h"

// GCC 12 reports the intrinsics' internal _mm512_undefined_*() as maybe-uninitialized (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace strata::cpu {
namespace {

constexpr int kBlock = 16;  // cache positions per block (one score vector)

// e^x for x <= 0 (x = -inf gives 0): 2^n * e^r with n = round(x log2 e), |r| <= ln2/2, a degree-7 Taylor
// polynomial (relative error < 1e-8 before rounding), the power of two applied by vscalefps.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));  // e^-104 is 0 in f32; keeps -inf out of the reduction
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);   // ln2 high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);  // ln2 - high bits
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Lane j = the sum of the 16 lanes of a[j] (j < 16).
inline __m512 sum16(const __m512 a[16]) {
  __m512 t[8], u[4], v[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3), a = a[2i], b = a[2i+1]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of a[4i .. 4i+3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // 128-bit lanes (u0 L0+L1, u0 L2+L3, u1 L0+L1, u1 L2+L3)
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

// Positions [p0, p0 + nb) of one head of the cache, as f32 rows of `dim` values (dim % 16 == 0); rows nb..15
// are zeros (their scores are masked; zeros keep 0 * value finite).
inline void load_block(const void* base, int64_t row, int64_t off, int32_t p0, int nb, int dim, KvType type,
                       float* out) {
  for (int j = 0; j < kBlock; ++j) {
    float* o = out + j * dim;
    if (j >= nb) {
      std::memset(o, 0, sizeof(float) * dim);
      continue;
    }
    const int64_t at = (p0 + j) * row + off;
    if (type == KvType::F16) {
      const uint16_t* s = static_cast<const uint16_t*>(base) + at;
      for (int d = 0; d < dim; d += 16)
        _mm512_store_ps(o + d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + d))));
    } else {
      std::memcpy(o, static_cast<const float*>(base) + at, sizeof(float) * dim);
    }
  }
}

}  // namespace

bool attend_f32_group_avx512(const float* q, int n_rows, const void* k, const void* v, int32_t n, int64_t k_row,
                             int64_t v_row, int64_t k_off, int64_t v_off, int head_dim, int head_dim_v, KvType type,
                             float scale, float* out) {
  if (head_dim % 16 != 0 || head_dim_v % 16 != 0 || head_dim > kMaxTileHeadDim || head_dim_v > kMaxTileHeadDim ||
      n_rows < 1 || n_rows > kMaxTileRows || n < 1)
    return false;
  const int nq = head_dim / 16, nv = head_dim_v / 16;
  alignas(64) float kb[kBlock * kMaxTileHeadDim], vb[kBlock * kMaxTileHeadDim];
  alignas(64) float o[kMaxTileRows * kMaxTileHeadDim];  // [row][head_dim_v] running sums
  alignas(64) float pj[kBlock];
  float m[kMaxTileRows], l[kMaxTileRows];
  for (int r = 0; r < n_rows; ++r) m[r] = -INFINITY, l[r] = 0.f;
  std::memset(o, 0, sizeof(float) * n_rows * head_dim_v);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int32_t p0 = 0; p0 < n; p0 += kBlock) {
    const int nb = n - p0 < kBlock ? n - p0 : kBlock;
    load_block(k, k_row, k_off, p0, nb, head_dim, type, kb);
    load_block(v, v_row, v_off, p0, nb, head_dim_v, type, vb);
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1u);
    for (int r = 0; r < n_rows; ++r) {
      const float* qr = q + int64_t(r) * head_dim;
      __m512 acc[kBlock];
#pragma GCC unroll 16
      for (int j = 0; j < kBlock; ++j) acc[j] = _mm512_setzero_ps();
      for (int c = 0; c < nq; ++c) {
        const __m512 qv = _mm512_loadu_ps(qr + 16 * c);
#pragma GCC unroll 16
        for (int j = 0; j < kBlock; ++j) acc[j] = _mm512_fmadd_ps(qv, _mm512_load_ps(kb + j * head_dim + 16 * c), acc[j]);
      }
      const __m512 s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(sum16(acc), vscale));
      const float m_new = std::fmax(m[r], _mm512_reduce_max_ps(s));
      const __m512 p = exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(m_new)));
      const float corr = std::exp(m[r] - m_new);  // 0 for the first block (m = -inf)
      l[r] = l[r] * corr + _mm512_reduce_add_ps(p);
      m[r] = m_new;
      _mm512_store_ps(pj, p);
      float* orow = o + r * head_dim_v;
      const __m512 vc = _mm512_set1_ps(corr);
      for (int c = 0; c < nv; c += 8) {  // 8 output vectors at a time stay in registers over the block
        const int w = nv - c < 8 ? nv - c : 8;
        __m512 ov[8];
        for (int i = 0; i < w; ++i) ov[i] = _mm512_mul_ps(_mm512_load_ps(orow + 16 * (c + i)), vc);
        for (int j = 0; j < nb; ++j) {
          const __m512 pv = _mm512_set1_ps(pj[j]);
          const float* vr = vb + j * head_dim_v + 16 * c;
#pragma GCC unroll 8
          for (int i = 0; i < w; ++i) ov[i] = _mm512_fmadd_ps(pv, _mm512_load_ps(vr + 16 * i), ov[i]);
        }
        for (int i = 0; i < w; ++i) _mm512_store_ps(orow + 16 * (c + i), ov[i]);
      }
    }
  }
  for (int r = 0; r < n_rows; ++r) {
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    for (int d = 0; d < head_dim_v; ++d) out[int64_t(r) * head_dim_v + d] = o[r * head_dim_v + d] * inv;
  }
  return true;
}

}  // namespace strata::cpu
