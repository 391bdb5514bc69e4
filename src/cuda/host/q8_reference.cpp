// CPU references of the int8-activation decode kernels (contract: q8_reference.h, cuda/q8_kernels.cuh).
#include "cuda/host/q8_reference.h"
#include "cuda/host/q8_reference_low.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "quant/blocks.h"

namespace strata::cuda::q8ref {
namespace {

using q::fp16_to_fp32;

uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// Scale and min of sub-block j of a Q4_K/Q5_K super-block (quant/blocks.h k4_scale_min, restated).
void scale_min(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- one "task" of each format: the unit a GPU lane computes (kernel: q8_formats.cuh) ----
// xq / xds point at the activations of the task's (super-)block's first column.

// Q4_0 block (18 bytes: d f16 | qs[16]; value l: qs[l] & 15, value l + 16: qs[l] >> 4; minus 8).
// sum (nib - 8) * d * dx * qx = d * (dx * sum(nib * qx) - 8 * dx * sum(qx)).
// (d_bits: the block's f16 scale; qs: its 16 code bytes.)
float task_q4_0_parts(uint16_t d_bits, const uint8_t* qs, const int8_t* xq, const Q8Ds* xds) {
  int sumi = 0;
  for (int l = 0; l < 16; ++l) sumi += (qs[l] & 15) * xq[l] + (qs[l] >> 4) * xq[l + 16];
  return fp16_to_fp32(d_bits) * (xds[0].d * float(sumi) - 8.f * xds[0].s);
}
float task_q4_0(const uint8_t* b, const int8_t* xq, const Q8Ds* xds) { return task_q4_0_parts(rd16(b), b + 2, xq, xds); }

// Q4_0_X8 task tt < 8 (quant/q4_0_x8.h): Q4_0 block tt of the group, d at 2tt, codes at 16 + 16tt, its
// activations the group's 32-value block tt. task_q4_0's arithmetic.
float task_q4_0_x8(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  return task_q4_0_parts(rd16(b + 2 * tt), b + 16 + 16 * tt, xq + 32 * tt, xds + tt);
}

// Q8_0 block (34 bytes: d f16 | qs[32] int8).
float task_q8_0(const uint8_t* b, const int8_t* xq, const Q8Ds* xds) {
  int sumi = 0;
  for (int l = 0; l < 32; ++l) sumi += int(int8_t(b[2 + l])) * xq[l];
  return fp16_to_fp32(rd16(b)) * (xds[0].d * float(sumi));
}

// Q4_K / Q5_K task tt < 4: sub-blocks j = 2tt (low nibbles of qs[32tt..32tt+32)) and 2tt+1 (high
// nibbles); Q5_K adds bit j of qh[l] as bit 4. Value = d*sc*q - dmin*m, so the task is
// d * sum_j dx_j * sumi_j * sc_j - dmin * sum_j (dx_j * sum qx_j) * m_j.
template <bool kQ5>
float task_k45(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const float d = fp16_to_fp32(rd16(b)), dmin = fp16_to_fp32(rd16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;                     // Q5_K only
  const uint8_t* qs = b + (kQ5 ? 48 : 16) + 32 * tt;
  const int j = 2 * tt;
  int sumi0 = 0, sumi1 = 0;
  for (int l = 0; l < 32; ++l) {
    int lo = qs[l] & 15, hi = qs[l] >> 4;
    if constexpr (kQ5) lo |= ((qh[l] >> j) & 1) << 4, hi |= ((qh[l] >> (j + 1)) & 1) << 4;
    sumi0 += lo * xq[64 * tt + l];
    sumi1 += hi * xq[64 * tt + 32 + l];
  }
  int sc0, m0, sc1, m1;
  scale_min(j, scales, sc0, m0);
  scale_min(j + 1, scales, sc1, m1);
  const Q8Ds a = xds[j], c = xds[j + 1];
  return d * (a.d * float(sumi0) * float(sc0) + c.d * float(sumi1) * float(sc1)) -
         dmin * (a.s * float(m0) + c.s * float(m1));
}

// Q6_K task tt < 4 (half = tt/2, par = tt%2): ql[64half + 32par + l], qh[32half + l], l < 32, give
// the values of group par (low nibble, qh bits 2par..) and par + 2 (high nibble, qh bits 4+2par..) of the
// half, each minus 32; 16-value scales sc[8half + 2par + {0,1}] and sc[8half + 2par + 4 + {0,1}].
// (b: the block's ql | qh | scales; d_bits: its f16 scale.)
float task_q6_k_parts(const uint8_t* b, uint16_t d_bits, int tt, const int8_t* xq, const Q8Ds* xds) {
  const int half = tt >> 1, par = tt & 1;
  const uint8_t* ql = b + 64 * half + 32 * par;
  const uint8_t* qh = b + 128 + 32 * half;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * half + 2 * par;
  const float d = fp16_to_fp32(d_bits);
  const int ba = 4 * half + par, bb = ba + 2;  // activation blocks of the two groups
  int sa[2] = {0, 0}, sb[2] = {0, 0};
  for (int l = 0; l < 32; ++l) {
    const int lo = ((ql[l] & 15) | (((qh[l] >> (2 * par)) & 3) << 4)) - 32;
    const int hi = ((ql[l] >> 4) | (((qh[l] >> (4 + 2 * par)) & 3) << 4)) - 32;
    sa[l >> 4] += lo * xq[32 * ba + l];
    sb[l >> 4] += hi * xq[32 * bb + l];
  }
  return d * (xds[ba].d * float(sc[0] * sa[0] + sc[1] * sa[1]) + xds[bb].d * float(sc[4] * sb[0] + sc[5] * sb[1]));
}
float task_q6_k(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  return task_q6_k_parts(b, rd16(b + 208), tt, xq, xds);
}

// Q6_K_X8 task tt < 32 (quant/q6_k_x8.h): task tt % 4 of super-block sb = tt / 4, its body at 16 + 208sb and
// d at 2sb, its activations the group's 256 values from 256sb. task_q6_k's arithmetic.
float task_q6_k_x8(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const int sb = tt >> 2;
  return task_q6_k_parts(b + 16 + 208 * sb, rd16(b + 2 * sb), tt & 3, xq + 256 * sb, xds + 8 * sb);
}

using low::Format;
Format format_of(GgmlType t) {
  Format f;
  if (low::format_of(t, f)) return f;
  switch (t) {
    case GgmlType::Q4_0: return {32, 18, 1};
    case GgmlType::Q4_0_X8: return {256, 144, 8};
    case GgmlType::Q8_0: return {32, 34, 1};
    case GgmlType::Q4_K: return {256, 144, 4};
    case GgmlType::Q5_K: return {256, 176, 4};
    case GgmlType::Q6_K: return {256, 210, 4};
    case GgmlType::Q6_K_X8: return {2048, 1680, 32};
    case GgmlType::Q6_K_P: return {256, 224, 4};
    default: throw Error("q8: type " + std::string(type_name(t)) + " has no int8-activation kernel");
  }
}

float task(GgmlType t, const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  switch (t) {
    case GgmlType::Q4_0: return task_q4_0(b, xq, xds);
    case GgmlType::Q4_0_X8: return task_q4_0_x8(b, tt, xq, xds);
    case GgmlType::Q8_0: return task_q8_0(b, xq, xds);
    case GgmlType::Q4_K: return task_k45<false>(b, tt, xq, xds);
    case GgmlType::Q5_K: return task_k45<true>(b, tt, xq, xds);
    case GgmlType::Q6_K: return task_q6_k(b, tt, xq, xds);
    case GgmlType::Q6_K_X8: return task_q6_k_x8(b, tt, xq, xds);
    case GgmlType::Q6_K_P: return task_q6_k(b, tt, xq, xds);  // (the Q6_K block at the start of its 224 bytes)
    default: return low::task(t, b, tt, xq, xds);
  }
}

int slot_of(const int32_t* table, const int32_t* ids, int64_t p) {
  const int32_t e = ids[p];
  return e < 0 ? -1 : table[e];
}

}  // namespace

bool supported(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_0_X8:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q6_K_X8:
    case GgmlType::Q6_K_P: return true;
    default: return low_bit(t);
  }
}

int min_row_align(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return 4;
    case GgmlType::IQ4_XS: case GgmlType::IQ1_M: return 8;
    default: return 2;
  }
}

bool low_bit(GgmlType t) {
  Format f;
  return low::format_of(t, f);
}

int64_t block_values(GgmlType t) { return format_of(t).vals; }

void check_matvec_shape(GgmlType t, int64_t cols, int64_t row_bytes_, const char* what) {
  STRATA_REQUIRE(supported(t), "{}: type {} has no int8-activation kernel", what, type_name(t));
  const int64_t bv = block_values(t);
  STRATA_REQUIRE(cols > 0 && cols % bv == 0, "{}: {} columns is not a positive multiple of the {} block size {}",
                 what, cols, type_name(t), bv);
  STRATA_REQUIRE(row_bytes_ >= int64_t(row_bytes(t, uint64_t(cols))), "{}: row stride {} is smaller than a {} row of {} values",
                 what, row_bytes_, type_name(t), cols);
}

void quantize_block(const float* v, int8_t* q, Q8Ds& ds) {
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float d = amax / 127.f;
  int sum = 0;
  for (int i = 0; i < 32; ++i) {
    const int qi = d > 0.f ? std::clamp(int(std::round(v[i] / d)), -127, 127) : 0;
    q[i] = int8_t(qi);
    sum += qi;
  }
  ds.d = d;
  ds.s = d * float(sum);
}

void quantize(const float* x, int64_t n, int64_t cols, int8_t* q, Q8Ds* ds) {
  STRATA_REQUIRE(cols > 0 && cols % 32 == 0, "q8 quantize: {} columns is not a positive multiple of 32", cols);
  for (int64_t b = 0; b < n * (cols / 32); ++b) quantize_block(x + 32 * b, q + 32 * b, ds[b]);
}

float rmsnorm_scale(const float* xr, int64_t cols, float eps) {
  constexpr int kThreads = 256;
  double part[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    double s = 0.0;
    for (int64_t c = i; c < cols; c += kThreads) s += double(xr[c]) * xr[c];
    part[i] = s;
  }
  double total = 0.0;
  for (int wp = 0; wp < kThreads / 32; ++wp) {
    double v[32], nv[32];
    std::copy(part + 32 * wp, part + 32 * wp + 32, v);
    for (int o = 16; o > 0; o >>= 1) {
      for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ o];
      std::copy(nv, nv + 32, v);
    }
    total = wp == 0 ? v[0] : total + v[0];
  }
  const float mean = float(total / double(cols));
  return 1.0f / std::sqrt(mean + eps);
}

