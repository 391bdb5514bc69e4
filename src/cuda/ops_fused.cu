// Fused attention-input op and the per-forward rope angles (contracts in cuda/ops_fused.cuh).
// attn_prep repeats the arithmetic of ops.cu's rmsnorm_kernel, rope_neox_kernel and kv_store_kernel
// value for value; where a value depends on an order of operations (the rmsnorm's double sum) the
// kernel reproduces that order exactly (see head_sum_sq).
#include "cuda/ops_fused.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/attn_prep_head.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"

namespace strata::cuda::ops {

namespace {

constexpr int kPrepWarps = 4;  // attn_prep: heads per block (one warp each)

using prep::head_sum_sq;
constexpr int kLaneVals = kAttnPrepMaxDim / 32;  // values per lane of a head row, at most

// pos: [n_tok]; cs: [n_tok][n_rot/2][2]. One block per token; angle i by its own thread, built exactly
// as rope_neox_kernel builds it (i multiplications from pos).
__global__ void rope_cos_sin_kernel(const int32_t* pos, int n_rot, float theta_scale, float* cs) {
  const int half = n_rot / 2;
  const int64_t t = blockIdx.x;
  float* c = cs + t * n_rot;  // [half][2]
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = static_cast<float>(pos[t]);
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    c[2 * i] = static_cast<float>(cos(static_cast<double>(theta)));
    c[2 * i + 1] = static_cast<float>(sin(static_cast<double>(theta)));
  }
}

// One warp per (token, head) of the n_head query heads and n_head_kv key heads of every token (query
// heads first); the warp of key head h also stores value head h. grid: ceil(n_tok*(H+Hkv)/kPrepWarps)
// blocks of 32*kPrepWarps threads; dynamic shared memory: kPrepWarps * head_dim floats (a normed head,
// so the rope can pair any two of its dims). LV: values per lane (head_dim, head_dim_v <= 32 * LV).
// Every global load (the head, its norm weights, the token's KvRef, the rope angles a lane needs, the
// value head) is issued at the start, before the norm's arithmetic. Why: the first version loaded the
// angles, the KvRef and the value head only after the norm, adding two dependent memory round trips to a
// kernel whose time is latency (ncu: 6.9 us per layer for ~40 KB). The arithmetic is unchanged.
template <int LV>
__global__ void __launch_bounds__(32 * kPrepWarps)
    attn_prep_kernel(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
                     const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
                     int layer, AttnPrepShape s, float* q_out) {
  extern __shared__ float prep_sh[];  // [kPrepWarps][head_dim]
  pdl_wait();  // (PDL: everything below reads the q|k|v product or writes the KV cache)
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int heads = s.n_head + s.n_head_kv;
  const int64_t wi = blockIdx.x * int64_t(kPrepWarps) + warp;
  if (wi >= n_tok * heads) return;  // whole warps only; no block-wide barrier below
  const int64_t t = wi / heads;
  const int j = static_cast<int>(wi % heads);
  const bool is_q = j < s.n_head;
  const int h = is_q ? j : j - s.n_head;
  const int D = s.head_dim;
  const float* x = is_q ? q + t * q_ld + int64_t(h) * D : k + t * k_ld + int64_t(h) * D;  // [D]
  const float* w = is_q ? q_norm : k_norm;                                                 // [D]
  const float* c = cs + t * s.n_rot;                                                       // [half][2]
  const float* vi = v + t * v_ld + int64_t(h) * s.head_dim_v;                              // [head_dim_v] (key heads)
  float* y = prep_sh + warp * D;                                                           // [D]

  // Every load in flight at once: the head, its norm weights, the angles of this lane's dims, the KvRef,
  // the value head.
  prep::HeadIn<LV> hin;
  float vv[LV];
  const KvRef r = refs[t];
  prep::load_head(x, w, c, D, s.n_rot, lane, hin);
#pragma unroll
  for (int u = 0; u < LV; ++u) {
    const int i = lane + 32 * u;
    vv[u] = !is_q && i < s.head_dim_v ? vi[i] : 0.0f;
  }
  float val[LV];
  prep::norm_rope_head(hin, D, s.n_rot, s.eps, lane, y, val);

  // The store. x is fully read (into registers) before the norm, so q_out may alias q.
  const int64_t at = static_cast<int64_t>(layer) * r.n_ctx + r.pos;  // row index in [n_layer][n_ctx]
  const int64_t k_row = int64_t(s.n_head_kv) * D, v_row = int64_t(s.n_head_kv) * s.head_dim_v;
  float* qo = q_out + (t * s.n_head + h) * D;     // [D] (query heads)
  uint16_t* ko = r.k + at * k_row + int64_t(h) * D;  // [D] (key heads)
#pragma unroll
  for (int u = 0; u < LV; ++u) {
    const int i = lane + 32 * u;
    if (i >= D) break;
    if (is_q)
      qo[i] = val[u];
    else
      ko[i] = __half_as_ushort(__float2half_rn(val[u]));
  }
  if (!is_q) {
    uint16_t* vo = r.v + at * v_row + int64_t(h) * s.head_dim_v;
#pragma unroll
    for (int u = 0; u < LV; ++u) {
      const int i = lane + 32 * u;
      if (i < s.head_dim_v) vo[i] = __half_as_ushort(__float2half_rn(vv[u]));
    }
  }
}

// The first attn_prep kernel (STRATA_CUDA_ATTN_PREP=first, for comparisons on the device): the same
// arithmetic, with the angles, the KvRef and the value head loaded after the norm.
__global__ void __launch_bounds__(32 * kPrepWarps)
    attn_prep_first_kernel(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
                     const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
                     int layer, AttnPrepShape s, float* q_out) {
  extern __shared__ float prep_sh[];  // [kPrepWarps][head_dim]
  pdl_wait();  // (launched through pdl::launch like the default kernel)
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int heads = s.n_head + s.n_head_kv;
  const int64_t wi = blockIdx.x * int64_t(kPrepWarps) + warp;
  if (wi >= n_tok * heads) return;  // whole warps only; no block-wide barrier below
  const int64_t t = wi / heads;
  const int j = static_cast<int>(wi % heads);
  const bool is_q = j < s.n_head;
  const int h = is_q ? j : j - s.n_head;
  const int D = s.head_dim;
  const float* x = is_q ? q + t * q_ld + int64_t(h) * D : k + t * k_ld + int64_t(h) * D;  // [D]
  const float* w = is_q ? q_norm : k_norm;                                                 // [D]
  float* y = prep_sh + warp * D;                                                           // [D]

  // The head and its norm weights into registers first: every load in flight at once.
  float xv[kLaneVals], wv[kLaneVals];
#pragma unroll
  for (int u = 0; u < kLaneVals; ++u) {
    const int i = lane + 32 * u;
    xv[u] = i < D ? x[i] : 0.0f;
    wv[u] = i < D ? w[i] : 0.0f;
  }
  // rmsnorm (ops.cu rmsnorm_kernel's arithmetic)
  const double sum = head_sum_sq(xv, D, lane);
  const float mean = static_cast<float>(sum / static_cast<double>(D));
  const float scale = 1.0f / sqrtf(mean + s.eps);
#pragma unroll
  for (int u = 0; u < kLaneVals; ++u)
    if (lane + 32 * u < D) y[lane + 32 * u] = xv[u] * scale * wv[u];
  __syncwarp();

  // rope (rope_neox_kernel's arithmetic) and the store
  const int half = s.n_rot / 2;
  const float* c = cs + t * s.n_rot;  // [half][2]
  const KvRef r = refs[t];
  const int64_t at = static_cast<int64_t>(layer) * r.n_ctx + r.pos;  // row index in [n_layer][n_ctx]
  const int64_t k_row = int64_t(s.n_head_kv) * D, v_row = int64_t(s.n_head_kv) * s.head_dim_v;
  float* qo = q_out + (t * s.n_head + h) * D;     // [D] (query heads)
  uint16_t* ko = r.k + at * k_row + int64_t(h) * D;  // [D] (key heads)
  // x is fully read (into y) before the __syncwarp above, so q_out may alias q.
  for (int i = lane; i < D; i += 32) {
    float val = y[i];
    if (i < half) {
      val = fmaf(y[i], c[2 * i], -(y[i + half] * c[2 * i + 1]));
    } else if (i < s.n_rot) {
      const int i0 = i - half;
      val = fmaf(y[i0], c[2 * i0 + 1], y[i] * c[2 * i0]);
    }
    if (is_q)
      qo[i] = val;
    else
      ko[i] = __half_as_ushort(__float2half_rn(val));
  }
  if (!is_q) {
    const float* vi = v + t * v_ld + int64_t(h) * s.head_dim_v;  // [head_dim_v]
    uint16_t* vo = r.v + at * v_row + int64_t(h) * s.head_dim_v;
    for (int i = lane; i < s.head_dim_v; i += 32) vo[i] = __half_as_ushort(__float2half_rn(vi[i]));
  }
}

}  // namespace

