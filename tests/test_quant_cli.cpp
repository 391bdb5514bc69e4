// `strata quantize` and `strata dequant` end to end, and the Q4_K_M mix rule against the choices
// llama-quantize made for the fixture models.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli_run.h"
#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/quant_mix.h"
#include "sdq_reader.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;
const std::string kModels = kFixtures + "/models/";

using CliResult = strata::test::CliOut;
CliResult run_cli(const std::string& args) { return strata::test::run_strata(args); }  // stdout + stderr

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("strata-quant-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

std::vector<float> dequantize_all(const gguf::TensorInfo& t) {
  std::vector<float> v(t.n_elements());
  const uint64_t rb = row_bytes(t.type, t.ne[0]);
  for (uint64_t r = 0; r < t.n_rows(); ++r)
    dequantize_row(t.type, t.data + r * rb, v.data() + r * t.ne[0], static_cast<int64_t>(t.ne[0]));
  return v;
}

std::vector<GgmlType> plan_for(const gguf::File& f, QuantScheme s) {
  std::vector<TensorPlanInput> in;
  for (const auto& t : f.tensors()) in.push_back({t.name, t.n_dims, t.ne[0], t.type});
  const std::string arch = f.get<std::string>("general.architecture");
  const ModelShape shape{static_cast<int>(f.get<uint32_t>(arch + ".block_count")),
                         static_cast<int>(f.get<uint32_t>(arch + ".expert_count")),
                         static_cast<int>(f.get<uint32_t>(arch + ".attention.head_count") /
                                          f.get<uint32_t>(arch + ".attention.head_count_kv"))};
  return plan_quantization(in, s, shape);
}

}  // namespace

// The fixtures' *-Q4_K_M.gguf were made by llama-quantize: our rule must choose the same type for every
// tensor (qwen3moe and qwen3next: 8 experts, attn_v/attn_qkv in Q8_0, ffn_down of the later layers in
// Q6_K, attn_output Q5_K, norms and router untouched).
TEST(QuantMix, Q4_K_MMatchesLlamaQuantizeOnFixtures) {
  for (const char* m : {"tiny-qwen3moe-A-Q4_K_M.gguf", "tiny-qwen3next-N-Q4_K_M.gguf"}) {
    const auto f = gguf::File::open(kModels + m);
    const auto plan = plan_for(f, QuantScheme::Q4_K_M);
    ASSERT_EQ(plan.size(), f.tensors().size());
    for (size_t i = 0; i < plan.size(); ++i)
      EXPECT_EQ(type_name(plan[i]), type_name(f.tensors()[i].type)) << m << " " << f.tensors()[i].name;
  }
}

// llama.cpp's Q4_0 file type: output.weight Q6_K; attn_v and attn_k Q8_0 in 8-expert models only.
TEST(QuantMix, Q4_0Rule) {
  std::vector<TensorPlanInput> in = {{"token_embd.weight", 2, 2048, GgmlType::F16},
                                     {"blk.0.attn_k.weight", 2, 2048, GgmlType::F16},
                                     {"blk.0.attn_v.weight", 2, 2048, GgmlType::F16},
                                     {"blk.0.ffn_down_exps.weight", 3, 768, GgmlType::F16},
                                     {"blk.0.ffn_gate_inp.weight", 2, 2048, GgmlType::F32},
                                     {"output.weight", 2, 2048, GgmlType::F16}};
  const auto p128 = plan_quantization(in, QuantScheme::Q4_0, {1, 128});
  const std::vector<GgmlType> want128 = {GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0,
                                         GgmlType::Q4_0, GgmlType::F32,  GgmlType::Q6_K};
  EXPECT_EQ(p128, want128);
  const auto p8 = plan_quantization(in, QuantScheme::Q4_0, {1, 8});
  EXPECT_EQ(p8[1], GgmlType::Q8_0);
  EXPECT_EQ(p8[2], GgmlType::Q8_0);
  EXPECT_EQ(p8[3], GgmlType::Q4_0);
  in.pop_back();  // tied: token_embd is the output
  EXPECT_EQ(plan_quantization(in, QuantScheme::Q4_0, {1, 128})[0], GgmlType::Q6_K);
  EXPECT_EQ(quant_scheme_file_type(QuantScheme::Q4_0), 2u);
  EXPECT_EQ(quant_scheme_from_name("q4_0"), QuantScheme::Q4_0);
}

