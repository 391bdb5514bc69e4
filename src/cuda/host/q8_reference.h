#pragma once
// CPU references of the int8-activation decode kernels (cuda/q8_kernels.cuh), same signatures on host
// pointers (Q8Ds for float2, ExpertView for moe::ExpertLayerView, no stream). Plain loops over the ggml
// block layouts of quant/blocks.h, doing per 32-value sub-block the same integer dot and the same float
// combination as the kernels, so a GPU result differs from these only by the order of the float sums.
// Built into strata_core without CUDA; tests: tests/test_q8_reference.cpp (against the exact f32 product),
// tests/cuda/test_q8_kernels.cu (GPU against these).
//
// Activation quantization (both sides): per block of 32 values, amax = max |v|, d = amax / 127 (f32
// division), q = round-half-away-from-zero(v / d) (std::round / roundf, f32 division), clamped to
// [-127, 127]; an all-zero block (or d == 0: amax below 127 * the smallest subnormal) gives d = 0, q = 0.
// ds = {d, d * float(sum q)}.
#include <cstdint>

#include "quant/types.h"

namespace strata::cuda::q8ref {

struct Q8Ds {  // layout of CUDA's float2 {x, y}
  float d, s;
};

// Same fields as cuda::moe::ExpertLayerView (which includes CUDA headers), host pointers.
struct ExpertView {
  const uint8_t* slots = nullptr;  // [n_slots][slot_bytes]
  int64_t slot_bytes = 0;
  GgmlType gate_type{}, up_type{}, down_type{};
  int64_t gate_off = 0, up_off = 0, down_off = 0;
  int64_t n_embd = 0, n_ff = 0;
};

// True for exactly Q4_0, Q4_0_X8, Q8_0, Q4_K, Q5_K, Q6_K, Q6_K_X8, Q6_K_P and the low-bit formats (the one list of types
// with int8-activation kernels; q8::supported uses it, q8d::dispatch has the same cases).
bool supported(GgmlType t);

// True for exactly the low-bit formats Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M (the models take their kernels when q8::low_bit_enabled(), the default; as gate or up experts, each
// pairs only with itself: moe_supported).
bool low_bit(GgmlType t);

// Values per block of `t` (32 or 256) for a supported type.
int64_t block_values(GgmlType t);

// Throws strata::Error unless `t` is supported, cols > 0 is a multiple of its block size (and of 32),
// and row_bytes >= the bytes of a row of cols values. what: the caller's name for messages.
void check_matvec_shape(GgmlType t, int64_t cols, int64_t row_bytes, const char* what);

// The alignment in bytes every row of `t` must have for the int8 kernels: 4 for Q2_K (84-byte blocks), 8 for
// IQ4_XS and IQ1_M (136 / 56), which the kernels read only with those loads (why: one variant fewer of every
// kernel; their rows are whole blocks, so aligned bases keep them aligned); 2 for the others.
int min_row_align(GgmlType t);

// One block of 32 values -> 32 codes and {d, d * sum q} (the rule above).
void quantize_block(const float* v, int8_t* q, Q8Ds& ds);

// x: [n][cols] -> q: [n][cols], ds: [n][cols/32]. cols % 32 == 0 (throws otherwise).
void quantize(const float* x, int64_t n, int64_t cols, int8_t* q, Q8Ds* ds);

// y = ops::rmsnorm(x) * w with the GPU kernel's arithmetic (sum of squares in double, in the order of a
// 256-thread block: per thread strided, then a warp butterfly, then the 8 warps in order; scale =
// 1 / sqrtf(mean + eps); y = x * scale * w), then quantize(y). x, y: [n][cols] (y may be x), w: [cols].
void rmsnorm_quantize(const float* x, const float* w, int64_t n, int64_t cols, float eps, float* y, int8_t* q,
                      Q8Ds* ds);

// The scale of rmsnorm_quantize's row xr [cols] (the GPU's order, as above): 1 / sqrtf(mean + eps).
float rmsnorm_scale(const float* xr, int64_t cols, float eps);

// q8::norm_matvec with its early norm (q8_kernels.cuh norm_matvec_early), one token: xn = rmsnorm(x) * nw
// (as rmsnorm_quantize), then y[r] (+)= row_dot(W[r], Q8(x * nw)) * scale, the scale that of rmsnorm_scale.
void norm_matvec_early(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
                       const float* nw, float eps, float* xn, float* y, bool accumulate);

// One weight row (cols values of `type`) . one Q8 activation row (xq [cols], xds [cols/32]).
float row_dot(GgmlType type, const uint8_t* row, int64_t cols, const int8_t* xq, const Q8Ds* xds);

// y[t][r] (+)= W[r] . x[t] as q8::matvec. W: [rows][cols] in type, row r at w + r * row_bytes.
void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
            const Q8Ds* xds, int64_t n, float* y, bool accumulate);

// silu(g) * u as moe_kernels.cu computes it: g / (1 + expf(-g)) * u in f32.
float silu_mul(float g, float u);

// As q8::moe_gate_up / q8::moe_down. table: [n_expert] (ids < 0 are not resident; ids must be < the
// table's length, as for moe::moe_gate_up). hq: [n*k][n_ff], hds: [n*k][n_ff/32], x: [n][n_embd].
void moe_gate_up(const ExpertView& v, const int32_t* table, const int8_t* xq, const Q8Ds* xds, const int32_t* ids,
                 int64_t n, int k, int8_t* hq, Q8Ds* hds);
void moe_down(const ExpertView& v, const int32_t* table, const int8_t* hq, const Q8Ds* hds, const int32_t* ids,
              const float* wts, int64_t n, int k, float* x);

// As q8::moe_supported.
bool moe_supported(const ExpertView& v);

}  // namespace strata::cuda::q8ref
