#pragma once
// One attention head's input, prepared by one warp: the head's rmsnorm (q_norm or k_norm) with the exact
// summation order of ops.cu's rmsnorm_kernel, then the NeoX rope from precomputed angles (rope_cos_sin).
// Device code only, shared by attn_prep (ops_fused.cu: one warp per head of the call) and the one-token
// attention kernel that prepares its own heads (attn_tile.cu, ops::prep_attention_q8), so both give the
// same values bit for bit.
#include <cstdint>

namespace strata::cuda::prep {

constexpr int kNormThreads = 256;  // ops::rmsnorm's block size, whose summation order head_sum_sq follows

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// sum(x[i]^2) in double for one head row of n values, in exactly the order of ops.cu's rmsnorm_kernel
// (256 threads: thread j sums x[j], x[j+256], ... from 0; each warp's 32 partials reduced by the same
// xor butterfly; the 8 warp sums added in warp order). One warp emulates the 8 warps one after the
// other; warps whose threads hold no value contribute an exact 0 and are skipped. xv[u] = x[lane + 32u]
// (the row in registers; LV = values per lane; a head has n <= 32 * LV). The order does not depend on
// LV (values past n are skipped), so kernels with different LV agree. Result in every lane.
template <int LV>
__device__ __forceinline__ double head_sum_sq(const float (&xv)[LV], int n, int lane) {
  double r = 0.0;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) {
    if (w * 32 >= n) break;
    double s = 0.0;
#pragma unroll
    for (int m = 0; m < (LV + kNormThreads / 32 - 1) / (kNormThreads / 32); ++m) {  // x[32w + lane + 256m] = xv[w + 8m]
      const int u = w + (kNormThreads / 32) * m;
      if (u < LV && lane + 32 * u < n) s += static_cast<double>(xv[u]) * xv[u];
    }
    s = warp_sum(s);
    r = w == 0 ? s : r + s;
  }
  return r;
}

// One head's loads, lane's part: x[lane + 32u], its norm weight, and the angle pair of that dim (dim i <
// half pairs with i + half through angle i; dim i in [half, n_rot) with i - half; dims past n_rot: none).
template <int LV>
struct HeadIn {
  float x[LV], w[LV], ca[LV], cb[LV];
};

// The lane's norm weights of one head (w: [D]). Weights only (no kernel writes them), so a kernel may load
// them before its PDL wait (cuda/pdl.cuh).
template <int LV>
__device__ __forceinline__ void load_head_weight(const float* w, int D, int lane, HeadIn<LV>& h) {
#pragma unroll
  for (int u = 0; u < LV; ++u) h.w[u] = lane + 32 * u < D ? w[lane + 32 * u] : 0.0f;
}

// The lane's values of one head and their angles (x: [D]; c: [n_rot/2][2], the token's angles).
template <int LV>
__device__ __forceinline__ void load_head_input(const float* x, const float* c, int D, int n_rot, int lane,
                                                HeadIn<LV>& h) {
  const int half = n_rot / 2;
#pragma unroll
  for (int u = 0; u < LV; ++u) {
    const int i = lane + 32 * u;
    h.x[u] = i < D ? x[i] : 0.0f;
    const int ci = i < half ? i : i - half;
    const bool rot = i < n_rot;
    h.ca[u] = rot ? c[2 * ci] : 0.0f;
    h.cb[u] = rot ? c[2 * ci + 1] : 0.0f;
  }
}

// x, w: [D] (the head, its norm weight); c: [n_rot/2][2] (the token's angles). Every load is issued at
// once (why: attn_prep's first version loaded the angles after the norm, a dependent round trip more).
template <int LV>
__device__ __forceinline__ void load_head(const float* x, const float* w, const float* c, int D, int n_rot, int lane,
                                          HeadIn<LV>& h) {
  load_head_weight(w, D, lane, h);
  load_head_input(x, c, D, n_rot, lane, h);
}

// out[u] = the normed and rotated value of dim lane + 32u (ops.cu rmsnorm_kernel's then rope_neox_kernel's
// arithmetic). y: [D] f32 of the warp's own (shared memory), the normed head, so that the rope can pair
// any two dims. Ends with a __syncwarp after the warp's last read of y: the caller may overwrite it.
template <int LV>
__device__ __forceinline__ void norm_rope_head(const HeadIn<LV>& h, int D, int n_rot, float eps, int lane, float* y,
                                               float (&out)[LV]) {
  const double sum = head_sum_sq(h.x, D, lane);
  const float mean = static_cast<float>(sum / static_cast<double>(D));
  const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int u = 0; u < LV; ++u)
    if (lane + 32 * u < D) y[lane + 32 * u] = h.x[u] * scale * h.w[u];
  __syncwarp();
  const int half = n_rot / 2;
#pragma unroll
  for (int u = 0; u < LV; ++u) {
    const int i = lane + 32 * u;
    if (i >= D) break;
    float val = y[i];
    if (i < half) {
      val = fmaf(y[i], h.ca[u], -(y[i + half] * h.cb[u]));
    } else if (i < n_rot) {
      val = fmaf(y[i - half], h.cb[u], y[i] * h.ca[u]);
    }
    out[u] = val;
  }
  __syncwarp();
}

}  // namespace strata::cuda::prep
