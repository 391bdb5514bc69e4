#pragma once
// qwen3next's hyper-parameters and checked weight views, shared by the CPU model (model/qwen3next.cpp)
// and the GPU model (cuda/qwen3next_cuda.cpp), so both read the same keys and tensors and give the same
// errors for a bad file. Tensor names and semantics: llama.cpp's `qwen3next`.
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/moe_ffn.h"
#include "model/weights.h"

namespace strata::qwen3next {

// Hyper-parameters of the Gated DeltaNet half (GGUF "<arch>.ssm.*") and the layer pattern.
struct NextParams {
  int32_t conv_kernel = 0;  // ssm.conv_kernel
  int32_t d_inner = 0;      // ssm.inner_size = n_v_heads * head_dim
  int32_t head_dim = 0;     // ssm.state_size: key and value head size
  int32_t n_v_heads = 0;    // ssm.time_step_rank
  int32_t n_k_heads = 0;    // ssm.group_count
  int32_t n_ff_shexp = 0;   // expert_shared_feed_forward_length
  int32_t n_layer = 0;      // decoder layers run by forward (block_count - nextn_predict_layers)
  int32_t n_nextn = 0;      // nextn_predict_layers: MTP blocks after the decoder (loaded, kept)
  std::vector<bool> recurrent;  // [n_layer] layer is Gated DeltaNet
  int64_t key_dim() const { return int64_t(n_k_heads) * head_dim; }
  int64_t value_dim() const { return int64_t(n_v_heads) * head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Reads and checks the keys above (errors name the file and the key).
NextParams read_next_params(const gguf::File& f, const HParams& hp);

struct GdnWeights {
  Weight qkv;      // [n_embd][2*key_dim + value_dim]  attn_qkv (absent in legacy files)
  Weight gate;     // [n_embd][value_dim]              attn_gate (z)
  Weight qkvz;     // [n_embd][2*key_dim + 2*value_dim] legacy ssm_in (grouped per key head)
  Weight ba;       // [n_embd][2*n_v_heads]            ssm_ba
  const float* conv = nullptr;  // [conv_dim][conv_kernel] ssm_conv1d as f32
  Weight a;        // [n_v_heads] f32                  ssm_a (= -exp(A_log))
  Weight dt_bias;  // [n_v_heads] f32                  ssm_dt.bias
  Weight norm;     // [head_dim] f32                   ssm_norm
  Weight out;      // [value_dim][n_embd]              ssm_out
};

struct AttnWeights {
  Weight wq;      // [n_embd][n_head * 2 * head_dim]  query and output gate per head
  Weight wk;      // [n_embd][n_head_kv * head_dim]
  Weight wv;      // [n_embd][n_head_kv * head_dim_v]
  Weight q_norm;  // [head_dim] f32
  Weight k_norm;  // [head_dim] f32
  Weight wo;      // [n_head * head_dim_v][n_embd]
};

struct Layer {
  bool recurrent = false;
  Weight attn_norm;  // [n_embd] f32
  Weight post_norm;  // [n_embd] f32  post_attention_norm (the FFN's input norm)
  GdnWeights gdn;
  AttnWeights attn;
  Weight router;           // [n_embd][n_expert]
  ExpertWeights experts;
  Weight sh_gate_inp;      // [n_embd] f32  ffn_gate_inp_shexp
  Weight sh_gate, sh_up;   // [n_embd][n_ff_shexp]
  Weight sh_down;          // [n_ff_shexp][n_embd]
};

// Every weight of the file as checked views into the mapping (plus the f32 copies of a non-f32
// ssm_conv1d). Holds pointers into `file`, which must outlive it. Not copyable (conv points into conv_f32).
struct Weights {
  Weights() = default;
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;
  Weight tok_embd;     // [n_embd][n_vocab]
  Weight output_norm;  // [n_embd] f32
  Weight output;       // [n_embd][n_vocab] (token_embd when tied)
  bool tied = false;   // output is token_embd
  std::vector<Layer> layers;                  // [n_layer]
  std::vector<std::vector<float>> conv_f32;   // ssm_conv1d converted to f32 when stored otherwise
  // MTP/NextN blocks (blk.{n_layer}..): every tensor by name, kept for speculative decoding.
  std::map<std::string, Weight> nextn;
};

// Loads and checks every tensor (a missing or misshapen one: strata::Error naming it and the layer kind).
void load_weights(const gguf::File& f, const HParams& hp, const NextParams& np, Weights& w);

}  // namespace strata::qwen3next
