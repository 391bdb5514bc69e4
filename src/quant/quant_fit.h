#pragma once
// The scale fits behind the row quantizers (quantize*.cpp): each picks a block's step size (and offset)
// by a small search over candidate steps, refitting the step by weighted least squares for each
// candidate's rounding and keeping the best weighted error. Values of larger magnitude weigh more (the
// caller's w), as they matter more in a dot product.
#include <cstdint>

namespace strata::qfit {

// The value of largest magnitude among v[0..n) (the first of them; 0 when all are 0).
float signed_absmax(const float* v, int n);

// The weights most fits use: the block's RMS plus each value's magnitude. x, w: [n].
void rms_plus_abs_weights(const float* x, int n, float* w);

// x[i] ~= scale * L[i] - *min_out, L in [0, nmax]. With min_le_zero (the K-quants' form, whose min is
// stored as an unsigned number) the offset -*min_out is at most 0, so zero stays representable;
// without it (Q4_1/Q5_1) the offset is free. Returns scale (>= 0). n <= 256.
float fit_scale_min(const float* x, const float* w, int n, int nmax, bool min_le_zero, uint8_t* L, float* min_out);

// x[i] ~= scale * L[i], L in [-nmax, nmax - 1]; maximizes the weighted fit (sum w x L)^2 / sum w L^2.
// Returns scale (its sign is the one that puts the value of largest magnitude on the -nmax side). n <= 32.
float fit_symmetric(const float* x, const float* w, int n, int nmax, int8_t* L);

// x[i] ~= scale * grid[L[i]] for a sorted non-uniform grid of 16 values (IQ4_NL's). Tries steps that put
// the value of largest magnitude near either end of the grid, refits, and re-rounds once against the
// best step. Returns scale (any sign). n <= 32.
float fit_grid16(const float* x, const float* w, int n, const int8_t* grid, uint8_t* L);

// fp16 bits of v, saturated to the largest finite fp16 (+-65504): a fitted scale or offset just beyond the
// range (rows with values near fp16's limit) is stored as the largest one instead of an infinity, and a
// NaN (a fit of values so large that its sums overflowed) as 0.
uint16_t fp16_sat(float v);

// Index of the grid value nearest v (grid sorted ascending, 16 values).
int nearest_grid16(const int8_t* grid, float v);

}  // namespace strata::qfit
