#pragma once
// The routed experts of one MoE layer on the GPU, reading expert weights from expert-cache slots through
// the device residency table (issue 7). Declarations only. CPU reference: model/moe_ffn.h moe_experts
// restricted to the resident experts; tests/cuda/test_moe_kernels.cu compares them.
//
// A slot holds one expert of one layer: gate [n_ff][n_embd], up [n_ff][n_embd], down [n_embd][n_ff], each
// in its type, at fixed byte offsets inside the slot (ExpertLayerView). Slots are one device allocation:
// slot s starts at slots + s * slot_bytes.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace strata::cuda::moe {

constexpr int kViewTableMax = 1024;  // ExpertLayerView::n_expert staged in shared memory, at most
struct ExpertLayerView {
  const uint8_t* slots = nullptr;  // device: [n_slots][slot_bytes]
  int64_t slot_bytes = 0;
  // Bytes of this layer's expert at the start of a slot (gate | up | down; <= slot_bytes, which is the
  // largest layer's): what a copy into a slot moves. 0: slot_bytes (copy_bytes()).
  int64_t expert_bytes = 0;
  int64_t copy_bytes() const { return expert_bytes > 0 ? expert_bytes : slot_bytes; }
  GgmlType gate_type{}, up_type{}, down_type{};  // GPU storage types (cuda::quant::has_kernel)
  int64_t gate_off = 0, up_off = 0, down_off = 0;  // byte offsets inside a slot
  int64_t n_embd = 0, n_ff = 0;
  // Entries of the table row the kernels are given (the layer's experts). 0: unknown. The int8 decode
  // kernels (q8_kernels.cuh) copy a known row (at most kViewTableMax entries) to shared memory before
  // their PDL wait: a table is written by uploads only, never by a kernel of the stream.
  int n_expert = 0;
  // Direct reads (moe/direct_rule.h; moe_gate_up and moe_down only): this layer's experts in slot layout
  // in pinned host memory that kernels can read (unified addressing), [n_expert][slot_bytes], and the
  // share of each token's non-resident pairs read from there over PCIe (1/256ths). null or 0: none.
  const uint8_t* direct = nullptr;
  int direct_share = 0;
  // Where direct pairs are read from: null: the kernels read v.direct over PCIe themselves; else device
  // staging slots [n][stage_per_token][slot_bytes] that moe_direct_fetch filled first: pair (t, j) of
  // direct rank r (moe::direct_rank) at stage + (t * stage_per_token + r) * slot_bytes.
  uint8_t* stage = nullptr;
  int stage_per_token = 0;  // >= direct_count(k, direct_share)
};

// For every (t, j), t < n, j < k, whose expert e = ids[t*k + j] is resident (slot = table[e] >= 0), or
// direct (v.direct; moe/direct_rule.h: then read from v.direct + e * slot_bytes):
//   h[t*k + j][:] = silu(gate_e . x[t]) * (up_e . x[t])
// Rows of the other pairs (the CPU pool's) are left untouched (moe_down does not read them).
//   table: [n_expert] device int32 (this layer's row of the residency table)
//   x: [n][n_embd] f32   ids: [n][k] int32   h: [n*k][n_ff] f32   (all device)
void moe_gate_up(const ExpertLayerView& v, const int32_t* table, const float* x, const int32_t* ids,
                 int64_t n, int k, float* h, cudaStream_t stream);

// out[t][:] = sum over j < k with expert ids[t*k+j] resident or direct of  wts[t*k+j] * (down_e . h[t*k+j]),
// summed in a fixed order (deterministic, not necessarily j order); a token with no such pair gets
// zeros. out is overwritten.
//   wts: [n][k] f32   out: [n][n_embd] f32   (device)
void moe_down(const ExpertLayerView& v, const int32_t* table, const float* h, const int32_t* ids,
              const float* wts, int64_t n, int k, float* out, cudaStream_t stream);

// With v.stage: copies the expert of every direct pair (moe/direct_rule.h) from v.direct to its staging
// slot (the layer's expert_bytes of each, not the whole slot), for moe_gate_up / moe_down to read from
// device memory. Why not let those kernels read host memory themselves: their loads are shaped for the
// formats (16-byte pieces, scales apart), and over PCIe small scattered reads get a fraction of the link;
// this copy reads each expert as one contiguous stream of 16-byte loads, several in flight per thread
// (bench_moe_direct measures both).
//   table: [n_expert]   ids: [n][k]   (device)
void moe_direct_fetch(const ExpertLayerView& v, const int32_t* table, const int32_t* ids, int64_t n, int k,
                      cudaStream_t stream);

