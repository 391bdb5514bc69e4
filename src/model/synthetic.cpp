#include "model/synthetic.h"

#include <cmath>
#include <cstring>
#include <map>
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
  } else if (name == "qwen3-next-80b-a3b") {
    arch = "qwen3next";
    n_layer = 48; n_embd = 2048; n_head = 16; n_head_kv = 2; head_dim = 256; n_rot = 64;
    n_expert = 512; n_expert_used = 10; n_ff_exp = 512; n_ff_shexp = 512; n_vocab = 151936;
    n_ctx_train = 262144; rope_base = 1e7f; rms_eps = 1e-6f;
    ssm_conv_kernel = 4; ssm_state = 128; ssm_k_heads = 16; ssm_v_heads = 32;
    full_attention_interval = 4;
  } else if (name == "tiny-qwen3next") {
    arch = "qwen3next";
    n_layer = 4; n_embd = 256; n_head = 4; n_head_kv = 2; head_dim = 64; n_rot = 16;
    n_expert = 8; n_expert_used = 2; n_ff_exp = 256; n_ff_shexp = 256; n_vocab = 512;
    n_ctx_train = 4096; rope_base = 1e7f;
    ssm_conv_kernel = 4; ssm_state = 64; ssm_k_heads = 2; ssm_v_heads = 4;
    full_attention_interval = 4;
  } else {
    fail("unknown preset '{}' (known: qwen3-30b-a3b, tiny, qwen3-next-80b-a3b, tiny-qwen3next)", name);
  }
}

void SyntheticSpec::validate() const {
  STRATA_REQUIRE(arch == "qwen3moe" || arch == "qwen3next",
                 "mkmodel writes qwen3moe and qwen3next models, not '{}'", arch);
  if (arch == "qwen3next") {
    STRATA_REQUIRE(ssm_conv_kernel >= 1 && ssm_state >= 1 && ssm_k_heads >= 1 && ssm_v_heads >= 1 &&
                       full_attention_interval >= 1 && n_ff_shexp >= 1,
                   "mkmodel: qwen3next needs conv kernel, state size, key/value heads, full-attention "
                   "interval and shared FFN >= 1");
    STRATA_REQUIRE(ssm_v_heads % ssm_k_heads == 0,
                   "mkmodel: {} GDN value heads is not a multiple of {} key heads", ssm_v_heads,
                   ssm_k_heads);
    STRATA_REQUIRE(n_rot <= head_dim && n_rot % 2 == 0,
                   "mkmodel: rotary dims {} must be even and <= head size {}", n_rot, head_dim);
  }
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
  if (arch == "qwen3next") {
    const uint64_t Kd = uint64_t(ssm_k_heads) * ssm_state, Vd = uint64_t(ssm_v_heads) * ssm_state;
    const uint64_t C = 2 * Kd + Vd, ffn = E * n_expert + 3 * E * n_ff_exp * n_expert + E +
                                          3 * E * n_ff_shexp;
    const uint64_t gdn = E * C + E * Vd + E * 2 * ssm_v_heads + ssm_conv_kernel * C +
                         2 * ssm_v_heads + ssm_state + Vd * E;
    const uint64_t attn = E * n_head * 2 * D + 2 * E * n_head_kv * D + 2 * D + n_head * D * E;
    uint64_t n = 0;
    for (uint32_t l = 0; l < n_layer; ++l)
      n += 2 * E + ffn + ((l + 1) % full_attention_interval != 0 ? gdn : attn);
    return n + E * V * (tied ? 1 : 2) + E;
  }
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
  bool decay = false;  // ssm_a: negative (-exp(A_log) in [-1.5, -0.5]), so the GDN state decays
};

