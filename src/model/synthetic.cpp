#include "model/synthetic.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "common/checked_math.h"
#include "common/error.h"
#include "engine/sampling.h"
#include "gguf/writer.h"
#include "quant/quantize.h"

namespace strata {

void SyntheticSpec::apply_preset(const std::string& name) {
  if (name == "qwen3-30b-a3b") {
    arch = "qwen3moe";
    n_layer = 48; n_embd = 2048; n_head = 32; n_head_kv = 4; head_dim = 128;
    n_expert = 128; n_expert_used = 8; n_ff_exp = 768; n_vocab = 151936; n_ctx_train = 40960;
    rope_base = 1e6f; rms_eps = 1e-6f;
  } else if (name == "tiny") {
    arch = "qwen3moe";
    n_layer = 2; n_embd = 256; n_head = 4; n_head_kv = 2; head_dim = 64;
    n_expert = 8; n_expert_used = 2; n_ff_exp = 256; n_vocab = 512; n_ctx_train = 4096;
  } else {
    fail("unknown preset '{}' (known: qwen3-30b-a3b, tiny)", name);
  }
}

void SyntheticSpec::validate() const {
  STRATA_REQUIRE(arch == "qwen3moe", "mkmodel writes qwen3moe models, not '{}'", arch);
  STRATA_REQUIRE(n_layer >= 1 && n_embd >= 1 && n_head >= 1 && n_head_kv >= 1 && head_dim >= 2,
                 "mkmodel: layers, embedding, heads and head size must be >= 1");
  STRATA_REQUIRE(n_head % n_head_kv == 0, "mkmodel: {} heads is not a multiple of {} KV heads",
                 n_head, n_head_kv);
  STRATA_REQUIRE(head_dim % 2 == 0, "mkmodel: head size {} must be even (RoPE)", head_dim);
  STRATA_REQUIRE(n_expert >= 1 && n_expert_used >= 1 && n_expert_used <= n_expert && n_ff_exp >= 1,
                 "mkmodel: need 1 <= experts used ({}) <= experts ({}) and an expert FFN size",
                 n_expert_used, n_expert);
  STRATA_REQUIRE(vocab_from.empty() ? n_vocab >= 260 : true,
                 "mkmodel: a synthetic vocabulary needs >= 260 tokens (256 bytes + specials)");
}

uint64_t SyntheticSpec::weight_count() const {
  const uint64_t E = n_embd, D = head_dim, V = n_vocab;
  const uint64_t per_layer = 2 * E + E * n_head * D + 2 * E * n_head_kv * D + 2 * D + n_head * D * E +
                             E * n_expert + 3 * E * n_ff_exp * n_expert;
  return n_layer * per_layer + E * V * (tied ? 1 : 2) + E;
}

namespace {

// GPT-2's byte -> unicode mapping (printable bytes map to themselves, the rest to U+0100..).
std::string byte_token(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

void synthetic_vocab(gguf::Writer& w, uint32_t n_vocab) {
  // 256 byte tokens, then merges of byte pairs ("a b" -> "ab"), then 3 control tokens at the end.
  const uint32_t n_special = 3, n_merged = n_vocab - 256 - n_special;
  STRATA_REQUIRE(n_merged <= 256u * 256u,
                 "mkmodel: a synthetic vocabulary holds at most {} tokens; use --vocab-from for more",
                 256 + 256 * 256 + n_special);
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_token(b));
    types.push_back(1);
  }
  for (uint32_t i = 0; i < n_merged; ++i) {
    // Pairs of printable letters first (a-z A-Z), then every other byte pair.
    const int a = int(i / 256), b = int(i % 256);
    const std::string l = byte_token((a + 'a') % 256), r = byte_token((b + 'a') % 256);
    tokens.push_back(l + r);
    merges.push_back(l + " " + r);
    types.push_back(1);
  }
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(s);
    types.push_back(3);
  }
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.pre", std::string("qwen2"));
  w.set_array("tokenizer.ggml.tokens", tokens);
  w.set_array("tokenizer.ggml.token_type", types);
  w.set_array("tokenizer.ggml.merges", merges);
  w.set("tokenizer.ggml.bos_token_id", uint32_t(n_vocab - 3));
  w.set("tokenizer.ggml.eos_token_id", uint32_t(n_vocab - 1));
  w.set("tokenizer.ggml.padding_token_id", uint32_t(n_vocab - 3));
  w.set("tokenizer.ggml.add_bos_token", false);
  w.set("tokenizer.chat_template",
        std::string("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"));
}

struct PlannedTensor {
  std::string name;
  std::vector<uint64_t> dims;
  bool norm;          // 1.0 + small noise
  GgmlType type = GgmlType::F32;
};

}  // namespace

