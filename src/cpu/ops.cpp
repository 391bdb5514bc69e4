#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "cpu/attention_kernels.h"
#include "cpu/cpu_features.h"
#include "cpu/half.h"
#include "quant/dequant.h"

namespace strata::cpu {

const char* kv_type_name(KvType t) { return t == KvType::F32 ? "f32" : "f16"; }
size_t kv_type_size(KvType t) { return t == KvType::F32 ? 4 : 2; }

void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;  // ggml sums the f32 squares in double (ggml_float)
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_neox(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, int n_rot,
               float base) {
  const int half = n_rot / 2;
  // theta_i = pos * base^(-2i/n_rot), built by repeated multiplication in f32 as ggml does, so the
  // angles (and hence the exact-mode logits) follow the reference closely.
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  STRATA_REQUIRE(n_rot >= 2 && n_rot % 2 == 0 && n_rot <= head_dim && n_rot <= kMaxRot,
                 "rope: n_rot {} must be even, <= head_dim {} and <= {}", n_rot, head_dim, kMaxRot);
  float cs[kMaxRot];  // [n_rot/2][cos, sin] on the stack: no allocation per call
  for (int64_t t = 0; t < n_tok; ++t) {
    float theta = static_cast<float>(pos[t]);
    for (int i = 0; i < half; ++i) {
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
    for (int h = 0; h < n_head; ++h) {
      float* xh = x + (t * n_head + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x0 = xh[i], x1 = xh[i + half];
        const float c = cs[2 * i], s = cs[2 * i + 1];
        // As llama.cpp's CPU build computes x0*c - x1*s and x0*s + x1*c: its compiler contracts the
        // first product and the add into one FMA. Why: a last-bit difference in q/k here changes
        // f16 KV rounding and, in a chaotic MoE, later routing (fixture IQ4_XS: fast-mode KL to
        // llama.cpp's logits 4.3e-3 without the FMA, 1e-5 with it).
        xh[i] = std::fma(x0, c, -(x1 * s));
        xh[i + half] = std::fma(x0, s, x1 * c);
      }
    }
  }
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void get_rows(GgmlType type, const void* data, int64_t n, const int32_t* ids, int64_t n_ids,
              float* dst) {
  const uint64_t rb = row_bytes(type, static_cast<uint64_t>(n));
  for (int64_t t = 0; t < n_ids; ++t) {
    const auto* row = static_cast<const uint8_t*>(data) + static_cast<uint64_t>(ids[t]) * rb;
    if (type == GgmlType::F32)
      std::memcpy(dst + t * n, row, static_cast<size_t>(n) * 4);
    else
      dequantize_row(type, row, dst + t * n, n);
  }
}

void kv_store(KvType type, const float* src, int64_t n, void* dst_row) {
  if (type == KvType::F32) {
    std::memcpy(dst_row, src, static_cast<size_t>(n) * 4);
  } else {
    auto* d = static_cast<uint16_t*>(dst_row);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
  }
}

namespace {

inline float dot_kv(const float* q, const void* k, int64_t i0, int n, KvType type) {
  float s = 0.0f;
  if (type == KvType::F32) {
    const float* kr = static_cast<const float*>(k) + i0;
    for (int d = 0; d < n; ++d) s += q[d] * kr[d];
  } else {
    const uint16_t* kr = static_cast<const uint16_t*>(k) + i0;
    for (int d = 0; d < n; ++d) s += q[d] * half_to_float(kr[d]);
  }
  return s;
}

inline void axpy_kv(float a, const void* v, int64_t i0, int n, KvType type, float* out) {
  if (type == KvType::F32) {
    const float* vr = static_cast<const float*>(v) + i0;
    for (int d = 0; d < n; ++d) out[d] += a * vr[d];
  } else {
    const uint16_t* vr = static_cast<const uint16_t*>(v) + i0;
    for (int d = 0; d < n; ++d) out[d] += a * half_to_float(vr[d]);
  }
}

inline float kv_at(const void* base, int64_t i, KvType type) {
  return type == KvType::F32 ? static_cast<const float*>(base)[i]
                             : half_to_float(static_cast<const uint16_t*>(base)[i]);
}
inline float round_f16(float x) { return half_to_float(float_to_half(x)); }

// One (token, head) of ggml's CPU flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk
// with f16 K and V): Q rounded to f16, dot products summed in f32, online softmax, V accumulated in f16.
void attend_ggml_f16(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                     int64_t v_row, int64_t k_off, int64_t v_off, int head_dim, int head_dim_v,
                     KvType type, float scale, float* oh) {
  float q16[kMaxHeadDim], acc[kMaxHeadDim];  // acc holds f16-representable values
  for (int d = 0; d < head_dim; ++d) q16[d] = round_f16(qh[d]);
  std::fill(acc, acc + head_dim_v, 0.0f);
  float M = -INFINITY, S = 0.0f;
  for (int32_t p = 0; p < n; ++p) {
    double dot = 0.0;
    for (int d = 0; d < head_dim; ++d)
      dot += double(q16[d]) * round_f16(kv_at(k, p * k_row + k_off + d, type));
    const float s = static_cast<float>(dot) * scale;
    float ms = 1.0f, vs = 1.0f;
    if (s > M) {
      const float m_old = M;
      M = s;
      ms = std::exp(m_old - M);
      for (int d = 0; d < head_dim_v; ++d) acc[d] = round_f16(acc[d] * ms);
    } else {
      vs = std::exp(s - M);
    }
    for (int d = 0; d < head_dim_v; ++d)
      acc[d] = round_f16(std::fma(round_f16(kv_at(v, p * v_row + v_off + d, type)), vs, acc[d]));
    S = S * ms + vs;
  }
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int d = 0; d < head_dim_v; ++d) oh[d] = acc[d] * inv;
}

}  // namespace

void attention(const float* q, const AttnKv* kv, int64_t n_tok, int n_head, int n_head_kv,
               int head_dim, int head_dim_v, KvType type, float scale, float* out, float* scratch,
               int64_t max_kv, ThreadPool& pool, AttnMath math) {
  STRATA_REQUIRE(head_dim <= kMaxHeadDim && head_dim_v <= kMaxHeadDim,
                 "attention: head size {}/{} above {}", head_dim, head_dim_v, kMaxHeadDim);
  const int group = n_head / n_head_kv;
  const bool avx2 = cpu_level() >= CpuLevel::Avx2, avx512 = cpu_level() >= CpuLevel::Avx512;
  const int64_t k_row = static_cast<int64_t>(n_head_kv) * head_dim;    // values per cache position
  const int64_t v_row = static_cast<int64_t>(n_head_kv) * head_dim_v;
  if (math == AttnMath::F32 && avx512 && head_dim % 16 == 0 && head_dim_v % 16 == 0 &&
      head_dim <= kMaxTileHeadDim && head_dim_v <= kMaxTileHeadDim) {
    // The query heads of a KV head go together (attend_f32_group_avx512), split into chunks only where
    // (token, KV head) pairs alone would leave threads idle (decode).
    const int64_t pairs = n_tok * n_head_kv;
    int chunks = static_cast<int>(std::min<int64_t>(group, (2 * pool.size() + pairs - 1) / pairs));
    chunks = std::max(chunks, (group + kMaxTileRows - 1) / kMaxTileRows);
    const int rows = (group + chunks - 1) / chunks;
    pool.parallel_for(pairs * chunks, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t t = i / (n_head_kv * chunks);
        const int hk = static_cast<int>(i / chunks % n_head_kv), c = static_cast<int>(i % chunks);
        const int h0 = hk * group + c * rows, nr = std::min(rows, group - c * rows);
        if (nr <= 0) continue;
        const int32_t n = kv[t].n_kv;
        STRATA_REQUIRE(n >= 1 && n <= max_kv, "attention: {} cache positions, scratch holds {}", n, max_kv);
        const bool ok = attend_f32_group_avx512(q + (t * n_head + h0) * head_dim, nr, kv[t].k, kv[t].v, n, k_row,
                                                v_row, hk * head_dim, hk * head_dim_v, head_dim, head_dim_v, type,
                                                scale, out + (t * n_head + h0) * head_dim_v);
        STRATA_REQUIRE(ok, "attention: the f32 group kernel refused {} rows of {}/{}", nr, head_dim, head_dim_v);
      }
    });
    return;
  }
  pool.parallel_for(n_tok * n_head, 1, [&](int64_t b, int64_t e, int thread) {
    float* sc = scratch + static_cast<int64_t>(thread) * max_kv;  // [max_kv]
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / n_head;
      const int h = static_cast<int>(i % n_head), hk = h / group;
      const float* qh = q + (t * n_head + h) * head_dim;
      float* oh = out + (t * n_head + h) * head_dim_v;
      const int32_t n = kv[t].n_kv;
      STRATA_REQUIRE(n >= 1 && n <= max_kv, "attention: {} cache positions, scratch holds {}", n,
                     max_kv);
      if (math == AttnMath::GgmlF16) {
        if (avx512 && attend_ggml_f16_avx512(qh, kv[t].k, kv[t].v, n, k_row, v_row, hk * head_dim,
                                             hk * head_dim_v, head_dim, head_dim_v, type, scale, sc, oh))
          continue;
        if (avx2 && attend_ggml_f16_avx2(qh, kv[t].k, kv[t].v, n, k_row, v_row, hk * head_dim,
                                         hk * head_dim_v, head_dim, head_dim_v, type, scale, sc, oh))
          continue;
        attend_ggml_f16(qh, kv[t].k, kv[t].v, n, k_row, v_row, hk * head_dim, hk * head_dim_v,
                        head_dim, head_dim_v, type, scale, oh);
        continue;
      }
      float mx = -INFINITY;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = scale * dot_kv(qh, kv[t].k, p * k_row + hk * head_dim, head_dim, type);
        mx = std::max(mx, sc[p]);
      }
      double sum = 0.0;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = std::exp(sc[p] - mx);
        sum += sc[p];
      }
      const float inv = static_cast<float>(1.0 / sum);
      std::fill(oh, oh + head_dim_v, 0.0f);
      for (int32_t p = 0; p < n; ++p)
        axpy_kv(sc[p] * inv, kv[t].v, p * v_row + hk * head_dim_v, head_dim_v, type, oh);
    }
  });
}