// Q5_K: pure, like Q4_K and Q6_K (every quantizable tensor; a row that is not whole 256-value blocks falls
// back to Q5_1, as in llama.cpp); file type 16 (MOSTLY_Q5_K_S, the closest label).
TEST(QuantMix, Q5_KIsPure) {
  const std::vector<TensorPlanInput> in = {{"token_embd.weight", 2, 2048, GgmlType::F16},
                                           {"blk.0.attn_v.weight", 2, 2048, GgmlType::F16},
                                           {"blk.0.ffn_down_exps.weight", 3, 768, GgmlType::F16},
                                           {"blk.0.ffn_gate_inp.weight", 2, 2048, GgmlType::F32},
                                           {"blk.0.attn_q_norm.weight", 1, 128, GgmlType::F32},
                                           {"blk.0.odd.weight", 2, 96, GgmlType::F16},
                                           {"output.weight", 2, 2048, GgmlType::F16}};
  const std::vector<GgmlType> want = {GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::F32,
                                      GgmlType::F32,  GgmlType::Q5_1, GgmlType::Q5_K};
  EXPECT_EQ(plan_quantization(in, QuantScheme::Q5_K, {1, 8}), want);
  EXPECT_EQ(quant_scheme_file_type(QuantScheme::Q5_K), 16u);
  EXPECT_EQ(quant_scheme_from_name("q5_k"), QuantScheme::Q5_K);
  EXPECT_EQ(quant_scheme_name(QuantScheme::Q5_K), "Q5_K");
}

TEST(QuantMix, UseMoreBitsRuleOnADeepDenseModel) {
  // 32 layers, no experts: attn_v and ffn_down in Q6_K for layers 0-3, 28-31 and (i-4) % 3 == 2.
  std::vector<TensorPlanInput> in;
  for (int i = 0; i < 32; ++i) {
    in.push_back({"blk." + std::to_string(i) + ".attn_v.weight", 2, 4096, GgmlType::F16});
    in.push_back({"blk." + std::to_string(i) + ".ffn_down.weight", 2, 14336, GgmlType::F16});
    in.push_back({"blk." + std::to_string(i) + ".attn_norm.weight", 1, 4096, GgmlType::F32});
  }
  in.push_back({"output.weight", 2, 4096, GgmlType::F16});
  in.push_back({"odd.weight", 2, 4000, GgmlType::F16});   // 4000 % 256 != 0 -> Q5_0 (llama.cpp's fallback)
  in.push_back({"odder.weight", 2, 4001, GgmlType::F16}); // not even a multiple of 32 -> F16
  const auto plan = plan_quantization(in, QuantScheme::Q4_K_M, {32, 0});
  for (int i = 0; i < 32; ++i) {
    const bool more = i < 4 || i >= 28 || (i - 4) % 3 == 2;
    const GgmlType want = more ? GgmlType::Q6_K : GgmlType::Q4_K;
    EXPECT_EQ(plan[3 * i], want) << i;
    EXPECT_EQ(plan[3 * i + 1], want) << i;
    EXPECT_EQ(plan[3 * i + 2], GgmlType::F32);
  }
  EXPECT_EQ(plan[96], GgmlType::Q6_K);
  EXPECT_EQ(plan[97], GgmlType::Q5_0);
  EXPECT_EQ(plan[98], GgmlType::F16);
}

// The fixtures' *-Q2_K.gguf and *-IQ4_XS.gguf were made by llama-quantize too (Q2_K without an importance
// matrix; IQ4_XS with one, which changes no rule at 2 layers: only ffn_down of the first n/8 = 0 layers).
TEST(QuantMix, Q2_KAndIQ4_XSMatchLlamaQuantizeOnFixtures) {
  for (auto [m, s] : {std::pair{"tiny-qwen3moe-A-Q2_K.gguf", QuantScheme::Q2_K},
                      std::pair{"tiny-qwen3moe-A-IQ4_XS.gguf", QuantScheme::IQ4_XS}}) {
    const auto f = gguf::File::open(kModels + m);
    EXPECT_EQ(f.get<uint32_t>("general.file_type"), quant_scheme_file_type(s)) << m;
    const auto plan = plan_for(f, s);
    ASSERT_EQ(plan.size(), f.tensors().size());
    for (size_t i = 0; i < plan.size(); ++i)
      EXPECT_EQ(type_name(plan[i]), type_name(f.tensors()[i].type)) << m << " " << f.tensors()[i].name;
  }
}

