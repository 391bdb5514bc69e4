// `strata inspect`: runs the real CLI binary on fixture files and checks its JSON against facts from
// the fixture README, plus its errors on bad input; the summary module on writer-made edge cases.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "gguf/summary.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace strata;
using namespace strata::gguf;

namespace {

using CliResult = strata::test::CliOut;
CliResult run_cli(const std::string& args, bool merge_stderr = false) {
  return strata::test::run_strata(args, merge_stderr);
}

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

}  // namespace

TEST(InspectCli, JsonOfTinyQwen3MoeQ8_0) {
  const std::string path = kModels + "tiny-qwen3moe-A-Q8_0.gguf";
  CliResult r = run_cli("inspect --json " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "strata-inspect/1");
  EXPECT_EQ(j["file"]["path"], path);
  EXPECT_EQ(j["file"]["size"].get<uint64_t>(), fs::file_size(path));
  EXPECT_EQ(j["file"]["gguf_version"], 3);
  EXPECT_EQ(j["file"]["tensor_count"], 27);
  EXPECT_EQ(j["architecture"], "qwen3moe");
  EXPECT_EQ(j["file_type"]["name"], "Q8_0");
  const json& hp = j["hyperparameters"];
  EXPECT_EQ(hp["block_count"], 2);
  EXPECT_EQ(hp["embedding_length"], 256);
  EXPECT_EQ(hp["attention.head_count"], 4);
  EXPECT_EQ(hp["attention.head_count_kv"], 2);
  EXPECT_EQ(hp["expert_count"], 8);
  EXPECT_EQ(hp["expert_used_count"], 2);
  EXPECT_EQ(hp["rope.freq_base"].get<double>(), 1e6);
  EXPECT_EQ(hp["attention.layer_norm_rms_epsilon"].get<double>(), 1e-6);  // f32 shown as its shortest decimal
  const json& tok = j["tokenizer"];
  EXPECT_EQ(tok["model"], "gpt2");
  EXPECT_EQ(tok["pre"], "qwen2");
  EXPECT_EQ(tok["vocab_size"], 512);
  EXPECT_GT(tok["merges"].get<int>(), 0);
  EXPECT_TRUE(tok["bos_token"]["id"].is_number());
  EXPECT_TRUE(tok["eos_token"]["text"].is_string());
  EXPECT_EQ(tok["has_chat_template"], true);

  // Tensors: q8_0 blocks are 32 values in 34 bytes; an expert stack is 256 x 256 x 8.
  ASSERT_EQ(j["tensors"].size(), 27u);
  uint64_t sum = 0;
  for (const json& t : j["tensors"]) {
    sum += t["bytes"].get<uint64_t>();
    if (t["name"] == "blk.0.ffn_up_exps.weight") {
      EXPECT_EQ(t["type"], "q8_0");
      EXPECT_EQ(t["shape"], json({256, 256, 8}));
      EXPECT_EQ(t["bytes"].get<uint64_t>(), 256u * 256 * 8 / 32 * 34);
    }
  }
  EXPECT_EQ(j["totals"]["bytes"].get<uint64_t>(), sum);
  uint64_t by_type = 0;
  for (const json& t : j["totals_by_type"]) by_type += t["bytes"].get<uint64_t>();
  EXPECT_EQ(by_type, sum);
  EXPECT_EQ(j["totals_by_type"][0]["type"], "q8_0");  // the bulk of a Q8_0 file

  const json& ex = j["experts"];
  EXPECT_EQ(ex["count"], 8);
  EXPECT_EQ(ex["used"], 2);
  ASSERT_EQ(ex["layers"].size(), 2u);
  const uint64_t layer_bytes = 3ull * 256 * 256 * 8 / 32 * 34;  // gate, up, down
  for (const json& l : ex["layers"]) {
    EXPECT_EQ(l["bytes"].get<uint64_t>(), layer_bytes);
    EXPECT_EQ(l["bytes_per_expert"].get<uint64_t>(), layer_bytes / 8);
    EXPECT_EQ(l["tensors"].size(), 3u);
  }
  EXPECT_EQ(ex["bytes"].get<uint64_t>(), 2 * layer_bytes);
  // Metadata: every key, arrays as a count and a short head.
  EXPECT_EQ(j["metadata"].size(), j["file"]["metadata_count"].get<size_t>());
  for (const json& m : j["metadata"]) {
    if (m["key"] == "tokenizer.ggml.tokens") {
      EXPECT_EQ(m["type"], "array of string");
      EXPECT_EQ(m["count"], 512);
      EXPECT_EQ(m["head"].size(), 8u);
    }
  }
}

