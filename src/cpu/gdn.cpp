#include "cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "cpu/gdn_kernels.h"

namespace strata {

namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void check_delta_shape(const DeltaRuleShape& s) {
  STRATA_REQUIRE(s.n_tok >= 0 && s.n_k_heads > 0 && s.n_v_heads > 0 && s.head_dim > 0,
                 "gated delta rule: bad shape (n_tok {}, Hk {}, Hv {}, D {})", s.n_tok, s.n_k_heads,
                 s.n_v_heads, s.head_dim);
  STRATA_REQUIRE(s.n_v_heads % s.n_k_heads == 0,
                 "gated delta rule: {} value heads is not a multiple of {} key heads", s.n_v_heads,
                 s.n_k_heads);
}

// Keeps the last K-1 rows of (state ++ x) in state.  state: [K-1][C], x: [n_tok][C]
void roll_conv_state(const float* x, int64_t n_tok, int64_t C, int K, float* state) {
  const int64_t keep = K - 1;
  if (keep <= 0) return;
  if (n_tok >= keep) {
    std::memcpy(state, x + (n_tok - keep) * C, sizeof(float) * keep * C);
  } else {
    std::memmove(state, state + n_tok * C, sizeof(float) * (keep - n_tok) * C);
    std::memcpy(state + (keep - n_tok) * C, x, sizeof(float) * n_tok * C);
  }
}

}  // namespace

// ---- conv1d ----------------------------------------------------------------------------------------

void gdn_conv1d_silu_ref(const float* x, int64_t n_tok, int64_t C, int K, float* state,
                         const float* w, float* y) {
  STRATA_REQUIRE(K >= 1 && C > 0 && n_tok >= 0, "conv1d: bad shape (K {}, C {}, n_tok {})", K, C,
                 n_tok);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int k = 0; k < K; ++k) {
        const int64_t r = t + k;  // row of xx = state ++ x
        const float xv = r < K - 1 ? state[r * C + c] : x[(r - (K - 1)) * C + c];
        acc += double(w[c * K + k]) * xv;
      }
      const double a = acc;
      y[t * C + c] = float(a / (1.0 + std::exp(-a)));
    }
  }
  roll_conv_state(x, n_tok, C, K, state);
}

void gdn_conv1d_silu(const float* x, int64_t n_tok, int64_t C, int K, float* state, const float* w,
                     float* y) {
  STRATA_REQUIRE(K >= 1 && C > 0 && n_tok >= 0, "conv1d: bad shape (K {}, C {}, n_tok {})", K, C,
                 n_tok);
  // Why: loop over taps outside and channels inside so the inner loop is a contiguous multiply-add
  // over a row (vectorises); the first K-1 tokens read the state rows, the rest read x directly
  // (no padded copy, no per-element branch).
  for (int64_t t = 0; t < n_tok; ++t) {
    float* yt = y + t * C;
    std::fill(yt, yt + C, 0.0f);
    for (int k = 0; k < K; ++k) {
      const int64_t r = t + k;
      const float* row = r < K - 1 ? state + r * C : x + (r - (K - 1)) * C;
      const float* wk = w + k;  // w[c][k], stride K
      for (int64_t c = 0; c < C; ++c) yt[c] += wk[c * K] * row[c];
    }
    for (int64_t c = 0; c < C; ++c) yt[c] = silu(yt[c]);
  }
  roll_conv_state(x, n_tok, C, K, state);
}

// ---- gates ---------------------------------------------------------------------------------------------

namespace {
// ggml_softplus: log(1 + exp(x)), x itself above 20 (where the two agree in f32)
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void gdn_gates_ref(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                   const float* a, const float* dt_bias, float* g, float* beta) {
  STRATA_REQUIRE(n_k_heads > 0 && n_v_heads % n_k_heads == 0, "gdn gates: {} value heads, {} key heads",
                 n_v_heads, n_k_heads);
  const int64_t r = n_v_heads / n_k_heads;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t h = 0; h < n_v_heads; ++h) {
      const int64_t j = h / r, i = h % r;
      const double b = ba[t * 2 * n_v_heads + j * 2 * r + i];
      const double al = ba[t * 2 * n_v_heads + j * 2 * r + r + i] + double(dt_bias[h]);
      beta[t * n_v_heads + h] = float(1.0 / (1.0 + std::exp(-b)));
      g[t * n_v_heads + h] = float(a[h] * std::log(1.0 + std::exp(al)));
    }
}

