// The GGUF reader on every fixture file (llama.cpp-written), checked against the facts the fixture
// README states: geometry, tokenizer, tensor names, shapes and types.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gguf/gguf.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::gguf;

namespace {

const fs::path kFixtures = STRATA_FIXTURES_DIR;

std::vector<fs::path> gguf_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gguf") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// "tiny-qwen3moe-A-Q4_K_M.gguf" -> "Q4_K_M"
std::string file_type_of(const fs::path& p) {
  std::string stem = p.stem().string();
  return stem.substr(stem.rfind('-') + 1);
}

// Every tensor's data lies inside the file, after the data section start, with the bytes its type
// and shape imply.
void check_tensor_layout(const File& f) {
  for (const auto& t : f.tensors()) {
    const auto& tt = type_traits(t.type);
    EXPECT_EQ(t.ne[0] % tt.block_size, 0u) << t.name;
    EXPECT_EQ(t.nbytes, row_bytes(t.type, t.ne[0]) * t.n_rows()) << t.name;
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
    EXPECT_LE(f.data_offset() + t.offset + t.nbytes, f.file_size()) << t.name;
    EXPECT_EQ(t.data, f.tensors().front().data - f.tensors().front().offset + t.offset) << t.name;
  }
}

void expect_shape(const File& f, const std::string& name, std::vector<uint64_t> dims) {
  const TensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << f.path() << ": missing " << name;
  ASSERT_EQ(t->n_dims, dims.size()) << name;
  for (size_t d = 0; d < dims.size(); ++d) EXPECT_EQ(t->ne[d], dims[d]) << name << " dim " << d;
}

}  // namespace

TEST(GgufFixtures, EveryFixtureFileParses) {
  size_t n = 0;
  for (const char* sub : {"models", "vocab", "formats"}) {
    for (const auto& p : gguf_files(kFixtures / sub)) {
      SCOPED_TRACE(p.string());
      File f = File::open(p.string());
      EXPECT_EQ(f.version(), 3u);
      EXPECT_EQ(f.alignment(), 32u);
      EXPECT_EQ(f.file_size(), fs::file_size(p));
      check_tensor_layout(f);
      ++n;
    }
  }
  EXPECT_GE(n, 12u);  // 8 qwen3moe + 2 qwen3next + vocab + zoo
}

TEST(GgufFixtures, TinyQwen3MoeGeometry) {
  size_t n = 0;
  for (const auto& p : gguf_files(kFixtures / "models")) {
    if (p.filename().string().find("qwen3moe") == std::string::npos) continue;
    SCOPED_TRACE(p.string());
    ++n;
    File f = File::open(p.string());
    EXPECT_EQ(f.get<std::string>("general.architecture"), "qwen3moe");
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.embedding_length"), 256u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.block_count"), 2u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.attention.head_count"), 4u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.attention.head_count_kv"), 2u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.attention.key_length"), 64u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.expert_count"), 8u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.expert_used_count"), 2u);
    EXPECT_EQ(f.get<uint32_t>("qwen3moe.expert_feed_forward_length"), 256u);
    EXPECT_FLOAT_EQ(f.get<float>("qwen3moe.rope.freq_base"), 1e6f);
    EXPECT_FLOAT_EQ(f.get<float>("qwen3moe.attention.layer_norm_rms_epsilon"), 1e-6f);
    EXPECT_EQ(f.get<std::string>("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.get<std::string>("tokenizer.ggml.pre"), "qwen2");
    EXPECT_EQ(f.get_array<std::string>("tokenizer.ggml.tokens").size(), 512u);

    // 3 global tensors + 12 per layer (norms, q/k/v/o, q/k norms, router, 3 expert stacks).
    EXPECT_EQ(f.tensors().size(), 27u);
    expect_shape(f, "token_embd.weight", {256, 512});
    expect_shape(f, "output.weight", {256, 512});  // untied output
    expect_shape(f, "output_norm.weight", {256});
    for (int l = 0; l < 2; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      expect_shape(f, b + "attn_norm.weight", {256});
      expect_shape(f, b + "attn_q.weight", {256, 4 * 64});
      expect_shape(f, b + "attn_k.weight", {256, 2 * 64});
      expect_shape(f, b + "attn_v.weight", {256, 2 * 64});
      expect_shape(f, b + "attn_output.weight", {4 * 64, 256});
      expect_shape(f, b + "attn_q_norm.weight", {64});
      expect_shape(f, b + "attn_k_norm.weight", {64});
      expect_shape(f, b + "ffn_norm.weight", {256});
      expect_shape(f, b + "ffn_gate_inp.weight", {256, 8});
      expect_shape(f, b + "ffn_gate_exps.weight", {256, 256, 8});
      expect_shape(f, b + "ffn_up_exps.weight", {256, 256, 8});
      expect_shape(f, b + "ffn_down_exps.weight", {256, 256, 8});
    }
    // llama-quantize never quantizes 1-D tensors (norms) nor the router (ffn_gate_inp).
    for (const auto& t : f.tensors()) {
      if (t.n_dims == 1) {
        EXPECT_EQ(t.type, GgmlType::F32) << t.name;
      }
    }
    EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);

    // The expert stacks (the bulk of the file) are in the file's named type (Q4_K_M -> q4_K).
    std::string ft = file_type_of(p);
    if (ft.ends_with("_M") && ft.starts_with("Q")) ft = ft.substr(0, ft.size() - 2);
    auto expected = type_from_name(ft);
    ASSERT_TRUE(expected.has_value()) << ft;
    EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").type, *expected);
    EXPECT_EQ(f.tensor("blk.1.ffn_up_exps.weight").type, *expected);
    if (ft == "Q8_0") {  // not a mix: every matrix is q8_0
      for (const auto& t : f.tensors()) {
        if (t.n_dims > 1 && !t.name.ends_with("ffn_gate_inp.weight")) {
          EXPECT_EQ(t.type, GgmlType::Q8_0) << t.name;
        }
      }
    }
  }
  EXPECT_EQ(n, 8u);
}