void rope_cos_sin(const int32_t* pos, int64_t n_tok, int n_rot, float base, float* cs, cudaStream_t stream) {
  STRATA_REQUIRE(n_rot >= 2 && n_rot % 2 == 0 && n_rot <= cpu::kMaxRot,
                 "rope_cos_sin: n_rot {} must be even, in [2, {}]", n_rot, cpu::kMaxRot);
  STRATA_REQUIRE(n_tok <= 0x7fffffff, "rope_cos_sin: {} tokens", n_tok);
  if (n_tok <= 0) return;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));  // as cpu::rope_neox
  const int threads = n_rot / 2 <= 64 ? 64 : n_rot / 2 <= 128 ? 128 : 256;
  rope_cos_sin_kernel<<<static_cast<unsigned>(n_tok), threads, 0, stream>>>(pos, n_rot, theta_scale, cs);
  CUDA_CHECK_LAUNCH();
}

namespace {
EnvSwitch g_prep_first;
}  // namespace

void set_attn_prep_first(bool on) { g_prep_first.set(on); }

bool attn_prep_first() {
  return g_prep_first.get([] {
    const char* e = std::getenv("STRATA_CUDA_ATTN_PREP");
    return e != nullptr && std::string(e) == "first";
  });
}

void attn_prep(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
               const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
               int layer, const AttnPrepShape& s, float* q_out, cudaStream_t stream) {
  STRATA_REQUIRE(s.n_head_kv >= 1 && s.n_head >= 1 && s.head_dim >= 1 && s.head_dim_v >= 1 &&
                     s.head_dim <= kAttnPrepMaxDim && s.head_dim_v <= kAttnPrepMaxDim,
                 "attn_prep: {} query / {} KV heads of {}/{} (head sizes must be in [1, {}])", s.n_head,
                 s.n_head_kv, s.head_dim, s.head_dim_v, kAttnPrepMaxDim);
  STRATA_REQUIRE(s.n_rot >= 2 && s.n_rot % 2 == 0 && s.n_rot <= s.head_dim,
                 "attn_prep: n_rot {} must be even, in [2, head_dim {}]", s.n_rot, s.head_dim);
  STRATA_REQUIRE(q_ld >= int64_t(s.n_head) * s.head_dim && k_ld >= int64_t(s.n_head_kv) * s.head_dim &&
                     v_ld >= int64_t(s.n_head_kv) * s.head_dim_v && layer >= 0,
                 "attn_prep: row strides {}/{}/{} shorter than the rows, or layer {} < 0", q_ld, k_ld, v_ld, layer);
  STRATA_REQUIRE(q_out != q || q_ld == int64_t(s.n_head) * s.head_dim,
                 "attn_prep: q_out may alias q only when q's rows are packed");
  if (n_tok <= 0) return;
  const int64_t warps = n_tok * (s.n_head + s.n_head_kv);
  const int64_t blocks = (warps + kPrepWarps - 1) / kPrepWarps;
  STRATA_REQUIRE(blocks <= 0x7fffffff, "attn_prep: {} tokens x {} heads is beyond the grid", n_tok,
                 s.n_head + s.n_head_kv);
  const size_t shmem = size_t(kPrepWarps) * size_t(s.head_dim) * sizeof(float);
  const int dmax = s.head_dim > s.head_dim_v ? s.head_dim : s.head_dim_v;
  auto launch = [&](auto kern) {
    pdl::launch(kern, static_cast<unsigned>(blocks), 32 * kPrepWarps, shmem, stream, q, q_ld, k, k_ld, v, v_ld, q_norm,
                k_norm, cs, refs, n_tok, layer, s, q_out);
  };
  if (attn_prep_first()) launch(attn_prep_first_kernel);
  else if (dmax <= 128) launch(attn_prep_kernel<4>);
  else if (dmax <= 256) launch(attn_prep_kernel<8>);
  else launch(attn_prep_kernel<kLaneVals>);
}

}  // namespace strata::cuda::ops
