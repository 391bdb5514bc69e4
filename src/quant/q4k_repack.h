#pragma once
// Q4_K prefill fast path: 8 weight rows interleaved ("repacked") so one AVX-512 VNNI instruction
// multiplies two rows' bytes against a broadcast activation group, with the sub-block scales of two
// sub-blocks applied by one vpdpwssd after a pack (3 multiply instructions per 128 values and token
// where the 1-row kernel needs 4, and the per-row scale/min unpacking done once at repack time).
//
// Results are bit-identical to the 1-row AVX-512 Q4_K kernel (dotn_k4 in vec_dot_x86.inc): every
// int32 lane holds the same integer sum (row r, 4-byte group i of each 32-value sub-block, times the
// sub-block scale) and goes through the same float FMAs and the same final reduction order.
//
// Where the copy lives: a process-wide cache keyed by (weight pointer, rows, cols), filled lazily
// by matmul the first time a Q4_K matrix is used with n_tok >= 4, under a mutex, and only while the
// cache's byte budget allows (0 = off, the default; the engine asks for STRATA_Q4K_REPACK_MIB; a matrix that does not
// fit keeps using the 1-row kernel, nothing is evicted). Any Model's destruction clears the cache
// (q4k_repack_clear) so a later model mapped at the same address never meets a stale copy.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace strata::q {

// One 256-value super-block of 8 consecutive rows (1216 bytes; 8 Q4_K blocks are 1152).
struct alignas(64) RepQ4K8 {
  float d[8], dmin[8];     // [row] the fp16 scales, converted
  uint8_t sc[8][8];        // [sub-block][row] 6-bit scales
  uint8_t mins[8][8];      // [row][sub-block] 6-bit mins
  uint8_t qs[4][4][64];    // [j = pair of sub-blocks][row pair]: nibbles, order in q4k_repack.cpp
};
static_assert(sizeof(RepQ4K8) == 1216);

// Sets the cache's byte budget (0 turns it off and frees every copy). Thread-safe.
void q4k_repack_set_budget(size_t bytes);
size_t q4k_repack_budget();
// The budget an engine in fast mode asks for: STRATA_Q4K_REPACK_MIB (MiB) if set, else 0 (off): on
// the 2-layer synthetic Qwen3-30B-A3B the kernel's 1.1-1.25x did not show in pp512 (within noise)
// while the copies cost ~5.6% more than the Q4_K bytes they copy (bench/results/2026-11-29-cpu-prefill-repack.md).
size_t q4k_repack_default_budget();
size_t q4k_repack_bytes();  // bytes held now
void q4k_repack_clear();    // frees every copy (budget unchanged)

// The repacked copy of W ([rows][cols] Q4_K), building it if needed; nullptr when the cache is off,
// the budget is spent, rows % 8 != 0, or this CPU lacks AVX-512 VNNI+VBMI. Thread-safe; the copy
// stays alive while the returned pointer does, even across q4k_repack_clear.
std::shared_ptr<const RepQ4K8[]> q4k_repacked(const void* w, int64_t rows, int64_t cols);

// Repacks rows [0, 8) of W (row stride row_bytes, nb super-blocks per row) into out[nb].
void q4k_repack_rows8(const uint8_t* w, int64_t row_bytes, int64_t nb, RepQ4K8* out);

// Activations for the kernel: each token's Q8_K row (xs bytes apart) with its quants reordered to
// the repacked weights' order: xperm [n_tok][cols / 256][256] bytes.
void q4k_permute_acts(const uint8_t* xq, int64_t xs, int64_t n_tok, int64_t cols, uint8_t* xperm);

// 8 rows x 4 tokens: out[t * os + r] = row r of w (cols values) . token t, t < 4, r < 8.
//   w: [cols / 256] repacked blocks; xq: 4 Q8_K rows xs bytes apart (for d and bsums);
//   xperm: the same 4 tokens' permuted quants ([4][cols / 256][256]).
// Only call when q4k_repacked returned non-null (AVX-512 code).
void q4k_gemm8x4_avx512(int64_t cols, const RepQ4K8* w, const uint8_t* xq, int64_t xs, const uint8_t* xperm,
                        float* out, int64_t os);

}  // namespace strata::q
