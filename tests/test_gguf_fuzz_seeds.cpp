// The committed seeds of the GGUF fuzzer (tests/fuzz/seeds/fuzz_gguf/) are small files made by the
// writer. This test rebuilds them and checks the committed bytes match, so they never rot; to
// regenerate after a deliberate format change:  STRATA_WRITE_SEEDS=1 strata_tests --gtest_filter='GgufFuzzSeeds*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::gguf;

namespace {

std::vector<uint8_t> bytes_of(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

void add(Writer& w, const std::string& name, GgmlType t, std::vector<uint64_t> dims, uint32_t seed) {
  const auto& tt = type_traits(t);
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  w.add_tensor(name, t, dims, bytes_of(dims[0] / tt.block_size * tt.type_size * rows, seed));
}

std::map<std::string, std::vector<uint8_t>> make_seeds() {
  std::map<std::string, std::vector<uint8_t>> seeds;

  Writer all;  // every value type, arrays of each, nested and empty arrays; no tensors
  all.set("general.architecture", "seed");
  all.set("s.u8", uint8_t{200});
  all.set("s.i8", int8_t{-3});
  all.set("s.u16", uint16_t{60000});
  all.set("s.i16", int16_t{-300});
  all.set("s.u32", uint32_t{123456});
  all.set("s.i32", int32_t{-123456});
  all.set("s.u64", uint64_t{1} << 40);
  all.set("s.i64", int64_t{-1} << 40);
  all.set("s.f32", 0.5f);
  all.set("s.f64", 0.25);
  all.set("s.bool", true);
  all.set("s.str", "text");
  all.set_array("a.u8", std::vector<uint8_t>{1, 2, 3});
  all.set_array("a.i32", std::vector<int32_t>{-1, 0, 1});
  all.set_array("a.f32", std::vector<float>{1.0f, -2.0f});
  all.set_array("a.bool", std::vector<bool>{true, false});
  all.set_array("a.str", std::vector<std::string>{"x", "", "yz"});
  all.set_array("a.u64", std::vector<uint64_t>{});
  all.set_value("a.nested", make_array(ValueType::ARRAY, {make_array(std::vector<std::string>{"p", "q"}),
                                                          make_array(std::vector<std::string>{})}));
  seeds["all_types.gguf"] = all.to_bytes();
  std::vector<uint8_t> v2 = seeds["all_types.gguf"];
  v2[4] = 2;  // the same content as GGUF v2
  seeds["all_types_v2.gguf"] = v2;

  Writer tens;  // one tensor of several formats, 1-4 dims, alignment 64
  tens.set_alignment(64);
  tens.set("general.architecture", "seed");
  add(tens, "f32", GgmlType::F32, {8}, 1);
  add(tens, "f16", GgmlType::F16, {4, 2}, 2);
  add(tens, "bf16", GgmlType::BF16, {2, 1, 3}, 3);
  add(tens, "q8_0", GgmlType::Q8_0, {32, 2}, 4);
  add(tens, "q4_K", GgmlType::Q4_K, {256, 1, 1, 2}, 5);
  add(tens, "iq2_xxs", GgmlType::IQ2_XXS, {256}, 6);
  add(tens, "mxfp4", GgmlType::MXFP4, {32}, 7);
  seeds["tensors.gguf"] = tens.to_bytes();

  // A model-shaped file: the tiny fixture model's real metadata (tokenizer included) with two small
  // stand-in tensors named like a MoE layer's.
  File fx = File::open(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q8_0.gguf");
  Writer model;
  for (const KeyValue& kv : fx.metadata()) model.set_value(kv.key, kv.value);
  add(model, "blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {32, 2, 2}, 8);
  add(model, "output_norm.weight", GgmlType::F32, {4}, 9);
  seeds["mini_model.gguf"] = model.to_bytes();
  return seeds;
}

}  // namespace

TEST(GgufFuzzSeeds, CommittedSeedsAreTheWritersOutput) {
  const fs::path dir = fs::path(STRATA_SOURCE_DIR) / "tests/fuzz/seeds/fuzz_gguf";
  const bool write = std::getenv("STRATA_WRITE_SEEDS") != nullptr;
  size_t total = 0;
  const auto seeds = make_seeds();
  // Nothing else in the directory (a fuzzer run pointed at it as its corpus would add files).
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_TRUE(seeds.count(e.path().filename().string())) << "unexpected file in seeds: " << e.path();
  for (const auto& [name, bytes] : seeds) {
    SCOPED_TRACE(name);
    // Each seed parses (they are meant to start the fuzzer inside valid files).
    File f = File::from_memory(bytes.data(), bytes.size(), name);
    EXPECT_FALSE(f.metadata().empty());
    if (write) {
      fs::create_directories(dir);
      std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                         static_cast<std::streamsize>(bytes.size()));
    }
    std::ifstream in(dir / name, std::ios::binary);
    ASSERT_TRUE(in.good()) << "missing seed; run with STRATA_WRITE_SEEDS=1";
    const std::vector<uint8_t> committed(std::istreambuf_iterator<char>(in), {});
    EXPECT_TRUE(committed == bytes) << "stale seed; run with STRATA_WRITE_SEEDS=1";
    total += bytes.size();
  }
  EXPECT_LT(total, 200u * 1024);  // seeds stay small
}