// llama.cpp's rules (llama_tensor_get_type) on the Qwen3-30B-A3B shape: 48 layers, 128 experts, 32 query
// heads on 4 KV heads. The expected types are written out from those rules, tensor by tensor.
TEST(QuantMix, LlamaRulesOnA30BA3BShape) {
  std::vector<TensorPlanInput> in = {{"token_embd.weight", 2, 2048, GgmlType::BF16}};
  for (int i = 0; i < 48; ++i)
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
      in.push_back({"blk." + std::to_string(i) + "." + n + ".weight", 3, 2048, GgmlType::BF16});
  in.push_back({"output.weight", 2, 2048, GgmlType::BF16});
  struct Want { GgmlType q, k, v, o, gate_up, down; };
  auto check = [&](QuantScheme s, int gqa, auto want_of_layer) {
    const auto plan = plan_quantization(in, s, {48, 128, gqa});
    EXPECT_EQ(plan.front(), quant_scheme_base_type(s)) << quant_scheme_name(s);
    EXPECT_EQ(plan.back(), GgmlType::Q6_K) << quant_scheme_name(s);
    for (int i = 0; i < 48; ++i) {
      const Want w = want_of_layer(i);
      const GgmlType* p = plan.data() + 1 + 7 * i;
      const std::string at = std::string(quant_scheme_name(s)) + " gqa " + std::to_string(gqa) + " layer " + std::to_string(i);
      EXPECT_EQ(p[0], w.q) << at;
      EXPECT_EQ(p[1], w.k) << at;
      EXPECT_EQ(p[2], w.v) << at;
      EXPECT_EQ(p[3], w.o) << at;
      EXPECT_EQ(p[4], w.gate_up) << at;
      EXPECT_EQ(p[5], w.gate_up) << at;
      EXPECT_EQ(p[6], w.down) << at;
    }
  };
  using T = GgmlType;
  const auto more = [](int i) { return i < 6 || i >= 42 || (i - 6) % 3 == 2; };  // use_more_bits(i, 48)
  check(QuantScheme::Q2_K, 8, [](int) { return Want{T::Q2_K, T::Q2_K, T::Q4_K, T::Q3_K, T::Q2_K, T::Q3_K}; });
  check(QuantScheme::Q2_K, 2, [](int) { return Want{T::Q2_K, T::Q2_K, T::Q3_K, T::Q3_K, T::Q2_K, T::Q3_K}; });
  check(QuantScheme::Q3_K_S, 8, [](int) { return Want{T::Q3_K, T::Q3_K, T::Q3_K, T::Q3_K, T::Q3_K, T::Q3_K}; });
  check(QuantScheme::Q3_K_M, 8, [](int i) {
    return Want{T::Q3_K, T::Q3_K, i < 2 ? T::Q5_K : T::Q4_K, T::Q4_K, T::Q3_K, i < 3 ? T::Q5_K : T::Q4_K};
  });
  check(QuantScheme::Q3_K_L, 8, [](int) { return Want{T::Q3_K, T::Q3_K, T::Q5_K, T::Q5_K, T::Q3_K, T::Q5_K}; });
  check(QuantScheme::Q4_K_S, 8, [](int i) {
    return Want{T::Q4_K, T::Q4_K, i < 4 ? T::Q5_K : T::Q4_K, T::Q4_K, T::Q4_K, i < 6 ? T::Q5_K : T::Q4_K};
  });
  check(QuantScheme::Q5_K_M, 8, [&](int i) {
    const T m = more(i) ? T::Q6_K : T::Q5_K;
    return Want{T::Q5_K, T::Q5_K, m, T::Q5_K, T::Q5_K, m};
  });
  check(QuantScheme::IQ4_XS, 8, [](int i) {
    return Want{T::IQ4_XS, T::IQ4_XS, T::Q5_K, T::IQ4_XS, T::IQ4_XS, i < 6 ? T::Q5_K : T::IQ4_XS};
  });
  check(QuantScheme::IQ4_NL, 2, [](int i) {
    return Want{T::IQ4_NL, T::IQ4_NL, T::IQ4_NL, T::IQ4_NL, T::IQ4_NL, i < 6 ? T::Q5_K : T::IQ4_NL};
  });
  check(QuantScheme::Q5_0, 8, [](int) { return Want{T::Q5_0, T::Q5_0, T::Q5_0, T::Q5_0, T::Q5_0, T::Q5_0}; });
}