void gdn_gates(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, const float* a,
               const float* dt_bias, float* g, float* beta) {
  STRATA_REQUIRE(n_k_heads > 0 && n_v_heads % n_k_heads == 0, "gdn gates: {} value heads, {} key heads",
                 n_v_heads, n_k_heads);
  const int64_t r = n_v_heads / n_k_heads;
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* bt = ba + t * 2 * n_v_heads;
    for (int64_t j = 0; j < n_k_heads; ++j)
      for (int64_t i = 0; i < r; ++i) {
        const int64_t h = j * r + i;
        beta[t * n_v_heads + h] = sigmoid(bt[j * 2 * r + i]);
        g[t * n_v_heads + h] = a[h] * softplus(bt[j * 2 * r + r + i] + dt_bias[h]);
      }
  }
}

void gdn_split_qkv(const float* conv, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                   int64_t D, float eps, float* q, float* k, float* v) {
  const int64_t kd = n_k_heads * D, vd = n_v_heads * D, C = 2 * kd + vd;
  for (int64_t t = 0; t < n_tok; ++t) {
    std::memcpy(q + t * kd, conv + t * C, sizeof(float) * kd);
    std::memcpy(k + t * kd, conv + t * C + kd, sizeof(float) * kd);
    std::memcpy(v + t * vd, conv + t * C + 2 * kd, sizeof(float) * vd);
  }
  l2_norm_rows(q, n_tok * n_k_heads, D, eps);
  l2_norm_rows(k, n_tok * n_k_heads, D, eps);
}

void gdn_unpack_qkvz(const float* mixed, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                     int64_t D, float* qkv, float* z) {
  const int64_t r = n_v_heads / n_k_heads, kd = n_k_heads * D, vd = n_v_heads * D;
  const int64_t group = 2 * D + 2 * r * D, C = 2 * kd + vd;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t j = 0; j < n_k_heads; ++j) {
      const float* src = mixed + t * n_k_heads * group + j * group;
      float* dst = qkv + t * C;
      std::memcpy(dst + j * D, src, sizeof(float) * D);
      std::memcpy(dst + kd + j * D, src + D, sizeof(float) * D);
      std::memcpy(dst + 2 * kd + j * r * D, src + 2 * D, sizeof(float) * r * D);
      std::memcpy(z + t * vd + j * r * D, src + 2 * D + r * D, sizeof(float) * r * D);
    }
}

// ---- L2 norm -----------------------------------------------------------------------------------------

void l2_norm_rows_ref(float* x, int64_t n_rows, int64_t D, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * D;
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += double(row[i]) * row[i];
    const float scale = 1.0f / std::max(float(std::sqrt(ss)), eps);
    for (int64_t i = 0; i < D; ++i) row[i] *= scale;
  }
}

void l2_norm_rows(float* x, int64_t n_rows, int64_t D, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * D;
    const float scale = 1.0f / std::max(std::sqrt(dot(row, row, D)), eps);
    for (int64_t i = 0; i < D; ++i) row[i] *= scale;
  }
}

// ---- gated delta rule: recurrent -----------------------------------------------------------------------

void gdn_delta_rule_recurrent_ref(const DeltaRuleShape& s, const float* q, const float* k,
                                  const float* v, const float* g, const float* beta,
                                  float q_scale, float* state, float* out, ThreadPool&) {
  check_delta_shape(s);
  const int64_t D = s.head_dim, Hk = s.n_k_heads, Hv = s.n_v_heads, rep = Hv / Hk;
  std::vector<double> sk(D);
  for (int64_t t = 0; t < s.n_tok; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = h / rep;
      const float* qt = q + (t * Hk + kh) * D;
      const float* kt = k + (t * Hk + kh) * D;
      const float* vt = v + (t * Hv + h) * D;
      float* S = state + h * D * D;  // [value j][key a]
      const float decay = std::exp(g[t * Hv + h]);
      const float b = beta[t * Hv + h];
      for (int64_t i = 0; i < D * D; ++i) S[i] *= decay;
      for (int64_t j = 0; j < D; ++j) {
        double acc = 0.0;
        for (int64_t a = 0; a < D; ++a) acc += double(S[j * D + a]) * kt[a];
        sk[j] = acc;
      }
      for (int64_t j = 0; j < D; ++j) {
        const float u = float(b * (vt[j] - sk[j]));
        for (int64_t a = 0; a < D; ++a) S[j * D + a] += u * kt[a];
      }
      float* ot = out + (t * Hv + h) * D;
      for (int64_t j = 0; j < D; ++j) {
        double acc = 0.0;
        for (int64_t a = 0; a < D; ++a) acc += double(S[j * D + a]) * (double(qt[a]) * q_scale);
        ot[j] = float(acc);
      }
    }
  }
}