// qwen3next layers as llama.cpp names and shapes them (src/model/qwen3next.cpp loads them).
void plan_qwen3next_layer(const SyntheticSpec& s, uint32_t l, std::vector<PlannedTensor>& ts) {
  const uint64_t E = s.n_embd, D = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  const uint64_t Hv = s.ssm_v_heads, Kd = uint64_t(s.ssm_k_heads) * s.ssm_state, Vd = Hv * s.ssm_state;
  const std::string p = "blk." + std::to_string(l) + ".";
  ts.push_back({p + "attn_norm.weight", {E}, true});
  ts.push_back({p + "post_attention_norm.weight", {E}, true});
  if ((l + 1) % s.full_attention_interval != 0) {  // Gated DeltaNet
    ts.push_back({p + "attn_qkv.weight", {E, 2 * Kd + Vd}, false});
    ts.push_back({p + "attn_gate.weight", {E, Vd}, false});
    ts.push_back({p + "ssm_ba.weight", {E, 2 * Hv}, false});
    ts.push_back({p + "ssm_conv1d.weight", {s.ssm_conv_kernel, 2 * Kd + Vd}, false});
    ts.push_back({p + "ssm_a", {Hv}, false, GgmlType::F32, true});
    ts.push_back({p + "ssm_dt.bias", {Hv}, false});
    ts.push_back({p + "ssm_norm.weight", {s.ssm_state}, true});
    ts.push_back({p + "ssm_out.weight", {Vd, E}, false});
  } else {  // gated attention: attn_q yields query and output gate
    ts.push_back({p + "attn_q.weight", {E, H * 2 * D}, false});
    ts.push_back({p + "attn_k.weight", {E, Hkv * D}, false});
    ts.push_back({p + "attn_v.weight", {E, Hkv * D}, false});
    ts.push_back({p + "attn_q_norm.weight", {D}, true});
    ts.push_back({p + "attn_k_norm.weight", {D}, true});
    ts.push_back({p + "attn_output.weight", {H * D, E}, false});
  }
  ts.push_back({p + "ffn_gate_inp.weight", {E, s.n_expert}, false});
  ts.push_back({p + "ffn_gate_exps.weight", {E, s.n_ff_exp, s.n_expert}, false});
  ts.push_back({p + "ffn_up_exps.weight", {E, s.n_ff_exp, s.n_expert}, false});
  ts.push_back({p + "ffn_down_exps.weight", {s.n_ff_exp, E, s.n_expert}, false});
  ts.push_back({p + "ffn_gate_inp_shexp.weight", {E}, false});
  ts.push_back({p + "ffn_gate_shexp.weight", {E, s.n_ff_shexp}, false});
  ts.push_back({p + "ffn_up_shexp.weight", {E, s.n_ff_shexp}, false});
  ts.push_back({p + "ffn_down_shexp.weight", {s.n_ff_shexp, E}, false});
}

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
  if (a == "qwen3next") {
    w.set(a + ".rope.dimension_count", s.n_rot ? s.n_rot : s.head_dim);
    w.set(a + ".expert_shared_feed_forward_length", s.n_ff_shexp);
    w.set(a + ".ssm.conv_kernel", s.ssm_conv_kernel);
    w.set(a + ".ssm.state_size", s.ssm_state);
    w.set(a + ".ssm.group_count", s.ssm_k_heads);
    w.set(a + ".ssm.time_step_rank", s.ssm_v_heads);
    w.set(a + ".ssm.inner_size", s.ssm_v_heads * s.ssm_state);
    w.set(a + ".full_attention_interval", s.full_attention_interval);
  }
  if (s.vocab_from.empty()) synthetic_vocab(w, s.n_vocab);

  // Tensors in llama.cpp's file order.
  const uint64_t E = s.n_embd, D = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  std::vector<PlannedTensor> ts;
  ts.push_back({"token_embd.weight", {E, s.n_vocab}, false});
  ts.push_back({"output_norm.weight", {E}, true});
  if (!s.tied) ts.push_back({"output.weight", {E, s.n_vocab}, false});
  for (uint32_t l = 0; l < s.n_layer && a == "qwen3next"; ++l) plan_qwen3next_layer(s, l, ts);
  for (uint32_t l = 0; l < s.n_layer && a == "qwen3moe"; ++l) {
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
                 "mkmodel: format '{}' is not one of {}, F32, F16, BF16", s.format, quant_scheme_names());
  std::vector<TensorPlanInput> plan_in;
  for (const auto& t : ts) plan_in.push_back({t.name, uint32_t(t.dims.size()), t.dims[0], GgmlType::F32});
  if (scheme) {
    const ModelShape shape{int(s.n_layer), int(s.n_expert), int(s.n_head / std::max<uint32_t>(s.n_head_kv, 1))};
    const auto types = plan_quantization(plan_in, *scheme, shape, s.pure);
    for (size_t i = 0; i < ts.size(); ++i) ts[i].type = types[i];
  } else {
    for (size_t i = 0; i < ts.size(); ++i)
      ts[i].type = tensor_is_quantizable(plan_in[i]) ? *ft : GgmlType::F32;
  }
  if (scheme) w.set("general.file_type", quant_scheme_file_type(*scheme));

  // Generate and encode each tensor, rows split over the pool. Every row has its own generator
  // (seeded by tensor and row), so the file does not depend on the thread count.
  // repeat_layers: the first layer's bytes of each tensor, keyed by its name after "blk.N." and its type
  // (a mix such as Q4_K_M gives the same tensor another type in some layers: that one is made once too).
  std::map<std::string, std::vector<uint8_t>> first_layer;
  auto layer_suffix = [](const std::string& name) -> std::string {
    if (name.rfind("blk.", 0) != 0) return {};
    return name.substr(name.find('.', 4) + 1);
  };
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    const PlannedTensor& t = ts[ti];
    const std::string suffix = layer_suffix(t.name);
    const std::string repeat_key = suffix.empty() ? suffix : suffix + "|" + std::string(type_name(t.type));
    if (s.repeat_layers && !suffix.empty()) {
      const auto it = first_layer.find(repeat_key);
      if (it != first_layer.end()) {
        w.add_tensor(t.name, t.type, t.dims, it->second);
        continue;
      }
    }
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
          x = t.decay ? -(1.0f + 0.5f * u) : t.norm ? 1.0f + 0.05f * u : amp * u;
        }
        uint8_t* dst = bytes.data() + uint64_t(r) * rb;
        if (t.type == GgmlType::F32)
          std::memcpy(dst, row.data(), n0 * 4);
        else
          quantize_row(t.type, row.data(), dst, int64_t(n0));
      }
    });
    w.add_tensor(t.name, t.type, t.dims, bytes);
    if (s.repeat_layers && !suffix.empty()) first_layer.emplace(repeat_key, std::move(bytes));
  }
  w.write(path);
}

}  // namespace strata
