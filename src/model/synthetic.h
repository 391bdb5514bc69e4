#pragma once
// Random-weight model files of any geometry and format, for benchmarks and tests (`strata mkmodel`).
// The weights are uniform random with variance 1/fan_in (norms 1.0, router f32), quantized with
// strata's quantizers (quant/quantize.h) through the same type plan as `strata quantize`
// (quant/quant_mix.h), and written with the GGUF writer. The tokenizer is either copied from another
// GGUF (--vocab-from, e.g. the real Qwen2/3 vocabulary) or a synthetic byte-level BPE vocabulary, so
// that llama.cpp and strata both load the file.
#include <cstdint>
#include <string>

#include "cpu/thread_pool.h"
#include "quant/quant_mix.h"
#include "quant/types.h"

namespace strata {

struct SyntheticSpec {
  std::string arch = "qwen3moe";
  uint32_t n_layer = 2, n_embd = 256, n_head = 4, n_head_kv = 2, head_dim = 64;
  uint32_t n_expert = 8, n_expert_used = 2, n_ff_exp = 256;
  uint32_t n_vocab = 512;  // ignored with vocab_from (the copied vocabulary sets it)
  uint32_t n_ctx_train = 4096;
  float rope_base = 1e6f, rms_eps = 1e-6f;
  // Weight format: a scheme of quant_mix.h (Q8_0, Q4_K_M, Q2_K, IQ4_XS, ...) or a float type (F32/F16/BF16).
  std::string format = "Q8_0";
  bool pure = false;  // the scheme's base type for every quantizable tensor (quant_mix.h)
  bool tied = false;  // no output.weight: the output reuses token_embd
  uint64_t seed = 1;
  std::string vocab_from;  // GGUF whose tokenizer.* metadata is copied
  // Layers after the first get copies of the first layer's weights: writing costs one layer's
  // quantization, and speed is unchanged (every layer still has its own bytes in the file).
  bool repeat_layers = false;
  // qwen3next only (hybrid Gated DeltaNet + gated attention, shared expert):
  uint32_t n_rot = 0;                    // rope.dimension_count (0: head_dim)
  uint32_t ssm_conv_kernel = 4;          // ssm.conv_kernel
  uint32_t ssm_state = 128;              // ssm.state_size: GDN key/value head size
  uint32_t ssm_k_heads = 16;             // ssm.group_count
  uint32_t ssm_v_heads = 32;             // ssm.time_step_rank (inner_size = v_heads * state)
  uint32_t full_attention_interval = 4;  // every n-th layer attends, the others are GDN
  uint32_t n_ff_shexp = 512;             // expert_shared_feed_forward_length
  // Named geometries: "qwen3-30b-a3b" (48 layers, n_embd 2048, 128 experts / 8 used, expert FFN 768,
  // 32 q heads / 4 kv heads of 128, vocab 151936), "tiny" (the fixtures' shape),
  // "qwen3-next-80b-a3b" (qwen3next: 48 layers, n_embd 2048, 512 experts / 10 used + a shared expert,
  // FFN 512, attention 16 q / 2 kv heads of 256 with 64 rotary dims every 4th layer, GDN 16 key / 32
  // value heads of 128, conv 4, vocab 151936) and "tiny-qwen3next" (the qwen3next fixtures' shape).
  void apply_preset(const std::string& name);
  void validate() const;
  uint64_t weight_count() const;  // parameters in the file
};

// Writes the model to `path` (through a temporary file, so a failure leaves no half file).
void write_synthetic_model(const SyntheticSpec& spec, const std::string& path, ThreadPool& pool);

}  // namespace strata