void rmsnorm_quantize(const float* x, const float* w, int64_t n, int64_t cols, float eps, float* y, int8_t* q,
                      Q8Ds* ds) {
  STRATA_REQUIRE(cols > 0 && cols % 32 == 0, "q8 rmsnorm_quantize: {} columns is not a positive multiple of 32", cols);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * cols;
    float* yr = y + t * cols;
    const float scale = rmsnorm_scale(xr, cols, eps);
    for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * scale * w[c];
    quantize(yr, 1, cols, q + t * cols, ds + t * (cols / 32));
  }
}

float row_dot(GgmlType type, const uint8_t* row, int64_t cols, const int8_t* xq, const Q8Ds* xds) {
  const Format f = format_of(type);
  float acc = 0.f;
  for (int64_t b = 0; b < cols / f.vals; ++b)
    for (int tt = 0; tt < f.tasks; ++tt)
      acc += task(type, row + b * f.bytes, tt, xq + b * f.vals, xds + b * (f.vals / 32));
  return acc;
}

void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes_, const int8_t* xq,
            const Q8Ds* xds, int64_t n, float* y, bool accumulate) {
  check_matvec_shape(type, cols, row_bytes_, "q8 matvec");
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      const float d = row_dot(type, wb + r * row_bytes_, cols, xq + t * cols, xds + t * (cols / 32));
      float& out = y[t * rows + r];
      out = accumulate ? out + d : d;
    }
}