// Throws strata::Error when the view cannot be used by the kernels above for n tokens of k experts
// (no slots, bad shape, a type without a kernel, a tensor that does not fit in a slot).
void check_expert_view(const ExpertLayerView& v, const char* what, int64_t n, int k);

// ---- prefill: experts as grouped GEMMs (moe_grouped.cu) ----
// Why: moe_gate_up/moe_down read an expert's weights once per (token, expert) pair; at prefill an expert
// is routed to by ~n*k/n_expert tokens, so the grouped path sorts the pairs by expert on the GPU and
// multiplies each expert once per tile of 64 (WMMA kernel: 32) of its pairs on the tensor cores (bf16
// inputs, f32 accumulate).
// Worth it from about this many tokens (to be measured: bench/cuda/cuda_gemm.cu).
constexpr int64_t kMoeGroupedMinTokens = 32;

// True when moe_experts_grouped takes the grouped GEMM path for this view (n_embd and n_ff multiples of 32,
// every tensor's rows aligned to its format's block alignment in every slot); false: it falls back to
// moe_gate_up + moe_down. Throws like check_expert_view for a bad view.
bool moe_grouped_supported(const ExpertLayerView& v);

// Which product kernel moe_experts_grouped runs (moe_grouped_mma.cuh says how they differ): 2 (the
// default) mma.sync with the raw weights staged in shared memory by cp.async, for quantized formats where
// n_embd and n_ff are multiples of 256 and the slots 16-byte aligned (else as 1); 1 mma.sync with weights
// read where they are dequantized, where n_embd and n_ff are multiples of 128 and x is 16-byte aligned
// (else as 0); 0 the WMMA kernel. 2 and 1 give the same bits. STRATA_CUDA_MOE_GROUPED=0|1|2 (read once),
// set_moe_grouped_kernel wins (tests, benchmarks; strata::Error outside 0..2).
void set_moe_grouped_kernel(int which);
int moe_grouped_kernel();
// Kernel 2's ring: 3 stages (the default) where they fit in shared memory (e.g. Q4_K, Q4_0 rows), else 2;
// 2 always 2. The same bits either way. STRATA_CUDA_MOE_GROUPED_STAGES=2|3, set_moe_grouped_stages wins.
void set_moe_grouped_stages(int stages);
int moe_grouped_stages();

// Device scratch bytes moe_experts_grouped needs for up to max_n tokens (allocate once at load).
size_t moe_grouped_scratch_bytes(const ExpertLayerView& v, int n_expert, int64_t max_n, int k);

// out = what moe_gate_up followed by moe_down give (same contract: only resident experts, j order per
// token, zeros for a token without a resident expert; out [n][n_embd] is overwritten), computed as:
//   1. counting sort of the resident (t, j) pairs by expert (device only, no host sync; stable: pairs of an
//      expert in increasing t*k+j), and a list of 64-pair tiles per expert (32 for the WMMA kernel);
//   2. per (expert, tile, band of output rows): gathered x rows and dequantized gate/up rows in bf16,
//      tensor-core products, h = silu(gate) * up (bf16; WMMA kernel f32);  3. the same for down, one f32
//      row per pair;
//   4. out[t] = sum over j in order of wts[t*k+j] * that pair's row (deterministic, no atomics); with
//      accumulate, out[t] += that sum (the same float addition as the sum written apart and then added).
// Inputs are rounded to bf16 before each product (error ~1e-2 of sum|w x| at worst, ~1e-3 typical), so
// results differ from moe_gate_up/moe_down by that rounding. Slots whose tensors are not aligned to their
// format's block alignment, n_embd / n_ff not multiples of 32, or more than 4096 experts (the sort's
// shared-memory histogram) take moe_gate_up + moe_down instead
// (same scratch). table: [n_expert] device int32 (ids outside [0, n_expert) count as not resident).
//   x: [n][n_embd] f32   ids, wts: [n][k]   out: [n][n_embd] f32   scratch: device, >= scratch_bytes
// Throws strata::Error for a bad view or when n exceeds what the scratch was sized for.
void moe_experts_grouped(const ExpertLayerView& v, const int32_t* table, int n_expert, const float* x,
                         const int32_t* ids, const float* wts, int64_t n, int k, float* out, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream, bool accumulate = false);

}  // namespace strata::cuda::moe
