#pragma once
// CPU references of the folded router (cuda/q8_kernels.cuh "The folded router"), same signatures on host
// pointers: fold_router, wo_router (ss: [1], the total sum of squares) and moe_gate_up_routed (FoldedRoute
// with host pointers). Built into strata_core without CUDA; tests: tests/cuda/test_folded_router.cu.
#include <cstdint>

#include "cuda/host/q8_reference.h"
#include "quant/types.h"

namespace strata::cuda::q8ref {

// As q8::fold_router: double sums over r in order, rounded once.
void fold_router(const float* router, const float* norm_w, const float* wo, int n_expert, int64_t n_embd,
                 int64_t n_att, float* fold);

// As q8::wo_router, with ss[0] = the sum of mid^2 (in double) instead of per-block partial sums, and raw in
// double before its rounding.
void wo_router(GgmlType type, const void* wo, int64_t n_embd, int64_t n_att, int64_t row_bytes, const int8_t* attq,
               const Q8Ds* attds, const float* att, const float* x, const float* fold, int n_expert, float* mid,
               float* raw, float* ss);

struct FoldedRoute {  // as q8::FoldedRoute, host pointers
  const float* mid;
  const float* norm_w;
  float eps;
  const float* ss;
  int n_ss;
  const float* raw;
  int n_expert;
  bool norm;
  int32_t* ids;
  float* wts;
};

// As q8::moe_gate_up_routed: s from the partial sums (double, in order), the top k of raw (value desc, id
// asc; NaN last), xq = quantize(mid * s * norm_w), moe_gate_up on them, and the weights (softmax of s * raw
// in double, the k chosen renormalized if r.norm). xq/xds: [n_embd], [n_embd/32] out (the activations it
// used).
void moe_gate_up_routed(const ExpertView& v, const int32_t* table, const FoldedRoute& r, int k, int8_t* hq,
                        Q8Ds* hds, int8_t* xq, Q8Ds* xds);

}  // namespace strata::cuda::q8ref
