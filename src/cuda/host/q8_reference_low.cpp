// CPU references of the low-bit formats' int8-activation tasks (q8_reference_low.h).
#include "cuda/host/q8_reference_low.h"

#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq_tables.h"

namespace strata::cuda::q8ref::low {
namespace {

using q::fp16_to_fp32;

uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// Q2_K task tt < 4 (h = tt/2, jp = 2 (tt%2)): blocks j = jp, jp + 1 of half h; value 128h + 32j + l is
// bits 2j of qs[32h + l] (qs at 16), times d * (scales[8h + 2j + l/16] & 15), minus dmin * (that byte >> 4).
// Per block: dx * (d * sum_halves sc * sum(q qx) - dmin * sum_halves m * sum(qx)), the min through the
// activations' sums per 16 values.
float task_q2_k(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const int h = tt >> 1, jp = 2 * (tt & 1);
  const uint8_t* qs = b + 16 + 32 * h;
  const float d = fp16_to_fp32(rd16(b + 80)), dmin = fp16_to_fp32(rd16(b + 82));
  int isd[2] = {0, 0}, ism[2] = {0, 0};
  for (int jb = 0; jb < 2; ++jb) {
    const int j = jp + jb;
    for (int half = 0; half < 2; ++half) {
      const uint8_t s = b[8 * h + 2 * j + half];
      int sq = 0, sx = 0;
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        const int x = xq[32 * jb + 64 * tt + l];
        sq += ((qs[l] >> (2 * j)) & 3) * x;
        sx += x;
      }
      isd[jb] += (s & 15) * sq;
      ism[jb] += (s >> 4) * sx;
    }
  }
  const float da = xds[2 * tt].d, db = xds[2 * tt + 1].d;
  return d * (da * float(isd[0]) + db * float(isd[1])) - dmin * (da * float(ism[0]) + db * float(ism[1]));
}

// Scale i < 16 of a Q3_K block (6 bits, minus 32): low nibble of scales[i % 8] (nibble i / 8), high 2 bits
// from scales[8 + i % 4] (bits 2 (i / 4)); ggml's kmask unpacking, one value at a time.
int q3_k_scale(const uint8_t* sc, int i) {
  const int lo = (sc[i % 8] >> (4 * (i / 8))) & 15, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Q3_K task tt < 4 (h = tt/2, jp = 2 (tt%2)): value 128h + 32j + l, j = jp, jp + 1, is (bits 2j of
// qs[32h + l] | bit 4h + j of hmask[l] << 2) - 4 (qs at 32, hmask at 0), scale 8h + 2j + l/16 (at 96), d at
// 108. d * (dx_a * (s0 sum0 + s1 sum1) + dx_b * (s2 sum2 + s3 sum3)) over the task's four 16-value groups.
float task_q3_k(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const int h = tt >> 1, jp = 2 * (tt & 1);
  const uint8_t* qs = b + 32 + 32 * h;
  int isum[2] = {0, 0};
  for (int jb = 0; jb < 2; ++jb) {
    const int j = jp + jb;
    for (int half = 0; half < 2; ++half) {
      int s = 0;
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        const int code = ((qs[l] >> (2 * j)) & 3) | (((b[l] >> (4 * h + j)) & 1) << 2);
        s += (code - 4) * xq[64 * tt + 32 * jb + l];
      }
      isum[jb] += q3_k_scale(b + 96, 8 * h + 2 * j + half) * s;
    }
  }
  return fp16_to_fp32(rd16(b + 108)) * (xds[2 * tt].d * float(isum[0]) + xds[2 * tt + 1].d * float(isum[1]));
}

// IQ4_XS task tt < 4: 32-value blocks ib = 2tt, 2tt + 1; value l of ib is kvalues_iq4nl[low nibble of
// qs[16 ib + l]] (l < 16; high nibble of qs[16 ib + l - 16] for l >= 16), qs at 8; scale of ib: nibble ib%2
// of scales_l[ib/2] (at 4) | bits 2ib of scales_h (at 2) << 4, minus 32. d * sum_ib dx_ib * float(ls * sum).
float task_iq4_xs(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const uint32_t sh = rd16(b + 2);
  float parts[2];
  for (int k = 0; k < 2; ++k) {
    const int ib = 2 * tt + k;
    const int ls = int(((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
    const uint8_t* qs = b + 8 + 16 * ib;
    int s = 0;
    for (int l = 0; l < 16; ++l)
      s += iq::kIq4nlValues[qs[l] & 15] * xq[32 * ib + l] + iq::kIq4nlValues[qs[l] >> 4] * xq[32 * ib + 16 + l];
    parts[k] = xds[ib].d * float(ls * s);
  }
  return fp16_to_fp32(rd16(b)) * (parts[0] + parts[1]);
}

// IQ4_NL block (18 bytes: d f16 | qs[16], Q4_0's layout, codes looked up in kvalues_iq4nl).
float task_iq4_nl(const uint8_t* b, const int8_t* xq, const Q8Ds* xds) {
  int s = 0;
  for (int l = 0; l < 16; ++l)
    s += iq::kIq4nlValues[b[2 + l] & 15] * xq[l] + iq::kIq4nlValues[b[2 + l] >> 4] * xq[l + 16];
  return fp16_to_fp32(rd16(b)) * (xds[0].d * float(s));
}


int sgn(uint32_t signs, int j) { return (signs >> j) & 1 ? -1 : 1; }
int gbyte(uint64_t g, int j) { return int((g >> (8 * j)) & 0xFF); }
int gsbyte(uint64_t g, int j) { return int(int8_t((g >> (8 * j)) & 0xFF)); }
uint32_t rd32(const uint8_t* p) { return uint32_t(rd16(p)) | (uint32_t(rd16(p + 2)) << 16); }

// sum over the 8 values of group l of sub-block tt: grid bytes g (magnitudes) with sign bits s, times x.
int group_dot(uint64_t g, uint32_t s, const int8_t* x) {
  int r = 0;
  for (int j = 0; j < 8; ++j) r += gbyte(g, j) * sgn(s, j) * x[j];
  return r;
}

// IQ2_XXS sub-block tt: 8 bytes at 2 + 8tt (4 indices into iq2xxs_grid, then a word: four 7-bit sign indices,
// the scale s at bits 28-31). Values d (0.5 + s) / 4 * grid * sign: d / 8 * dx * float((2s + 1) * isum).
float task_iq2_xxs(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const uint8_t* q = b + 2 + 8 * tt;
  const uint32_t aux = rd32(q + 4);
  int isum = 0;
  for (int l = 0; l < 4; ++l)
    isum += group_dot(iq::kIq2xxsGrid[q[l]], iq::kIq2Signs[(aux >> (7 * l)) & 127], xq + 32 * tt + 8 * l);
  const int sc = 2 * int(aux >> 28) + 1;
  return fp16_to_fp32(rd16(b)) * 0.125f * (xds[tt].d * float(sc * isum));
}

// IQ2_XS (kS false): u16 a group at 2 + 8tt + 2l (9-bit iq2xs_grid index, 7-bit sign index), scales at 66.
// IQ2_S: index low bytes at 2 + 4tt + l, sign bytes at 34 + 4tt + l, qh at 66 + tt (2 high index bits a
// group), scales at 74, iq2s_grid. Scale nibble: low for groups 0-1, high for 2-3.
template <bool kS>
float task_iq2_xs_s(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const uint8_t scb = b[(kS ? 74 : 66) + tt];
  int part[2] = {0, 0};
  for (int l = 0; l < 4; ++l) {
    uint64_t g;
    uint32_t s;
    if constexpr (kS) {
      g = iq::kIq2sGrid[b[2 + 4 * tt + l] | ((uint32_t(b[66 + tt]) << (8 - 2 * l)) & 0x300)];
      s = b[34 + 4 * tt + l];
    } else {
      const uint32_t e = rd16(b + 2 + 8 * tt + 2 * l);
      g = iq::kIq2xsGrid[e & 511];
      s = iq::kIq2Signs[e >> 9];
    }
    part[l / 2] += group_dot(g, s, xq + 32 * tt + 8 * l);
  }
  const int slo = 2 * (scb & 15) + 1, shi = 2 * (scb >> 4) + 1;
  return fp16_to_fp32(rd16(b)) * 0.125f * (xds[tt].d * float(slo * part[0] + shi * part[1]));
}

// IQ3_XXS (kS false): 8 indices into iq3xxs_grid at 2 + 8tt (two 4-value points a group), a word at 66 + 4tt
// (four 7-bit sign indices, the scale at bits 28-31); d / 4 * dx * float((2s + 1) * isum). IQ3_S: the same
// indices with a ninth bit from qh at 66 + tt (bit 2l, 2l + 1), sign bytes at 74 + 4tt + l, scale nibbles at
// 106 (sub-block tt: nibble tt of the word), iq3s_grid; d * dx * float((2s + 1) * isum).
template <bool kS>
float task_iq3(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  const uint8_t* q = b + 2 + 8 * tt;
  int isum = 0, sc;
  for (int l = 0; l < 4; ++l) {
    uint32_t g1, g2, s;
    if constexpr (kS) {
      const uint32_t qh = b[66 + tt];
      g1 = iq::kIq3sGrid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)];
      g2 = iq::kIq3sGrid[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
      s = b[74 + 4 * tt + l];
    } else {
      g1 = iq::kIq3xxsGrid[q[2 * l]];
      g2 = iq::kIq3xxsGrid[q[2 * l + 1]];
      s = iq::kIq2Signs[(rd32(b + 66 + 4 * tt) >> (7 * l)) & 127];
    }
    isum += group_dot(uint64_t(g1) | (uint64_t(g2) << 32), s, xq + 32 * tt + 8 * l);
  }
  if constexpr (kS) sc = 2 * ((rd32(b + 106) >> (4 * tt)) & 15) + 1;
  else sc = 2 * int(rd32(b + 66 + 4 * tt) >> 28) + 1;
  const float d = fp16_to_fp32(rd16(b)) * (kS ? 1.f : 0.25f);
  return d * (xds[tt].d * float(sc * isum));
}

// IQ1_S (kM false): index low bytes at 2 + 4tt + l, u16 qh at 34 + 2tt (3 high index bits a group, scale s at
// bits 12-14, delta sign bit 15). IQ1_M: low bytes at 4tt + l, qh byte 32 + 2tt + l/2 (group l: bits 0-2 or
// 4-6 the high index bits, bit 3 or 7 the delta sign), 3-bit scales per 16 values in the u16s at 48 (d's f16
// bits in their top nibbles). Values d (2s + 1) (grid + delta), delta = +-1/8:
// d * dx * (float(sum (2s + 1) isum) + 1/8 float(sum (2s + 1) (+-xsum))), sums per 8-value group.
template <bool kM>
float task_iq1(const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  int a = 0, c = 0;
  float d;
  for (int l = 0; l < 4; ++l) {
    uint32_t idx;
    int sc;
    bool neg;
    if constexpr (kM) {
      const uint32_t qh = b[32 + 2 * tt + l / 2];
      idx = b[4 * tt + l] | (((l & 1) ? (qh << 4) : (qh << 8)) & 0x700);
      sc = 2 * int((rd16(b + 48 + 2 * (tt / 2)) >> (6 * (tt % 2) + 3 * (l / 2))) & 7) + 1;
      neg = (qh & ((l & 1) ? 0x80u : 0x08u)) != 0;
    } else {
      const uint32_t qh = rd16(b + 34 + 2 * tt);
      idx = b[2 + 4 * tt + l] | (((qh >> (3 * l)) & 7) << 8);
      sc = 2 * int((qh >> 12) & 7) + 1;
      neg = (qh & 0x8000u) != 0;
    }
    const uint64_t g = iq::kIq1sGrid[idx];
    int is = 0, xsum = 0;
    for (int j = 0; j < 8; ++j) {
      const int x = xq[32 * tt + 8 * l + j];
      is += gsbyte(g, j) * x;
      xsum += x;
    }
    a += sc * is;
    c += sc * (neg ? -xsum : xsum);
  }
  if constexpr (kM) {
    const uint32_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
    d = fp16_to_fp32(uint16_t((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000)));
  } else {
    d = fp16_to_fp32(rd16(b));
  }
  return d * (xds[tt].d * (float(a) + 0.125f * float(c)));
}

}  // namespace

bool format_of(GgmlType t, Format& f) {
  switch (t) {
    case GgmlType::Q2_K: f = {256, 84, 4}; return true;
    case GgmlType::Q3_K: f = {256, 110, 4}; return true;
    case GgmlType::IQ4_XS: f = {256, 136, 4}; return true;
    case GgmlType::IQ4_NL: f = {32, 18, 1}; return true;
    case GgmlType::IQ2_XXS: f = {256, 66, 8}; return true;
    case GgmlType::IQ2_XS: f = {256, 74, 8}; return true;
    case GgmlType::IQ2_S: f = {256, 82, 8}; return true;
    case GgmlType::IQ3_XXS: f = {256, 98, 8}; return true;
    case GgmlType::IQ3_S: f = {256, 110, 8}; return true;
    case GgmlType::IQ1_S: f = {256, 50, 8}; return true;
    case GgmlType::IQ1_M: f = {256, 56, 8}; return true;
    default: return false;
  }
}

float task(GgmlType t, const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds) {
  switch (t) {
    case GgmlType::Q2_K: return task_q2_k(b, tt, xq, xds);
    case GgmlType::Q3_K: return task_q3_k(b, tt, xq, xds);
    case GgmlType::IQ4_XS: return task_iq4_xs(b, tt, xq, xds);
    case GgmlType::IQ4_NL: return task_iq4_nl(b, xq, xds);
    case GgmlType::IQ2_XXS: return task_iq2_xxs(b, tt, xq, xds);
    case GgmlType::IQ2_XS: return task_iq2_xs_s<false>(b, tt, xq, xds);
    case GgmlType::IQ2_S: return task_iq2_xs_s<true>(b, tt, xq, xds);
    case GgmlType::IQ3_XXS: return task_iq3<false>(b, tt, xq, xds);
    case GgmlType::IQ3_S: return task_iq3<true>(b, tt, xq, xds);
    case GgmlType::IQ1_S: return task_iq1<false>(b, tt, xq, xds);
    case GgmlType::IQ1_M: return task_iq1<true>(b, tt, xq, xds);
    default: throw Error("q8: type " + std::string(type_name(t)) + " has no int8-activation kernel");
  }
}

}  // namespace strata::cuda::q8ref::low
