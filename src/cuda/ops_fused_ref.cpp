// CPU references of the fused attention-input ops (cuda/ops_fused_ref.h).
#include "cuda/ops_fused_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "cpu/ops.h"
#include "cuda/host/q8_reference.h"

namespace strata::cuda::ops::ref {

void rope_cos_sin(const int32_t* pos, int64_t n_tok, int n_rot, float base, float* cs) {
  STRATA_REQUIRE(n_rot >= 2 && n_rot % 2 == 0 && n_rot <= cpu::kMaxRot,
                 "rope_cos_sin: n_rot {} must be even, in [2, {}]", n_rot, cpu::kMaxRot);
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));  // as cpu::rope_neox
  for (int64_t t = 0; t < n_tok; ++t) {
    float theta = static_cast<float>(pos[t]);
    for (int i = 0; i < n_rot / 2; ++i) {
      cs[(t * (n_rot / 2) + i) * 2] = std::cos(theta);
      cs[(t * (n_rot / 2) + i) * 2 + 1] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

void attn_prep(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
               const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
               int layer, const AttnPrepShape& s, float* q_out) {
  STRATA_REQUIRE(s.n_rot >= 2 && s.n_rot % 2 == 0 && s.n_rot <= s.head_dim && s.head_dim <= kAttnPrepMaxDim &&
                     s.head_dim_v <= kAttnPrepMaxDim,
                 "attn_prep: n_rot {} / head sizes {}/{}", s.n_rot, s.head_dim, s.head_dim_v);
  const int D = s.head_dim, half = s.n_rot / 2;
  const int64_t k_row = int64_t(s.n_head_kv) * D, v_row = int64_t(s.n_head_kv) * s.head_dim_v;
  std::vector<float> head(static_cast<size_t>(D));  // [D] one normed head
  // The rotation of cpu::rope_neox with the angles from cs (same FMAs).
  auto rope = [&](const float* c, float* xh) {
    for (int i = 0; i < half; ++i) {
      const float x0 = xh[i], x1 = xh[i + half];
      xh[i] = std::fma(x0, c[2 * i], -(x1 * c[2 * i + 1]));
      xh[i + half] = std::fma(x0, c[2 * i + 1], x1 * c[2 * i]);
    }
  };
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* c = cs + t * s.n_rot;
    const KvRef& r = refs[t];
    const int64_t at = int64_t(layer) * r.n_ctx + r.pos;
    for (int h = 0; h < s.n_head; ++h) {
      cpu::rmsnorm(q + t * q_ld + int64_t(h) * D, q_norm, 1, D, s.eps, head.data());
      rope(c, head.data());
      std::copy(head.begin(), head.end(), q_out + (t * s.n_head + h) * D);
    }
    for (int h = 0; h < s.n_head_kv; ++h) {
      cpu::rmsnorm(k + t * k_ld + int64_t(h) * D, k_norm, 1, D, s.eps, head.data());
      rope(c, head.data());
      cpu::kv_store(cpu::KvType::F16, head.data(), D, r.k + at * k_row + int64_t(h) * D);
      cpu::kv_store(cpu::KvType::F16, v + t * v_ld + int64_t(h) * s.head_dim_v, s.head_dim_v,
                    r.v + at * v_row + int64_t(h) * s.head_dim_v);
    }
  }
}

void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights) {
  for (int64_t t = 0; t < n_tok; ++t)
    for (int e = 0; e < n_expert; ++e) {
      float s = 0.0f;
      for (int64_t c = 0; c < cols; ++c) s += w[e * cols + c] * x[t * cols + c];
      logits[t * n_expert + e] = s;
    }
  cpu::moe_route(logits, n_tok, n_expert, k, norm, ids, weights);
}

void norm_router_route(const float* x, const float* norm_w, float eps, const float* w, int n_expert, int64_t cols,
                       int64_t n_tok, int k, bool norm, float* xn, int8_t* xq, float2* xds, float* logits,
                       int32_t* ids, float* weights) {
  std::vector<float> y(static_cast<size_t>(n_tok * cols));
  cpu::rmsnorm(x, norm_w, n_tok, cols, eps, y.data());
  if (xn != nullptr) std::copy(y.begin(), y.end(), xn);
  if (xq != nullptr) q8ref::quantize(y.data(), n_tok, cols, xq, reinterpret_cast<q8ref::Q8Ds*>(xds));
  router_route(w, n_expert, cols, y.data(), n_tok, k, norm, logits, ids, weights);
}

}  // namespace strata::cuda::ops::ref
