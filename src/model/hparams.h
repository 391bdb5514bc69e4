#pragma once
// Hyper-parameters read from GGUF metadata ("<arch>.<key>"), validated, with errors naming the key.
#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace strata {

struct HParams {
  std::string arch;           // general.architecture
  int32_t n_vocab = 0;        // rows of token_embd
  int32_t n_ctx_train = 0;    // <arch>.context_length
  int32_t n_embd = 0;         // <arch>.embedding_length
  int32_t n_layer = 0;        // <arch>.block_count
  int32_t n_head = 0;         // <arch>.attention.head_count
  int32_t n_head_kv = 0;      // <arch>.attention.head_count_kv
  int32_t head_dim = 0;       // <arch>.attention.key_length (default n_embd / n_head)
  int32_t head_dim_v = 0;     // <arch>.attention.value_length (default head_dim)
  int32_t n_rot = 0;          // <arch>.rope.dimension_count (default head_dim)
  float rope_base = 10000.f;  // <arch>.rope.freq_base
  float rms_eps = 1e-6f;      // <arch>.attention.layer_norm_rms_epsilon
  int32_t n_expert = 0;       // <arch>.expert_count
  int32_t n_expert_used = 0;  // <arch>.expert_used_count
  int32_t n_ff_exp = 0;       // <arch>.expert_feed_forward_length
  bool expert_weights_norm = true;  // <arch>.expert_weights_norm (qwen3moe: renormalise top-k)
  int32_t bos_id = -1, eos_id = -1; // tokenizer.ggml.{bos,eos}_token_id (-1: none)
};

// Integer metadata of any integer type, range-checked into [lo, hi]; throws naming the key.
int64_t meta_int(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi);
int64_t meta_int_or(const gguf::File& f, const std::string& key, int64_t def, int64_t lo, int64_t hi);
float meta_float_or(const gguf::File& f, const std::string& key, float def);
bool meta_bool_or(const gguf::File& f, const std::string& key, bool def);

// The keys every attention+MoE architecture shares (the arch adds its own after).
HParams read_common_hparams(const gguf::File& f);

// Checks the expert counts, FFN size and RoPE width every MoE architecture needs, and sets
// hp.n_vocab from token_embd.weight ([n_embd][n_vocab]); errors name the file and the key.
void check_moe_hparams_and_vocab(HParams& hp, const gguf::File& f);

}  // namespace strata