// Rows that are not whole blocks fall back as in llama.cpp (tensor_type_fallback); --pure puts the base type
// everywhere, output included; every scheme's name and file type.
TEST(QuantMix, FallbacksPureAndNames) {
  using T = GgmlType;
  const std::pair<QuantScheme, T> fallback96[] = {{QuantScheme::Q2_K, T::Q4_0},   {QuantScheme::Q3_K_S, T::Q4_0},
                                                  {QuantScheme::Q4_K, T::Q5_0},   {QuantScheme::Q5_K, T::Q5_1},
                                                  {QuantScheme::Q6_K, T::Q8_0},   {QuantScheme::IQ4_XS, T::IQ4_NL},
                                                  {QuantScheme::Q4_1, T::Q4_1},   {QuantScheme::IQ4_NL, T::IQ4_NL}};
  const std::vector<TensorPlanInput> in = {{"blk.0.attn_q.weight", 2, 96, T::F32},
                                           {"blk.0.attn_k.weight", 2, 100, T::F32},
                                           {"output.weight", 2, 96, T::F32}};
  for (auto [s, want] : fallback96) {
    const auto plan = plan_quantization(in, s, {1, 0}, /*pure=*/true);
    EXPECT_EQ(plan[0], want) << quant_scheme_name(s);
    EXPECT_EQ(plan[1], T::F16) << quant_scheme_name(s);
    EXPECT_EQ(plan[2], want) << quant_scheme_name(s);
  }
  // Not pure: an output whose rows are not whole blocks of the base type is Q8_0.
  EXPECT_EQ(plan_quantization(in, QuantScheme::Q2_K, {1, 0})[2], T::Q8_0);
  // Pure Q2_K on the fixture model: every quantizable tensor Q2_K, the others as they are.
  const auto f = gguf::File::open(kModels + "tiny-qwen3moe-A-Q8_0.gguf");
  std::vector<TensorPlanInput> fin;
  for (const auto& t : f.tensors()) fin.push_back({t.name, t.n_dims, t.ne[0], t.type});
  const auto plan = plan_quantization(fin, QuantScheme::Q2_K, {2, 8, 2}, /*pure=*/true);
  for (size_t i = 0; i < fin.size(); ++i)
    EXPECT_EQ(plan[i], tensor_is_quantizable(fin[i]) ? T::Q2_K : fin[i].type) << fin[i].name;
  const std::tuple<const char*, QuantScheme, uint32_t> names[] = {
      {"q4_1", QuantScheme::Q4_1, 3},     {"Q5_0", QuantScheme::Q5_0, 8},     {"q5_1", QuantScheme::Q5_1, 9},
      {"Q2_K", QuantScheme::Q2_K, 10},    {"q3_k_s", QuantScheme::Q3_K_S, 11}, {"Q3_K_M", QuantScheme::Q3_K_M, 12},
      {"Q3_K_L", QuantScheme::Q3_K_L, 13}, {"Q4_K_S", QuantScheme::Q4_K_S, 14}, {"Q5_K_S", QuantScheme::Q5_K_S, 16},
      {"q5_k_m", QuantScheme::Q5_K_M, 17}, {"IQ4_NL", QuantScheme::IQ4_NL, 25}, {"iq4_xs", QuantScheme::IQ4_XS, 30}};
  for (auto [name, s, ft] : names) {
    EXPECT_EQ(quant_scheme_from_name(name), s) << name;
    EXPECT_EQ(quant_scheme_file_type(s), ft) << name;
  }
  EXPECT_FALSE(quant_scheme_from_name("Q3_K").has_value());  // llama.cpp has no plain Q3_K file type
  EXPECT_NE(quant_scheme_names().find("IQ4_XS"), std::string::npos);
}