void moe_route(const float* logits, int64_t n_tok, int n_expert, int k, bool norm, int32_t* ids,
               float* weights) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= kMaxExperts && k >= 1 && k <= n_expert,
                 "moe_route: {} experts, {} used (supported: 1 <= used <= experts <= {})", n_expert,
                 k, kMaxExperts);
  float p_buf[kMaxExperts];     // on the stack: no allocation per call
  int32_t o_buf[kMaxExperts];
  float* p = p_buf;
  int32_t* order = o_buf;
  for (int64_t t = 0; t < n_tok; ++t) {
    std::copy(logits + t * n_expert, logits + (t + 1) * n_expert, p);
    softmax(p, n_expert);
    for (int e = 0; e < n_expert; ++e) order[e] = e;
    std::partial_sort(order, order + k, order + n_expert, [&](int32_t a, int32_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = p[order[j]];
      sum += p[order[j]];
    }
    if (norm) {
      sum = std::max(sum, 6.103515625e-5f);
      for (int j = 0; j < k; ++j) weights[t * k + j] /= sum;
    }
  }
}

void ban_tokens(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                const uint8_t* rows) {
  for (int64_t t = 0; t < n_tok; ++t) {
    if (rows && !rows[t]) continue;
    for (int32_t j = 0; j < n_ban; ++j)
      if (ban[j] >= 0 && ban[j] < n_vocab) logits[t * n_vocab + ban[j]] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace strata::cpu