void norm_matvec_early(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes_, const float* x,
                       const float* nw, float eps, float* xn, float* y, bool accumulate) {
  STRATA_REQUIRE(cols > 0 && cols % 32 == 0, "q8 norm_matvec_early: {} columns is not a positive multiple of 32", cols);
  check_matvec_shape(type, cols, row_bytes_, "q8 norm_matvec_early");
  const float scale = rmsnorm_scale(x, cols, eps);
  std::vector<float> v(static_cast<size_t>(cols), 0.f);
  std::vector<int8_t> q(static_cast<size_t>(cols));
  std::vector<Q8Ds> ds(static_cast<size_t>(cols / 32));
  for (int64_t c = 0; c < cols; ++c) {
    xn[c] = x[c] * scale * nw[c];
    v[size_t(c)] = x[c] * nw[c];
  }
  quantize(v.data(), 1, cols, q.data(), ds.data());
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r) {
    const float d = row_dot(type, wb + r * row_bytes_, cols, q.data(), ds.data()) * scale;
    y[r] = accumulate ? y[r] + d : d;
  }
}

float silu_mul(float g, float u) { return g / (1.f + std::exp(-g)) * u; }

bool moe_supported(const ExpertView& v) {
  if (!supported(v.gate_type) || !supported(v.up_type) || !supported(v.down_type)) return false;
  // The regrouped storage types: Q6_K_X8 is for dense products only, Q6_K_P for down matrices only.
  for (GgmlType t : {v.gate_type, v.up_type, v.down_type})
    if (t == GgmlType::Q6_K_X8) return false;
  if (v.gate_type == GgmlType::Q6_K_P || v.up_type == GgmlType::Q6_K_P) return false;
  // gate_up's pairs (q8d::dispatch_pair): a low-bit gate or up type only with the same type.
  if ((low_bit(v.gate_type) || low_bit(v.up_type)) && v.gate_type != v.up_type) return false;
  if (v.n_embd <= 0 || v.n_ff <= 0 || v.n_embd % 32 != 0 || v.n_ff % 32 != 0) return false;
  if (v.n_embd % block_values(v.gate_type) != 0 || v.n_embd % block_values(v.up_type) != 0 ||
      v.n_ff % block_values(v.down_type) != 0)
    return false;
  // The kernels' loads need 2-byte aligned rows in every slot (Q2_K 4-byte, IQ4_XS / IQ1_M 8-byte:
  // min_row_align).
  const int64_t base = int64_t(reinterpret_cast<uintptr_t>(v.slots));
  const struct {
    GgmlType t;
    int64_t off, rb;
  } tensors[] = {{v.gate_type, v.gate_off, int64_t(row_bytes(v.gate_type, uint64_t(v.n_embd)))},
                 {v.up_type, v.up_off, int64_t(row_bytes(v.up_type, uint64_t(v.n_embd)))},
                 {v.down_type, v.down_off, int64_t(row_bytes(v.down_type, uint64_t(v.n_ff)))}};
  for (const auto& e : tensors) {
    const int64_t a = min_row_align(e.t);
    if (base % a != 0 || v.slot_bytes % a != 0 || e.off % a != 0 || e.rb % a != 0) return false;
  }
  return true;
}

