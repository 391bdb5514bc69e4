#pragma once
// Which type each tensor of a model gets when the model is quantized (`strata quantize`, `mkmodel`).
//
// Pure schemes (every quantizable tensor in one type): Q8_0, Q6_K, Q5_K, Q4_K.
// llama.cpp's file types, with its llama_tensor_get_type rules (llama.cpp's src/llama-quant.cpp; the
// rules for architectures strata does not run, Falcon and LLaMA-70B, and those that need an importance
// matrix are left out):
//   Q4_0 Q4_1 Q5_0 Q5_1  the base type everywhere but the rules below.
//   Q2_K   attn_v-like Q4_K when n_head / n_head_kv >= 4, else Q3_K; ffn_down Q3_K; attn_output Q3_K
//          (Q5_K with 8 experts).
//   Q3_K_S Q3_K; attn_output Q5_K with 8 experts.
//   Q3_K_M attn_v-like Q5_K for the first two, Q4_K after; ffn_down Q5_K in the first 1/16 of the layers,
//          Q4_K after; attn_output Q4_K (Q5_K with 8 experts).
//   Q3_K_L attn_v-like, ffn_down, attn_output Q5_K.
//   Q4_K_S attn_v-like Q5_K for the first four; ffn_down Q5_K in the first 1/8; attn_output Q5_K with 8
//          experts.
//   Q4_K_M attn_v-like and ffn_down Q6_K where use_more_bits; attn_output Q5_K with 8 experts.
//   Q5_K_S Q5_K.   Q5_K_M: attn_v-like and ffn_down Q6_K where use_more_bits.
//   IQ4_NL IQ4_XS  attn_v-like Q5_K when n_head / n_head_kv >= 4; ffn_down Q5_K in the first 1/8 (llama.cpp
//          does so without an importance matrix; strata quantizes without one); attn_output Q5_K with 8
//          experts.
//   and for all of them: output.weight (or a tied token_embd.weight) Q6_K (Q8_0 for Q8_0, or when its rows
//   are not whole blocks of the base type); in models with exactly 8 experts attn_v-like and attn_k Q8_0.
//   attn_v-like = attn_v / attn_qkv / attn_kv_b, counted in file order (i of n); ffn_down's layer comes
//   from its name ("blk.<i>."); use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
// pure (llama-quantize --pure): every quantizable tensor in the scheme's base type, output included.
// Quantizable = 2-D or 3-D, name ends in "weight", and not a norm (*_norm.weight), the MoE router
// (ffn_gate_inp*), a conv1d (ssm_conv1d) or positional/token-type embeddings; the others keep their type
// (so 1-D tensors such as norms stay F32).
// A row length that is not whole blocks of the chosen type falls back as in llama.cpp: IQ4_XS -> IQ4_NL,
// Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16 when that does not fit either.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace strata {

enum class QuantScheme {
  Q8_0, Q6_K, Q5_K, Q4_K,                            // pure
  Q4_0, Q4_1, Q5_0, Q5_1,                            // llama.cpp's legacy file types
  Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M,  // llama.cpp's K-quant mixes
  IQ4_NL, IQ4_XS,
};

std::optional<QuantScheme> quant_scheme_from_name(std::string_view name);  // case-insensitive
std::string_view quant_scheme_name(QuantScheme s);
// Every scheme name, in the enum's order, for help texts and errors: "Q8_0, Q6_K, ...".
std::string quant_scheme_names();
// The scheme's main type (the one most tensors get).
GgmlType quant_scheme_base_type(QuantScheme s);
// general.file_type (llama_ftype): Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_S/M/L 11/12/13,
// Q4_K_S 14, Q4_K_M 15, Q5_K_S 16, Q5_K_M 17, Q6_K 18, IQ4_NL 25, IQ4_XS 30; the pure Q4_K and Q5_K
// carry 14 and 16 (MOSTLY_Q4_K_S, MOSTLY_Q5_K_S: the closest labels).
uint32_t quant_scheme_file_type(QuantScheme s);

struct TensorPlanInput {
  std::string name;
  uint32_t n_dims;
  uint64_t ne0;     // row length
  GgmlType type;    // current type
};

struct ModelShape {
  int n_layer = 0;
  int n_expert = 0;
  int n_gqa = 1;  // query heads per KV head (n_head / n_head_kv)
};

// Target type of every tensor (same order as `tensors`, which is the file order).
std::vector<GgmlType> plan_quantization(const std::vector<TensorPlanInput>& tensors, QuantScheme scheme,
                                        const ModelShape& shape, bool pure = false);

bool tensor_is_quantizable(const TensorPlanInput& t);

}  // namespace strata
