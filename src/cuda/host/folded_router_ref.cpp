// CPU references of the folded router (contract: folded_router_ref.h, cuda/q8_kernels.cuh).
#include "cuda/host/folded_router_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.h"

namespace strata::cuda::q8ref {

void fold_router(const float* router, const float* norm_w, const float* wo, int n_expert, int64_t n_embd,
                 int64_t n_att, float* fold) {
  std::vector<double> c(static_cast<size_t>(n_embd)), acc(static_cast<size_t>(n_att));
  for (int e = 0; e < n_expert; ++e) {
    const float* re = router + int64_t(e) * n_embd;
    float* out = fold + int64_t(e) * (n_embd + n_att);
    for (int64_t r = 0; r < n_embd; ++r) {
      c[size_t(r)] = double(re[r]) * double(norm_w[r]);
      out[r] = float(c[size_t(r)]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = 0; r < n_embd; ++r) {  // r in order for every column, as the kernel
      const float* wr = wo + r * n_att;
      for (int64_t i = 0; i < n_att; ++i) acc[size_t(i)] += c[size_t(r)] * double(wr[i]);
    }
    for (int64_t i = 0; i < n_att; ++i) out[n_embd + i] = float(acc[size_t(i)]);
  }
}

void wo_router(GgmlType type, const void* wo, int64_t n_embd, int64_t n_att, int64_t row_bytes, const int8_t* attq,
               const Q8Ds* attds, const float* att, const float* x, const float* fold, int n_expert, float* mid,
               float* raw, float* ss) {
  std::copy(x, x + n_embd, mid);
  matvec(type, wo, n_embd, n_att, row_bytes, attq, attds, 1, mid, /*accumulate=*/true);
  double total = 0.0;
  for (int64_t r = 0; r < n_embd; ++r) total += double(mid[r]) * mid[r];
  ss[0] = float(total);
  for (int e = 0; e < n_expert; ++e) {
    const float* row = fold + int64_t(e) * (n_embd + n_att);
    double a = 0.0;
    for (int64_t c = 0; c < n_embd; ++c) a += double(row[c]) * x[c];
    for (int64_t i = 0; i < n_att; ++i) a += double(row[n_embd + i]) * att[i];
    raw[e] = float(a);
  }
}

void moe_gate_up_routed(const ExpertView& v, const int32_t* table, const FoldedRoute& r, int k, int8_t* hq,
                        Q8Ds* hds, int8_t* xq, Q8Ds* xds) {
  STRATA_REQUIRE(k >= 1 && k <= r.n_expert, "q8ref moe_gate_up_routed: k {} of {} experts", k, r.n_expert);
  double total = 0.0;
  for (int i = 0; i < r.n_ss; ++i) total += double(r.ss[i]);
  const float s = 1.0f / std::sqrt(float(total / double(v.n_embd)) + r.eps);
  std::vector<float> y(size_t(v.n_embd));
  for (int64_t c = 0; c < v.n_embd; ++c) y[size_t(c)] = r.mid[c] * s * r.norm_w[c];
  quantize(y.data(), 1, v.n_embd, xq, xds);
  // The top k: value desc, id asc, NaN after every number.
  std::vector<int32_t> order(size_t(r.n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float va = r.raw[a], vb = r.raw[b];
    if (std::isnan(va) || std::isnan(vb)) return !std::isnan(va) && std::isnan(vb);
    return va > vb;
  });
  std::copy(order.begin(), order.begin() + k, r.ids);
  moe_gate_up(v, table, xq, xds, r.ids, 1, k, hq, hds);
  // The weights: softmax of s * raw over every expert, the chosen ones, renormalized.
  float mx = -INFINITY;
  for (int e = 0; e < r.n_expert; ++e) mx = std::max(mx, s * r.raw[e]);
  std::vector<float> p(size_t(r.n_expert));
  double sum = 0.0;
  for (int e = 0; e < r.n_expert; ++e) sum += p[size_t(e)] = std::exp(s * r.raw[e] - mx);
  const float inv = float(1.0 / sum);
  float wsum = 0.f;
  for (int j = 0; j < k; ++j) wsum += r.wts[j] = p[size_t(r.ids[j])] * inv;
  wsum = std::max(wsum, 6.103515625e-5f);
  if (r.norm)
    for (int j = 0; j < k; ++j) r.wts[j] /= wsum;
}

}  // namespace strata::cuda::q8ref
