#pragma once
// A tiny random qwen3moe GGUF (f32 weights) built in memory with the GGUF writer, with hooks to
// break it (drop or reshape a tensor, change the architecture) for the bad-input tests.
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf/writer.h"
#include "model/model.h"

namespace strata::test {

struct TinySpec {
  std::string arch = "qwen3moe";
  uint32_t n_vocab = 64, n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, head_dim = 16;
  uint32_t n_expert = 4, n_used = 2, n_ff = 32;
  bool tied = false;
  std::string drop;                         // tensor name to leave out
  std::string reshape;                      // tensor name to give a wrong first dim
  std::string norm_f16;                     // 1-D tensor to store as f16
  uint32_t seed = 7;
};

inline std::vector<uint8_t> build_tiny_qwen3moe(const TinySpec& s) {
  gguf::Writer w;
  const std::string a = s.arch;
  w.set("general.architecture", a);
  w.set(a + ".context_length", uint32_t{256});
  w.set(a + ".embedding_length", s.n_embd);
  w.set(a + ".block_count", s.n_layer);
  w.set(a + ".attention.head_count", s.n_head);
  w.set(a + ".attention.head_count_kv", s.n_head_kv);
  w.set(a + ".attention.key_length", s.head_dim);
  w.set(a + ".attention.value_length", s.head_dim);
  w.set(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.set(a + ".rope.freq_base", 1e6f);
  w.set(a + ".expert_count", s.n_expert);
  w.set(a + ".expert_used_count", s.n_used);
  w.set(a + ".expert_feed_forward_length", s.n_ff);
  std::mt19937 rng(s.seed);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, bool norm) {
    if (name == s.drop) return;
    if (name == s.reshape) dims[0] += 32;
    uint64_t n = 1;
    for (auto d : dims) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(dims[0])));
    std::vector<float> v(n);
    for (auto& x : v) x = norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
    if (name == s.norm_f16) {
      std::vector<uint16_t> h(n, 0x3c00);  // 1.0 in f16
      w.add_tensor(name, GgmlType::F16, dims,
                   {reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2});
      return;
    }
    w.add_tensor(name, GgmlType::F32, dims, {reinterpret_cast<const uint8_t*>(v.data()), n * 4});
  };
  const uint64_t E = s.n_embd, D = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  add("token_embd.weight", {E, s.n_vocab}, false);
  add("output_norm.weight", {E}, true);
  if (!s.tied) add("output.weight", {E, s.n_vocab}, false);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, true);
    add(p + "attn_q.weight", {E, H * D}, false);
    add(p + "attn_k.weight", {E, Hkv * D}, false);
    add(p + "attn_v.weight", {E, Hkv * D}, false);
    add(p + "attn_q_norm.weight", {D}, true);
    add(p + "attn_k_norm.weight", {D}, true);
    add(p + "attn_output.weight", {H * D, E}, false);
    add(p + "ffn_norm.weight", {E}, true);
    add(p + "ffn_gate_inp.weight", {E, s.n_expert}, false);
    add(p + "ffn_gate_exps.weight", {E, s.n_ff, s.n_expert}, false);
    add(p + "ffn_up_exps.weight", {E, s.n_ff, s.n_expert}, false);
    add(p + "ffn_down_exps.weight", {s.n_ff, E, s.n_expert}, false);
  }
  return w.to_bytes();
}

// The tiny model loaded from memory; the bytes live as long as the model that maps them.
struct TinyModel {
  std::vector<uint8_t> bytes;
  std::shared_ptr<const Model> model;
  explicit TinyModel(const TinySpec& s) : bytes(build_tiny_qwen3moe(s)) {
    model = load_model(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"));
  }
};

}  // namespace strata::test
