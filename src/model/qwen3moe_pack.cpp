#include "model/qwen3moe_pack.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/checked_math.h"
#include "common/error.h"

namespace strata {

const char* const kChatMlTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

namespace {

using json = nlohmann::json;

const json& field(const json& j, const char* key, const std::string& where) {
  STRATA_REQUIRE(j.is_object() && j.contains(key), "{}: missing '{}'", where, key);
  return j.at(key);
}

int64_t int_field(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const json& v = field(j, key, where);
  STRATA_REQUIRE(v.is_number_integer(), "{}: '{}' should be an integer", where, key);
  const int64_t x = v.get<int64_t>();
  STRATA_REQUIRE(x >= lo && x <= hi, "{}: '{}' = {} is out of range [{}, {}]", where, key, x, lo, hi);
  return x;
}

std::string str_field(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  STRATA_REQUIRE(v.is_string(), "{}: '{}' should be a string", where, key);
  return v.get<std::string>();
}

uint64_t mul(uint64_t a, uint64_t b) {
  const auto r = checked_mul(a, b);
  STRATA_REQUIRE(r, "tensor size overflows");
  return *r;
}

std::vector<uint8_t> read_range(const std::filesystem::path& p, uint64_t offset, uint64_t n) {
  std::ifstream f(p, std::ios::binary);
  STRATA_REQUIRE(f, "cannot open blob {}", p.string());
  f.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  STRATA_REQUIRE(offset <= size && n <= size - offset, "blob {}: bytes [{}, +{}) past its end ({} bytes)",
                 p.string(), offset, n, size);
  std::vector<uint8_t> out(n);
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  STRATA_REQUIRE(f, "blob {}: read failed", p.string());
  return out;
}

}  // namespace

gguf::Writer pack_qwen3moe_raw(const std::string& manifest_path, const RawPackOptions& opt) {
  std::ifstream in(manifest_path);
  STRATA_REQUIRE(in, "cannot open manifest {}", manifest_path);
  json m = json::parse(in, nullptr, /*allow_exceptions=*/false);
  STRATA_REQUIRE(!m.is_discarded() && m.is_object(), "{}: not a JSON object", manifest_path);
  const std::string w = manifest_path;
  const json& hp = field(m, "hparams", w);
  constexpr int64_t kBig = 1 << 20;
  const int64_t n_vocab = int_field(hp, "n_vocab", w, 1, kBig);
  const int64_t n_embd = int_field(hp, "n_embd", w, 1, kBig);
  const int64_t n_layer = int_field(hp, "n_layer", w, 1, 4096);
  const int64_t n_head = int_field(hp, "n_head", w, 1, 4096);
  const int64_t n_head_kv = int_field(hp, "n_head_kv", w, 1, n_head);
  const int64_t head_dim = int_field(hp, "head_dim", w, 2, 65536);
  const int64_t n_expert = int_field(hp, "n_expert", w, 1, 1024);
  const int64_t n_used = int_field(hp, "n_expert_used", w, 1, n_expert);
  const int64_t n_ff = int_field(hp, "n_ff_exp", w, 1, kBig);
  const int64_t n_ctx = int_field(hp, "n_ctx", w, 1, INT32_MAX);
  const json& rb = field(hp, "rope_base", w);
  const json& eps = field(hp, "rms_eps", w);
  STRATA_REQUIRE(rb.is_number() && rb.get<double>() > 0, "{}: rope_base must be a number > 0", w);
  STRATA_REQUIRE(eps.is_number() && eps.get<double>() >= 0, "{}: rms_eps must be a number >= 0", w);
  STRATA_REQUIRE(n_head % n_head_kv == 0, "{}: n_head {} not a multiple of n_head_kv {}", w, n_head,
                 n_head_kv);

  const json& tk = field(m, "tokenizer", w);
  const json& jt = field(tk, "tokens", w);
  const json& jty = field(tk, "token_type", w);
  const json& jm = field(tk, "merges", w);
  STRATA_REQUIRE(jt.is_array() && jty.is_array() && jm.is_array(),
                 "{}: tokenizer tokens/token_type/merges should be arrays", w);
  STRATA_REQUIRE(static_cast<int64_t>(jt.size()) == n_vocab && jty.size() == jt.size(),
                 "{}: {} tokens and {} token types for n_vocab {}", w, jt.size(), jty.size(), n_vocab);
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  for (const auto& t : jt) {
    STRATA_REQUIRE(t.is_string(), "{}: a token is not a string", w);
    tokens.push_back(t.get<std::string>());
  }
  for (const auto& t : jty) {
    STRATA_REQUIRE(t.is_number_integer() && t.get<int64_t>() >= 1 && t.get<int64_t>() <= 6,
                   "{}: token types must be integers 1..6", w);
    types.push_back(t.get<int32_t>());
  }
  for (const auto& t : jm) {
    STRATA_REQUIRE(t.is_string(), "{}: a merge is not a string", w);
    merges.push_back(t.get<std::string>());
  }
  auto id_of = [&](const std::string& s) -> uint32_t {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == s) return static_cast<uint32_t>(i);
    fail("{}: the vocabulary has no '{}'", w, s);
  };
  const uint32_t endoftext = id_of("<|endoftext|>"), im_end = id_of("<|im_end|>");
  id_of("<|im_start|>");

