#pragma once
// qwen3moe: Qwen3-30B-A3B, Qwen3-235B-A22B. Pre-norm decoder; GQA attention with per-head Q/K RMSNorm
// and NeoX RoPE; every layer's FFN is an MoE (softmax router over all experts, top-k, renormalised,
// SwiGLU experts); tied or untied output.
#include <memory>

#include "model/model.h"

namespace strata {

std::unique_ptr<Model> make_qwen3moe(gguf::File file);

}  // namespace strata
