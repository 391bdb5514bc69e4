#pragma once
// ISA-specific attention kernels (picked at run time in ops.cpp; each has the scalar reference in
// ops.cpp with the same signature, compared in tests/test_ops.cpp).
#include <cstdint>

#include "cpu/ops.h"

namespace strata::cpu {

// One (token, head) of AttnMath::GgmlF16 attention. Returns false when the shape is not supported
// (head sizes not multiples of 8): the caller then runs the scalar reference.
//   qh: [head_dim]; k/v: cache bases, position p's head at p * k_row + k_off (v: v_row, v_off);
//   sc: scratch [n] (the scores); oh: [head_dim_v]
bool attend_ggml_f16_avx2(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                          int64_t v_row, int64_t k_off, int64_t v_off, int head_dim,
                          int head_dim_v, KvType type, float scale, float* sc, float* oh);

// The same bits with AVX-512 (needs the Avx512 level); false also when head_dim % 64 or head_dim_v % 16.
bool attend_ggml_f16_avx512(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                            int64_t v_row, int64_t k_off, int64_t v_off, int head_dim, int head_dim_v, KvType type,
                            float scale, float* sc, float* oh);

// AttnMath::F32 for n_rows query heads of one token that share a KV head (attention_f32_avx512.cpp; needs
// the Avx512 level): out[r] = softmax(scale * q_r . K^T) V over positions [0, n). Returns false when the
// shape is not supported (head sizes not multiples of 16 or above kMaxTileHeadDim, more than kMaxTileRows
// rows): the caller then runs the scalar reference.
//   q: [n_rows][head_dim]; k/v as above; out: [n_rows][head_dim_v]
inline constexpr int kMaxTileHeadDim = 256, kMaxTileRows = 16;
bool attend_f32_group_avx512(const float* q, int n_rows, const void* k, const void* v, int32_t n, int64_t k_row,
                             int64_t v_row, int64_t k_off, int64_t v_off, int head_dim, int head_dim_v, KvType type,
                             float scale, float* out);

}  // namespace strata::cpu