TEST(InspectCli, JsonOfQwen3NextAndRealVocab) {
  CliResult r = run_cli("inspect --json " + kModels + "tiny-qwen3next-N-Q4_K_M.gguf");
  ASSERT_EQ(r.rc, 0);
  json j = json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen3next");
  EXPECT_EQ(j["hyperparameters"]["full_attention_interval"], 4);
  EXPECT_EQ(j["experts"]["layers"].size(), 4u);  // shared experts (_shexp) are not routed experts
  for (const json& l : j["experts"]["layers"])
    for (const json& n : l["tensors"]) EXPECT_EQ(n.get<std::string>().find("shexp"), std::string::npos);

  r = run_cli("inspect --json " + std::string(STRATA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf");
  ASSERT_EQ(r.rc, 0);
  j = json::parse(r.out);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 151936);
  EXPECT_EQ(j["tokenizer"]["pre"], "qwen2");
  EXPECT_TRUE(j["tensors"].empty());
  EXPECT_TRUE(j["experts"].is_null());
}

TEST(InspectCli, TextOutput) {
  CliResult r = run_cli("inspect " + kModels + "tiny-qwen3moe-A-Q4_K_M.gguf");
  ASSERT_EQ(r.rc, 0);
  for (const char* s : {"architecture  qwen3moe", "file type     Q4_K_M (15)", "block_count", "model gpt2, pre qwen2, 512 tokens",
                        "blk.0.ffn_gate_exps.weight", "256 x 256 x 8", "totals by type", "experts       8 per layer, 2 used"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(InspectCli, BadInputIsAClearError) {
  const fs::path bad = fs::temp_directory_path() / ("strata_inspect_bad_" + std::to_string(::getpid()) + ".gguf");
  {
    Writer w;
    w.set("general.architecture", "x");
    auto b = w.to_bytes();
    b[24] = 0xff;  // first key's length: now far past the end of the file
    FILE* f = std::fopen(bad.c_str(), "wb");
    std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
  }
  CliResult r = run_cli("inspect " + bad.string(), true);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("strata: error: " + bad.string() + ": offset 24: metadata key: string length 255"),
            std::string::npos)
      << r.out;
  fs::remove(bad);
  r = run_cli("inspect /nonexistent.gguf", true);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("cannot open"), std::string::npos) << r.out;
}

TEST(InspectSummary, EdgeCases) {
  Writer w;  // no architecture, no tokenizer, expert-named tensors, invalid UTF-8 in a string
  w.set("general.name", std::string("bad \xff\xfe utf8"));
  w.set("x.f32", 0.1f);
  const std::vector<uint8_t> b(4 * 8 * 4);
  w.add_tensor("blk.3.ffn_up_exps.weight", GgmlType::F32, {8, 1, 4}, b);
  w.add_tensor("blk.3.ffn_up_shexp.weight", GgmlType::F32, {8, 4}, b);
  w.add_tensor("blk.x.ffn_up_exps.weight", GgmlType::F32, {32}, b);  // not a layer number
  const auto bytes = w.to_bytes();
  File f = File::from_memory(bytes.data(), bytes.size(), "edge");
  const json s = summarize(f);
  EXPECT_TRUE(s["architecture"].is_null());
  EXPECT_TRUE(s["tokenizer"].is_null());
  EXPECT_TRUE(s["hyperparameters"].empty());
  ASSERT_FALSE(s["experts"].is_null());
  EXPECT_EQ(s["experts"]["count"], 4);  // from the stack's last dimension when there is no expert_count
  ASSERT_EQ(s["experts"]["layers"].size(), 1u);
  EXPECT_EQ(s["experts"]["layers"][0]["layer"], 3);
  EXPECT_EQ(s["experts"]["layers"][0]["bytes"], 128);
  EXPECT_EQ(s["metadata"][1]["value"].get<double>(), 0.1);
  const std::string text = dump_json(s);  // must not throw on the invalid UTF-8
  EXPECT_NE(text.find("bad \xEF\xBF\xBD"), std::string::npos);
  EXPECT_NE(render_text(s).find("architecture  (none)"), std::string::npos);
  // Control bytes in strings are escaped in the text view; long values are cut on a UTF-8 boundary.
  Writer w2;
  w2.set("general.architecture", "a");
  w2.set("general.name", std::string("x\x1b[2Jy"));
  w2.set("general.description", std::string(56, 'a') + "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
  const File f2 = File::from_bytes(w2.to_bytes(), "ctl");
  const std::string t2 = render_text(summarize(f2));
  EXPECT_EQ(t2.find('\x1b'), std::string::npos);
  EXPECT_NE(t2.find("x\\x1b[2Jy"), std::string::npos) << t2;
  EXPECT_NE(t2.find(std::string(56, 'a') + "..."), std::string::npos) << t2;
  EXPECT_EQ(file_type_name(15), "Q4_K_M");
  EXPECT_EQ(file_type_name(4), "");
}