TEST(GgufFixtures, TinyQwen3NextGeometry) {
  size_t n = 0;
  for (const auto& p : gguf_files(kFixtures / "models")) {
    if (p.filename().string().find("qwen3next") == std::string::npos) continue;
    SCOPED_TRACE(p.string());
    ++n;
    File f = File::open(p.string());
    EXPECT_EQ(f.get<std::string>("general.architecture"), "qwen3next");
    EXPECT_EQ(f.get<uint32_t>("qwen3next.embedding_length"), 256u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.block_count"), 4u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.full_attention_interval"), 4u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.attention.head_count"), 4u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.attention.head_count_kv"), 2u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.rope.dimension_count"), 16u);
    EXPECT_FLOAT_EQ(f.get<float>("qwen3next.rope.freq_base"), 1e7f);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.conv_kernel"), 4u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.ssm.state_size"), 64u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_count"), 8u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_used_count"), 2u);
    EXPECT_EQ(f.get<uint32_t>("qwen3next.expert_shared_feed_forward_length"), 256u);
    EXPECT_EQ(f.get_array<std::string>("tokenizer.ggml.tokens").size(), 512u);
    // Layers 0-2 are Gated DeltaNet, layer 3 full attention (q projection carries the output gate).
    for (int l = 0; l < 3; ++l) {
      EXPECT_NE(f.find_tensor("blk." + std::to_string(l) + ".ssm_out.weight"), nullptr) << l;
      EXPECT_EQ(f.find_tensor("blk." + std::to_string(l) + ".attn_q.weight"), nullptr) << l;
    }
    expect_shape(f, "blk.3.attn_q.weight", {256, 2 * 4 * 64});
    expect_shape(f, "blk.3.attn_k.weight", {256, 2 * 64});
    expect_shape(f, "blk.0.ffn_gate_inp_shexp.weight", {256});
    expect_shape(f, "blk.0.ffn_gate_exps.weight", {256, 256, 8});
    expect_shape(f, "blk.0.ffn_up_shexp.weight", {256, 256});
  }
  EXPECT_EQ(n, 2u);
}

TEST(GgufFixtures, RealQwen2Vocab) {
  File f = File::open((kFixtures / "vocab" / "ggml-vocab-qwen2.gguf").string());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get<std::string>("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get<std::string>("tokenizer.ggml.pre"), "qwen2");
  const auto tokens = f.get_array<std::string>("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 151936u);
  EXPECT_EQ(f.get_array<int32_t>("tokenizer.ggml.token_type").size(), tokens.size());
  EXPECT_GT(f.get_array<std::string>("tokenizer.ggml.merges").size(), 100000u);
  EXPECT_EQ(tokens[0], "!");  // byte-level BPE: the first ids are the printable bytes
  EXPECT_LE(f.data_offset(), f.file_size());
}

TEST(GgufFixtures, FormatZooHasEveryFormat) {
  File f = File::open((kFixtures / "formats" / "zoo.gguf").string());
  EXPECT_EQ(f.tensors().size(), 22u);
  for (const auto& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(t.name.starts_with("zoo."));
    auto named = type_from_name(t.name.substr(4));
    ASSERT_TRUE(named.has_value());
    EXPECT_EQ(t.type, *named);
    EXPECT_EQ(t.n_dims, 2u);
    EXPECT_EQ(t.ne[0], 256u);
    EXPECT_EQ(t.ne[1], 32u);
  }
}

TEST(GgufAccessors, TypedErrorsNameKeyExpectedAndFound) {
  File f = File::open((kFixtures / "models" / "tiny-qwen3moe-A-Q8_0.gguf").string());
  EXPECT_EQ(f.get_or<uint32_t>("qwen3moe.no_such_key", 7u), 7u);
  EXPECT_EQ(f.get_or<uint32_t>("qwen3moe.block_count", 7u), 2u);
  try {
    (void)f.get<int32_t>("qwen3moe.block_count");
    FAIL() << "no throw";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tiny-qwen3moe-A-Q8_0.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("'qwen3moe.block_count'"), std::string::npos) << m;
    EXPECT_NE(m.find("expected i32, found u32"), std::string::npos) << m;
  }
  try {
    (void)f.get<uint32_t>("qwen3moe.missing");
    FAIL() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("missing metadata key 'qwen3moe.missing'"), std::string::npos) << e.what();
  }
  try {
    (void)f.get_array<int32_t>("tokenizer.ggml.tokens");
    FAIL() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("expected array of i32, found array of string"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)f.get_or<float>("qwen3moe.block_count", 1.0f), FormatError);  // wrong type still throws
  EXPECT_THROW((void)f.get_array<std::string>("general.name"), FormatError);       // a string, not an array
  EXPECT_THROW((void)f.tensor("blk.9.attn_q.weight"), FormatError);
  EXPECT_EQ(f.find_tensor("blk.9.attn_q.weight"), nullptr);
  EXPECT_EQ(f.get<bool>("tokenizer.ggml.add_bos_token"), false);
}