void gdn_delta_rule_recurrent(const DeltaRuleShape& s, const float* q, const float* k,
                              const float* v, const float* g, const float* beta, float q_scale,
                              float* state, float* out, ThreadPool& pool) {
  check_delta_shape(s);
  const int64_t D = s.head_dim, Hk = s.n_k_heads, Hv = s.n_v_heads, rep = Hv / Hk;
  // Why: heads are independent, so threads split heads; per state row the decay, S·k, the rank-1
  // update and S·q are fused into two contiguous passes (the state is read twice, not four times),
  // each a vector kernel of the CPU's level (gdn_kernels).
  const gdn_kernels::Kernels& kn = gdn_kernels::best();
  pool.parallel_for(Hv, 1, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / rep;
      float* S = state + h * D * D;
      for (int64_t t = 0; t < s.n_tok; ++t) {
        const float* qt = q + (t * Hk + kh) * D;
        const float* kt = k + (t * Hk + kh) * D;
        const float* vt = v + (t * Hv + h) * D;
        float* ot = out + (t * Hv + h) * D;
        const float decay = std::exp(g[t * Hv + h]);
        const float b = beta[t * Hv + h];
        for (int64_t j = 0; j < D; ++j) {
          float* row = S + j * D;
          const float sk = kn.scale_dot(row, decay, kt, D);
          ot[j] = kn.axpy_dot(b * (vt[j] - sk), kt, row, qt, D) * q_scale;
        }
      }
    }
  });
}

// ---- gated delta rule: chunked -------------------------------------------------------------------------
//
// Within a chunk of L tokens starting from state S0, with gc[i] = g[0] + ... + g[i] (cumulative log
// decay, inclusive) and u_i the value written by token i (u_i = beta_i (v_i - S'_i k_i)):
//   S'_i  = exp(gc_i) S0 + sum_{m<i} exp(gc_i - gc_m) u_m k_m^T       (state before token i's write)
//   u_i   = beta_i (v_i - exp(gc_i) S0 k_i) - sum_{m<i} beta_i exp(gc_i - gc_m) (k_i.k_m) u_m
//   o_i   = exp(gc_i) S0 q_i + sum_{m<=i} exp(gc_i - gc_m) (q_i.k_m) u_m
//   S_end = exp(gc_L-1) S0 + sum_m exp(gc_L-1 - gc_m) u_m k_m^T
// S0 is read once per chunk (S0 k_i, S0 q_i for all i: two matrix products) and written once (a rank-L
// update); u is a unit lower-triangular solve (the WY/UT form of DeltaNet, as in llama.cpp and HF).
void gdn_delta_rule_chunked(const DeltaRuleShape& s, const float* q, const float* k,
                            const float* v, const float* g, const float* beta, float q_scale,
                            float* state, float* out, ThreadPool& pool, int chunk) {
  check_delta_shape(s);
  STRATA_REQUIRE(chunk >= 1, "gated delta rule: chunk size {} < 1", chunk);
  const int64_t D = s.head_dim, Hk = s.n_k_heads, Hv = s.n_v_heads, rep = Hv / Hk;
  const int64_t CS = std::min<int64_t>(chunk, std::max<int64_t>(s.n_tok, 1));
  const gdn_kernels::Kernels& kn = gdn_kernels::best();
  pool.parallel_for(Hv, 1, [&](int64_t h0, int64_t h1, int) {
    // Scratch per thread, grown once and reused by later calls (no allocation in steady state).
    thread_local std::vector<float> scratch;
    const size_t need = size_t(CS) + 2 * size_t(CS) * D;
    if (scratch.size() < need) scratch.resize(need);
    float* gc = scratch.data();      // [L]
    float* U = gc + CS;              // [L][D]  rhs, then u
    float* QS = U + CS * D;          // [L][D]  S0 q_i
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / rep;
      float* S = state + h * D * D;
      for (int64_t t0 = 0; t0 < s.n_tok; t0 += CS) {
        const int64_t L = std::min(CS, s.n_tok - t0);
        auto K = [&](int64_t i) { return k + ((t0 + i) * Hk + kh) * D; };
        auto Q = [&](int64_t i) { return q + ((t0 + i) * Hk + kh) * D; };
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) gc[i] = acc += g[(t0 + i) * Hv + h];
        // S0 k_i and S0 q_i for every i, one pass over the state rows, four tokens per row load.
        for (int64_t j = 0; j < D; ++j) {
          const float* row = S + j * D;
          int64_t i = 0;
          for (; i + 4 <= L; i += 4) {
            const float* ks[4] = {K(i), K(i + 1), K(i + 2), K(i + 3)};
            const float* qs[4] = {Q(i), Q(i + 1), Q(i + 2), Q(i + 3)};
            float dk[4], dq[4];
            kn.dot4(row, ks, dk, D);
            kn.dot4(row, qs, dq, D);
            for (int r = 0; r < 4; ++r) {
              U[(i + r) * D + j] = dk[r];
              QS[(i + r) * D + j] = dq[r];
            }
          }
          for (; i < L; ++i) {
            U[i * D + j] = kn.dot(row, K(i), D);
            QS[i * D + j] = kn.dot(row, Q(i), D);
          }
        }
        // rhs_i = beta_i (v_i - exp(gc_i) S0 k_i), then forward substitution in place -> u_i.
        for (int64_t i = 0; i < L; ++i) {
          const float b = beta[(t0 + i) * Hv + h];
          const float e = std::exp(gc[i]);
          const float* vi = v + ((t0 + i) * Hv + h) * D;
          float* ui = U + i * D;
          for (int64_t j = 0; j < D; ++j) ui[j] = b * (vi[j] - e * ui[j]);
          for (int64_t m = 0; m < i; ++m) {
            const float c = b * std::exp(gc[i] - gc[m]) * kn.dot(K(i), K(m), D);
            kn.axpy(-c, U + m * D, ui, D);
          }
        }
        // o_i = exp(gc_i) S0 q_i + sum_{m<=i} exp(gc_i - gc_m) (q_i.k_m) u_m
        for (int64_t i = 0; i < L; ++i) {
          float* oi = out + ((t0 + i) * Hv + h) * D;
          const float e = std::exp(gc[i]);
          for (int64_t j = 0; j < D; ++j) oi[j] = e * QS[i * D + j];
          for (int64_t m = 0; m <= i; ++m) {
            const float c = std::exp(gc[i] - gc[m]) * kn.dot(Q(i), K(m), D);
            kn.axpy(c, U + m * D, oi, D);
          }
          for (int64_t j = 0; j < D; ++j) oi[j] *= q_scale;
        }
        // S_end = exp(gc_last) S0 + sum_m exp(gc_last - gc_m) u_m k_m^T
        const float e_last = std::exp(gc[L - 1]);
        for (int64_t m = 0; m < L; ++m) QS[m] = std::exp(gc[L - 1] - gc[m]);  // reuse as weights
        for (int64_t j = 0; j < D; ++j) {
          float* row = S + j * D;
          for (int64_t a = 0; a < D; ++a) row[a] *= e_last;
          int64_t m = 0;
          for (; m + 4 <= L; m += 4) {
            const float c[4] = {QS[m] * U[m * D + j], QS[m + 1] * U[(m + 1) * D + j],
                                QS[m + 2] * U[(m + 2) * D + j], QS[m + 3] * U[(m + 3) * D + j]};
            const float* ks[4] = {K(m), K(m + 1), K(m + 2), K(m + 3)};
            kn.axpy4(c, ks, row, D);
          }
          for (; m < L; ++m) kn.axpy(QS[m] * U[m * D + j], K(m), row, D);
        }
      }
    }
  });
}

