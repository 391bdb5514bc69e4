#pragma once
// qwen3next: Qwen3-Next-80B-A3B and its kin. A hybrid decoder: most layers are Gated DeltaNet (linear
// attention with a per-sequence recurrent state), every full_attention_interval-th layer is gated
// softmax attention (the query projection also yields a sigmoid output gate; partial NeoX RoPE).
// Every layer's FFN is an MoE (softmax router, top-k renormalised, SwiGLU experts) plus a shared
// expert scaled by sigmoid(ffn_gate_inp_shexp . x). Tensor semantics follow llama.cpp's `qwen3next`.
#include <memory>

#include "model/model.h"

namespace strata {

std::unique_ptr<Model> make_qwen3next(gguf::File file);

// The form of the gated delta rule that runs a prompt (a run of more than one token of a sequence);
// one token always takes the recurrent form. Process-wide; the environment variable
// STRATA_GDN_PREFILL=recurrent|chunked sets the initial value.
//   Recurrent (default on the CPU): two fused passes over each [D][D] state per token; measured
//             1.1x-2x faster than the chunked form on this CPU (bench/results/2026-11-29-qwen3next-cpu.md).
//   Chunked:  the chunkwise (WY) form, state read/written once per 64 tokens through matrix products:
//             the form a GPU runs; selectable so tests and benchmarks run it end to end.
enum class GdnPrefill { Recurrent, Chunked };
void set_qwen3next_gdn_prefill(GdnPrefill form);
GdnPrefill qwen3next_gdn_prefill();

}  // namespace strata