  gguf::Writer g;
  const std::string a = "qwen3moe.";
  g.set("general.architecture", "qwen3moe");
  g.set("general.type", "model");
  g.set("general.name", opt.name);
  if (!opt.license.empty()) g.set("general.license", opt.license);
  g.set<uint32_t>(a + "block_count", static_cast<uint32_t>(n_layer));
  g.set<uint32_t>(a + "context_length", static_cast<uint32_t>(n_ctx));
  g.set<uint32_t>(a + "embedding_length", static_cast<uint32_t>(n_embd));
  // HF intermediate_size: the model has no dense FFN, so the expert FFN length (as Qwen3-MoE configs
  // without dense layers would give it).
  g.set<uint32_t>(a + "feed_forward_length", static_cast<uint32_t>(n_ff));
  g.set<uint32_t>(a + "attention.head_count", static_cast<uint32_t>(n_head));
  g.set<uint32_t>(a + "attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
  g.set<float>(a + "rope.freq_base", rb.get<float>());
  g.set<float>(a + "attention.layer_norm_rms_epsilon", eps.get<float>());
  g.set<uint32_t>(a + "expert_used_count", static_cast<uint32_t>(n_used));
  g.set<uint32_t>(a + "attention.key_length", static_cast<uint32_t>(head_dim));
  g.set<uint32_t>(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  g.set<uint32_t>(a + "expert_count", static_cast<uint32_t>(n_expert));
  g.set<uint32_t>(a + "expert_feed_forward_length", static_cast<uint32_t>(n_ff));
  g.set<uint32_t>("general.file_type", 1);  // LLAMA_FTYPE_MOSTLY_F16
  g.set("tokenizer.ggml.model", "gpt2");
  g.set("tokenizer.ggml.pre", "qwen2");
  g.set_array("tokenizer.ggml.tokens", tokens);
  g.set_array("tokenizer.ggml.token_type", types);
  g.set_array("tokenizer.ggml.merges", merges);
  g.set<uint32_t>("tokenizer.ggml.eos_token_id", im_end);
  g.set<uint32_t>("tokenizer.ggml.padding_token_id", endoftext);
  g.set<uint32_t>("tokenizer.ggml.bos_token_id", endoftext);
  g.set("tokenizer.ggml.add_bos_token", false);
  g.set("tokenizer.chat_template", kChatMlTemplate);

  // Tensors: names and shapes the engine's qwen3moe loader expects (it re-checks them on load).
  const int64_t E = n_embd, V = n_vocab, D = head_dim, H = n_head, Hk = n_head_kv, X = n_expert;
  std::map<std::string, std::vector<int64_t>> want = {{"token_embd.weight", {E, V}},
                                                      {"output_norm.weight", {E}},
                                                      {"output.weight", {E, V}}};
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    want[p + "attn_norm.weight"] = {E};
    want[p + "attn_q.weight"] = {E, H * D};
    want[p + "attn_k.weight"] = {E, Hk * D};
    want[p + "attn_v.weight"] = {E, Hk * D};
    want[p + "attn_q_norm.weight"] = {D};
    want[p + "attn_k_norm.weight"] = {D};
    want[p + "attn_output.weight"] = {H * D, E};
    want[p + "ffn_norm.weight"] = {E};
    want[p + "ffn_gate_inp.weight"] = {E, X};
    want[p + "ffn_gate_exps.weight"] = {E, n_ff, X};
    want[p + "ffn_up_exps.weight"] = {E, n_ff, X};
    want[p + "ffn_down_exps.weight"] = {n_ff, E, X};
  }
  const std::filesystem::path dir = std::filesystem::path(manifest_path).parent_path();
  const json& tt = field(m, "tensors", w);
  STRATA_REQUIRE(tt.is_array(), "{}: 'tensors' should be an array", w);
  size_t found = 0;
  for (const auto& t : tt) {
    const std::string name = str_field(t, "name", w);
    auto it = want.find(name);
    STRATA_REQUIRE(it != want.end(), "{}: unexpected tensor '{}'", w, name);
    const json& ne = field(t, "ne", w);
    STRATA_REQUIRE(ne.is_array() && ne.size() == it->second.size(), "{}: {} should have {} dims", w, name,
                   it->second.size());
    std::vector<uint64_t> dims;
    uint64_t n_el = 1;
    for (size_t i = 0; i < ne.size(); ++i) {
      STRATA_REQUIRE(ne[i].is_number_integer() && ne[i].get<int64_t>() == it->second[i],
                     "{}: {} dim {} should be {}", w, name, i, it->second[i]);
      dims.push_back(static_cast<uint64_t>(it->second[i]));
      n_el = mul(n_el, dims.back());
    }
    const std::string dt = str_field(t, "dtype", w);
    STRATA_REQUIRE(dt == "f16" || dt == "f32", "{}: {} dtype '{}' (f16 or f32)", w, name, dt);
    const bool is_vec = dims.size() == 1;
    STRATA_REQUIRE(!is_vec || dt == "f32", "{}: 1-D tensor {} must be f32", w, name);
    const uint64_t nbytes = mul(n_el, dt == "f16" ? 2u : 4u);
    STRATA_REQUIRE(int_field(t, "nbytes", w, 0, INT64_MAX) == static_cast<int64_t>(nbytes),
                   "{}: {} nbytes should be {}", w, name, nbytes);
    const std::string file = str_field(t, "file", w);
    STRATA_REQUIRE(file.find('/') == std::string::npos && file.find("..") == std::string::npos,
                   "{}: blob name '{}' must be a plain file name", w, file);
    const auto offset = static_cast<uint64_t>(int_field(t, "offset", w, 0, INT64_MAX));
    const std::vector<uint8_t> bytes = read_range(dir / file, offset, nbytes);
    g.add_tensor(name, dt == "f16" ? GgmlType::F16 : GgmlType::F32, dims, bytes);
    want.erase(it);
    ++found;
  }
  want.erase("output.weight");  // optional: tied to token_embd when absent
  STRATA_REQUIRE(want.empty(), "{}: missing tensor '{}'", w, want.empty() ? "" : want.begin()->first);
  STRATA_REQUIRE(found > 0, "{}: no tensors", w);
  return g;
}

}  // namespace strata