// ---- gated RMSNorm ---------------------------------------------------------------------------------

void gated_rms_norm_ref(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D,
                        float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[r * D + i]) * x[r * D + i];
    const float scale = float(1.0 / std::sqrt(ss / double(D) + eps));
    for (int64_t i = 0; i < D; ++i) {
      const double zi = z[r * D + i];
      y[r * D + i] = float(x[r * D + i] * scale * w[i] * (zi / (1.0 + std::exp(-zi))));
    }
  }
}

void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D,
                    float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * D;
    const float* zr = z + r * D;
    float* yr = y + r * D;
    const float scale = 1.0f / std::sqrt(dot(xr, xr, D) / float(D) + eps);
    for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * scale * w[i] * silu(zr[i]);
  }
}

// ---- gated attention, shared expert gate -------------------------------------------------------------

void split_q_gate(const float* qg, int64_t n_tok, int64_t n_head, int64_t D, float* q, float* gate) {
  for (int64_t r = 0; r < n_tok * n_head; ++r) {
    std::memcpy(q + r * D, qg + r * 2 * D, sizeof(float) * D);
    std::memcpy(gate + r * D, qg + r * 2 * D + D, sizeof(float) * D);
  }
}

void mul_sigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(gate[i]);
}

void add_sigmoid_scaled(float* y, const float* x, const float* logit, int64_t n_tok, int64_t n) {
  for (int64_t t = 0; t < n_tok; ++t) axpy(sigmoid(logit[t]), x + t * n, y + t * n, n);
}

}  // namespace strata
