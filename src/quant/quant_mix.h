#pragma once
// Which type each tensor of a model gets when the model is quantized (`strata quantize`).
//
// Schemes:
//   Q8_0, Q6_K, Q5_K, Q4_K  every quantizable tensor in that type ("pure").
//   Q4_0              llama.cpp's Q4_0 file type: Q4_0, but output.weight (or a tied token_embd.weight)
//                     Q6_K, and attn_v / attn_qkv / attn_kv_b / attn_k Q8_0 in models with exactly 8 experts
//                     (llama_tensor_get_type applies those two for every file type but the pure ones).
//   Q4_K_M            llama.cpp's Q4_K_M mix (its llama_tensor_get_type rule for that file type):
//     - output.weight (and token_embd.weight when there is no output.weight: tied)  -> Q6_K
//     - attn_v / attn_qkv / attn_kv_b ("V-like"; counted in file order i of n):
//         Q6_K when use_more_bits(i, n), else Q4_K; models with exactly 8 experts: Q8_0 (attn_k too)
//     - ffn_down* of layer i (i from the name "blk.<i>."): Q6_K when use_more_bits(i, n_layer)
//     - attn_output: Q5_K in models with exactly 8 experts
//     - everything else quantizable: Q4_K
//     where use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 (first and last eighth of
//     the layers and every third layer in between).
// Quantizable = 2-D or 3-D, name ends in "weight", and not a norm (*_norm.weight), the MoE router
// (ffn_gate_inp*), a conv1d (ssm_conv1d) or positional/token-type embeddings; the others keep their type
// (so 1-D tensors such as norms stay F32).
// A row length that is not a multiple of the target's block size falls back to Q8_0 (or F16 when not
// a multiple of 32): llama.cpp falls back to Q5_0/Q5_1/Q8_0 here; we only write the types we quantize.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace strata {

enum class QuantScheme { Q8_0, Q6_K, Q5_K, Q4_K, Q4_K_M, Q4_0 };

std::optional<QuantScheme> quant_scheme_from_name(std::string_view name);  // case-insensitive
std::string_view quant_scheme_name(QuantScheme s);
// general.file_type (llama_ftype): Q4_0 2, Q8_0 7, Q4_K 14 (MOSTLY_Q4_K_S, the closest label), Q4_K_M 15,
// Q5_K 16 (MOSTLY_Q5_K_S, the closest label), Q6_K 18.
uint32_t quant_scheme_file_type(QuantScheme s);

struct TensorPlanInput {
  std::string name;
  uint32_t n_dims;
  uint64_t ne0;     // row length
  GgmlType type;    // current type
};

// Target type of every tensor (same order as `tensors`, which is the file order).
std::vector<GgmlType> plan_quantization(const std::vector<TensorPlanInput>& tensors, QuantScheme scheme,
                                        int n_layer, int n_expert);

bool tensor_is_quantizable(const TensorPlanInput& t);

}  // namespace strata
