#include "quant/quant_fit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"

namespace strata::qfit {

using q::nearest_int;

float signed_absmax(const float* v, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(v[i]) > std::fabs(m)) m = v[i];
  return m;
}

void rms_plus_abs_weights(const float* x, int n, float* w) {
  float s2 = 0;
  for (int l = 0; l < n; ++l) s2 += x[l] * x[l];
  const float av = std::sqrt(s2 / n);
  for (int l = 0; l < n; ++l) w[l] = av + std::fabs(x[l]);
}

float fit_scale_min(const float* x, const float* w, int n, int nmax, bool min_le_zero, uint8_t* L, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  if (min_le_zero) lo = std::min(lo, 0.f);  // the min is never positive: zero stays representable
  if (hi <= lo) {
    std::fill(L, L + n, 0);
    *min_out = -lo;
    return 0.f;
  }
  float sw = 0, sx = 0;
  for (int i = 0; i < n; ++i) sw += w[i], sx += w[i] * x[i];
  float best_scale = (hi - lo) / nmax, best_min = lo, best_err = INFINITY;
  uint8_t Lt[256];
  // Candidate inverse steps around nmax / range; each rounding is refit by least squares.
  for (int step = -1; step <= 20; ++step) {
    const float iscale = step < 0 ? nmax / (hi - lo) : (nmax - 1.0f + 0.1f * step) / (hi - lo);
    float sl = 0, sl2 = 0, slx = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      Lt[i] = static_cast<uint8_t>(l);
      sl += w[i] * l, sl2 += w[i] * l * l, slx += w[i] * l * x[i];
    }
    const float det = sw * sl2 - sl * sl;
    if (det <= 0) continue;
    float scale = (sw * slx - sx * sl) / det, mn = (sl2 * sx - sl * slx) / det;
    if (min_le_zero && mn > 0) {  // clamp the offset to <= 0 and refit the scale alone
      mn = 0;
      scale = sl2 > 0 ? slx / sl2 : 0;
    }
    if (!min_le_zero && scale < 0) continue;
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float e = scale * Lt[i] + mn - x[i];
      err += w[i] * e * e;
    }
    if (err < best_err) {
      best_err = err, best_scale = scale, best_min = mn;
      std::memcpy(L, Lt, n);
    }
  }
  if (best_err == INFINITY) {  // degenerate weights: plain min/max rounding
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(std::clamp(nearest_int((x[i] - lo) / best_scale), 0, nmax));
  }
  *min_out = -best_min;
  return best_scale;
}

float fit_symmetric(const float* x, const float* w, int n, int nmax, int8_t* L) {
  const float max = signed_absmax(x, n), amax = std::fabs(max);
  if (amax < 1e-30f) {
    std::fill(L, L + n, 0);
    return 0.f;
  }
  float best_scale = 0, best_obj = -1;
  int8_t Lt[32];
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(nmax + 0.1f * step) / max;
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      Lt[i] = static_cast<int8_t>(l);
      slx += w[i] * x[i] * l, sl2 += w[i] * l * l;
    }
    if (sl2 > 0 && (best_obj < 0 || slx * slx > best_obj * sl2)) {
      best_scale = slx / sl2;
      best_obj = best_scale * slx;
      std::memcpy(L, Lt, n);
    }
  }
  return best_scale;
}

uint16_t fp16_sat(float v) { return std::isnan(v) ? 0 : q::fp32_to_fp16(std::clamp(v, -65504.f, 65504.f)); }

int nearest_grid16(const int8_t* grid, float v) {
  if (!(v > grid[0])) return 0;
  if (v >= grid[15]) return 15;
  // The grid values are integers, so grid[i] <= v exactly when grid[i] <= floor(v): the entry below v
  // comes from a table over the integers of the grid's range (built once per grid).
  thread_local const int8_t* cached = nullptr;
  thread_local uint8_t below[256];  // below[k - grid[0]]: the last i with grid[i] <= k
  if (cached != grid) {
    for (int k = grid[0], i = 0; k <= grid[15]; ++k) {
      while (i < 15 && grid[i + 1] <= k) ++i;
      below[k - grid[0]] = static_cast<uint8_t>(i);
    }
    cached = grid;
  }
  const int lo = below[static_cast<int>(std::floor(v)) - grid[0]], hi = lo + 1;
  return v - grid[lo] < grid[hi] - v ? lo : hi;
}

float fit_grid16(const float* x, const float* w, int n, const int8_t* grid, uint8_t* L) {
  const float max = signed_absmax(x, n), amax = std::fabs(max);
  if (amax < 1e-30f) {
    std::fill(L, L + n, static_cast<uint8_t>(nearest_grid16(grid, 0.f)));
    return 0.f;
  }
  float best_scale = 0, best_obj = -1;
  uint8_t Lt[32];
  auto try_step = [&](float inv) {
    float sqx = 0, sq2 = 0;
    for (int i = 0; i < n; ++i) {
      Lt[i] = static_cast<uint8_t>(nearest_grid16(grid, inv * x[i]));
      const float v = grid[Lt[i]];
      sqx += w[i] * x[i] * v, sq2 += w[i] * v * v;
    }
    if (sq2 > 0 && (best_obj < 0 || sqx * sqx > best_obj * sq2)) {
      best_scale = sqx / sq2;
      best_obj = best_scale * sqx;
      std::memcpy(L, Lt, n);
    }
  };
  // The grid is asymmetric (-127 .. 113): the value of largest magnitude may sit at either end.
  for (const int end : {int(grid[0]), int(grid[15])})
    for (int t = -8; t <= 8; ++t) try_step((end + t) / max);
  if (best_scale != 0) try_step(1.f / best_scale);  // re-round against the fitted step
  return best_scale;
}

}  // namespace strata::qfit