void moe_gate_up(const ExpertView& v, const int32_t* table, const int8_t* xq, const Q8Ds* xds, const int32_t* ids,
                 int64_t n, int k, int8_t* hq, Q8Ds* hds) {
  STRATA_REQUIRE(moe_supported(v), "q8 moe_gate_up: unsupported expert view");
  const int64_t grb = int64_t(row_bytes(v.gate_type, uint64_t(v.n_embd)));
  const int64_t urb = int64_t(row_bytes(v.up_type, uint64_t(v.n_embd)));
  const int64_t xb = v.n_embd / 32, hb = v.n_ff / 32;
  std::vector<float> h(size_t(v.n_ff));
  for (int64_t p = 0; p < n * k; ++p) {
    const int slot = slot_of(table, ids, p);
    if (slot < 0) continue;
    const uint8_t* base = v.slots + int64_t(slot) * v.slot_bytes;
    const int64_t t = p / k;
    for (int64_t r = 0; r < v.n_ff; ++r) {
      const float g = row_dot(v.gate_type, base + v.gate_off + r * grb, v.n_embd, xq + t * v.n_embd, xds + t * xb);
      const float u = row_dot(v.up_type, base + v.up_off + r * urb, v.n_embd, xq + t * v.n_embd, xds + t * xb);
      h[size_t(r)] = silu_mul(g, u);
    }
    quantize(h.data(), 1, v.n_ff, hq + p * v.n_ff, hds + p * hb);
  }
}

void moe_down(const ExpertView& v, const int32_t* table, const int8_t* hq, const Q8Ds* hds, const int32_t* ids,
              const float* wts, int64_t n, int k, float* x) {
  STRATA_REQUIRE(moe_supported(v), "q8 moe_down: unsupported expert view");
  const int64_t drb = int64_t(row_bytes(v.down_type, uint64_t(v.n_ff)));
  const int64_t hb = v.n_ff / 32;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < v.n_embd; ++r) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) {
        const int64_t p = t * k + j;
        const int slot = slot_of(table, ids, p);
        if (slot < 0) continue;
        const uint8_t* row = v.slots + int64_t(slot) * v.slot_bytes + v.down_off + r * drb;
        acc += wts[p] * row_dot(v.down_type, row, v.n_ff, hq + p * v.n_ff, hds + p * hb);
      }
      x[t * v.n_embd + r] += acc;
    }
}

}  // namespace strata::cuda::q8ref