void write_synthetic_model(const SyntheticSpec& s0, const std::string& path, ThreadPool& pool) {
  SyntheticSpec s = s0;
  gguf::Writer w;
  std::unique_ptr<gguf::File> vocab_file;
  if (!s.vocab_from.empty()) {
    vocab_file = std::make_unique<gguf::File>(gguf::File::open(s.vocab_from));
    bool any = false;
    for (const auto& kv : vocab_file->metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0) {
        w.set_value(kv.key, kv.value);
        any = true;
      }
    STRATA_REQUIRE(any && vocab_file->has("tokenizer.ggml.tokens"),
                   "{}: no tokenizer.ggml.tokens to copy", s.vocab_from);
    s.n_vocab = static_cast<uint32_t>(vocab_file->find("tokenizer.ggml.tokens")->arr.size());
  }
  s.validate();
  const std::string a = s.arch;
  w.set("general.architecture", a);
  w.set("general.name", std::string("strata-synthetic-") + a);
  w.set(a + ".context_length", s.n_ctx_train);
  w.set(a + ".embedding_length", s.n_embd);
  w.set(a + ".block_count", s.n_layer);
  w.set(a + ".feed_forward_length", s.n_ff_exp * 2);
  w.set(a + ".expert_feed_forward_length", s.n_ff_exp);
  w.set(a + ".expert_count", s.n_expert);
  w.set(a + ".expert_used_count", s.n_expert_used);
  w.set(a + ".attention.head_count", s.n_head);
  w.set(a + ".attention.head_count_kv", s.n_head_kv);
  w.set(a + ".attention.key_length", s.head_dim);
  w.set(a + ".attention.value_length", s.head_dim);
  w.set(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set(a + ".rope.freq_base", s.rope_base);
  if (s.vocab_from.empty()) synthetic_vocab(w, s.n_vocab);

  // Tensors in llama.cpp's file order.
  const uint64_t E = s.n_embd, D = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  std::vector<PlannedTensor> ts;
  ts.push_back({"token_embd.weight", {E, s.n_vocab}, false});
  ts.push_back({"output_norm.weight", {E}, true});
  if (!s.tied) ts.push_back({"output.weight", {E, s.n_vocab}, false});
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", {E}, true});
    ts.push_back({p + "attn_q.weight", {E, H * D}, false});
    ts.push_back({p + "attn_k.weight", {E, Hkv * D}, false});
    ts.push_back({p + "attn_v.weight", {E, Hkv * D}, false});
    ts.push_back({p + "attn_q_norm.weight", {D}, true});
    ts.push_back({p + "attn_k_norm.weight", {D}, true});
    ts.push_back({p + "attn_output.weight", {H * D, E}, false});
    ts.push_back({p + "ffn_norm.weight", {E}, true});
    ts.push_back({p + "ffn_gate_inp.weight", {E, s.n_expert}, false});
    ts.push_back({p + "ffn_gate_exps.weight", {E, s.n_ff_exp, s.n_expert}, false});
    ts.push_back({p + "ffn_up_exps.weight", {E, s.n_ff_exp, s.n_expert}, false});
    ts.push_back({p + "ffn_down_exps.weight", {s.n_ff_exp, E, s.n_expert}, false});
  }
  // Types: a float format everywhere quantizable, or the quantization plan of the scheme.
  const auto ft = type_from_name(s.format);
  const auto scheme = quant_scheme_from_name(s.format);
  STRATA_REQUIRE(scheme || (ft && (*ft == GgmlType::F32 || *ft == GgmlType::F16 || *ft == GgmlType::BF16)),
                 "mkmodel: format '{}' is not one of Q8_0, Q6_K, Q4_K, Q4_K_M, F32, F16, BF16", s.format);
  std::vector<TensorPlanInput> plan_in;
  for (const auto& t : ts) plan_in.push_back({t.name, uint32_t(t.dims.size()), t.dims[0], GgmlType::F32});
  if (scheme) {
    const auto types = plan_quantization(plan_in, *scheme, int(s.n_layer), int(s.n_expert));
    for (size_t i = 0; i < ts.size(); ++i) ts[i].type = types[i];
  } else {
    for (size_t i = 0; i < ts.size(); ++i)
      ts[i].type = tensor_is_quantizable(plan_in[i]) ? *ft : GgmlType::F32;
  }
  if (scheme) w.set("general.file_type", quant_scheme_file_type(*scheme));

  // Generate and encode each tensor, rows split over the pool. Every row has its own generator
  // (seeded by tensor and row), so the file does not depend on the thread count.
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    const PlannedTensor& t = ts[ti];
    const uint64_t n0 = t.dims[0];
    uint64_t rows = 1;
    for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
    const uint64_t rb = row_bytes(t.type, n0);
    auto total = checked_mul(rb, rows);
    STRATA_REQUIRE(total.has_value(), "mkmodel: tensor {} is too large", t.name);
    std::vector<uint8_t> bytes(*total);
    const float amp = std::sqrt(3.0f / float(n0));  // uniform(-amp, amp): variance 1/n0
    pool.parallel_for(int64_t(rows), 16, [&](int64_t r0, int64_t r1, int) {
      std::vector<float> row(n0);
      for (int64_t r = r0; r < r1; ++r) {
        Rng rng(s.seed * 0x9E3779B97F4A7C15ull + ti * 0x100000001B3ull + uint64_t(r));
        for (auto& x : row) {
          const float u = float(rng.uniform()) * 2.0f - 1.0f;
          x = t.norm ? 1.0f + 0.05f * u : amp * u;
        }
        uint8_t* dst = bytes.data() + uint64_t(r) * rb;
        if (t.type == GgmlType::F32)
          std::memcpy(dst, row.data(), n0 * 4);
        else
          quantize_row(t.type, row.data(), dst, int64_t(n0));
      }
    });
    w.add_tensor(t.name, t.type, t.dims, bytes);
  }
  w.write(path);
}

}  // namespace strata