// Quantize the Q8_0 fixture model to each scheme: metadata kept (file_type set), types as planned,
// data aligned, values close to the source (relative RMSE per tensor within the type's bound).
TEST(QuantCli, QuantizeKeepsMetadataAndIsAccurate) {
  TempDir dir;
  const std::string src_path = kModels + "tiny-qwen3moe-A-Q8_0.gguf";
  const auto src = gguf::File::open(src_path);
  const std::pair<const char*, uint32_t> schemes[] = {
      {"Q8_0", 7},    {"Q6_K", 18},   {"Q4_K", 14},   {"Q4_K_M", 15}, {"Q4_0", 2},    {"Q4_1", 3},   {"Q5_0", 8},
      {"Q5_1", 9},    {"Q2_K", 10},   {"Q3_K_M", 12}, {"Q5_K_M", 17}, {"IQ4_NL", 25}, {"IQ4_XS", 30}};
  for (auto [scheme, ftype] : schemes) {
    const std::string out = dir / (std::string(scheme) + ".gguf");
    const auto r = run_cli("quantize " + src_path + " " + out + " " + scheme);
    ASSERT_EQ(r.rc, 0) << r.out;
    const auto q = gguf::File::open(out);
    EXPECT_EQ(q.get<uint32_t>("general.file_type"), ftype);
    EXPECT_EQ(q.get<uint32_t>("general.quantization_version"), 2u);
    for (const auto& kv : src.metadata()) {
      if (kv.key == "general.file_type") continue;
      const gguf::Value* v = q.find(kv.key);
      ASSERT_NE(v, nullptr) << kv.key;
      EXPECT_EQ(v->type, kv.value.type) << kv.key;
      if (v->type == gguf::ValueType::STRING) EXPECT_EQ(v->str, kv.value.str) << kv.key;
      if (v->type == gguf::ValueType::ARRAY) EXPECT_EQ(v->arr.size(), kv.value.arr.size()) << kv.key;
      if (v->type != gguf::ValueType::STRING && v->type != gguf::ValueType::ARRAY)
        EXPECT_EQ(v->num.u, kv.value.num.u) << kv.key;
    }
    const auto plan = plan_for(src, *quant_scheme_from_name(scheme));
    ASSERT_EQ(q.tensors().size(), src.tensors().size());
    for (size_t i = 0; i < plan.size(); ++i) {
      const auto& a = src.tensors()[i];
      const auto& b = q.tensors()[i];
      ASSERT_EQ(a.name, b.name);
      EXPECT_EQ(b.type, plan[i]) << b.name;
      EXPECT_EQ(b.offset % q.alignment(), 0u) << b.name;
      if (a.n_dims == 1) EXPECT_EQ(b.type, GgmlType::F32) << b.name;
      const auto va = dequantize_all(a), vb = dequantize_all(b);
      double e = 0, s = 0;
      for (size_t k = 0; k < va.size(); ++k) e += (double(va[k]) - vb[k]) * (va[k] - vb[k]), s += double(va[k]) * va[k];
      const double rel = s > 0 ? std::sqrt(e / s) : std::sqrt(e);
      // The Q8_0 source is re-quantized: Q8_0 -> Q8_0 is a copy; the others within the round-trip bounds.
      // (About 10% above the Gaussian round-trip errors of test_quant_quantize.cpp.)
      double bound = 0;
      switch (b.type) {
        case GgmlType::Q2_K: bound = 0.30; break;
        case GgmlType::Q3_K: bound = 0.165; break;
        case GgmlType::Q4_0: bound = 0.10; break;
        case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: bound = 0.085; break;
        case GgmlType::Q5_0: bound = 0.05; break;
        case GgmlType::Q5_1: case GgmlType::Q5_K: bound = 0.04; break;
        case GgmlType::Q6_K: bound = 0.02; break;
        case GgmlType::Q8_0: bound = 0.006; break;
        default: break;
      }
      EXPECT_LE(rel, bound) << scheme << " " << b.name << " " << type_name(b.type);
    }
  }
}

TEST(QuantCli, DequantWritesRawF32BitExact) {
  TempDir dir;
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  for (const char* name : {"zoo.q4_k", "zoo.iq2_xs", "zoo.bf16"}) {
    const std::string out = dir / "t.f32";
    const auto r = run_cli("dequant " + kFixtures + "/formats/zoo.gguf " + name + " -o " + out);
    ASSERT_EQ(r.rc, 0) << r.out;
    std::ifstream f(out, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto& want = ref.at(name).head;
    ASSERT_EQ(bytes.size(), want.size() * 4) << name;
    EXPECT_EQ(std::memcmp(bytes.data(), want.data(), bytes.size()), 0) << name;
  }
}

TEST(QuantCli, BadArgumentsAreClearErrors) {
  TempDir dir;
  const std::string zoo = kFixtures + "/formats/zoo.gguf";
  auto r = run_cli("dequant " + zoo + " no.such.tensor -o " + (dir / "x.f32"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("no tensor named 'no.such.tensor'"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "x.f32"));
  r = run_cli("quantize " + kModels + "tiny-qwen3moe-A-Q8_0.gguf " + (dir / "y.gguf") + " Q3_K");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("unknown quantization type 'Q3_K'"), std::string::npos) << r.out;
  r = run_cli("quantize " + (dir / "missing.gguf") + " " + (dir / "y.gguf") + " Q8_0");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_FALSE(fs::exists(dir / "y.gguf"));
}
