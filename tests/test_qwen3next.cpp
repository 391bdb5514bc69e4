// qwen3next end to end against llama.cpp's references (fixtures/models/tiny-qwen3next-N-*), the
// equivalence of prefill split in any way, several sequences in one decode batch, MTP blocks, and bad
// files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"
#include "gguf/writer.h"
#include "model/model.h"
#include "model/qwen3next.h"
#include "model/synthetic.h"
#include "quant/dequant.h"
#include "slg.h"

namespace strata {
namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

using test::argmax;
using test::kl_div;
using test::read_slg;
using test::Slg;

struct Eval {
  std::vector<float> logits;  // [n_prompt][n_vocab]
  std::vector<int32_t> gen;
};

Eval run(std::shared_ptr<const Model> m, const std::vector<int32_t>& prompt, int n_gen,
         MatmulMode mode, int n_batch) {
  EngineOptions o;
  o.n_ctx = int32_t(prompt.size()) + n_gen + 8;
  o.n_batch = n_batch;
  o.n_threads = 2;
  o.mode = mode;
  Engine e(std::move(m), o);
  auto seq = e.new_sequence();
  const size_t V = size_t(e.n_vocab());
  Eval r;
  r.logits.resize(prompt.size() * V);
  e.prefill(*seq, prompt, r.logits.data(), true);
  std::vector<float> last(r.logits.end() - std::ptrdiff_t(V), r.logits.end());
  SequenceState* seqs[1] = {seq.get()};
  for (int i = 0; i < n_gen; ++i) {
    const int32_t tok = int32_t(argmax(last.data(), V));
    r.gen.push_back(tok);
    if (i + 1 < n_gen) e.decode(seqs, std::span<const int32_t>(&tok, 1), last.data());
  }
  return r;
}

struct Score {
  double mean_kl = 0, max_kl = 0, top1 = 0;
};
Score score(const Slg& ref, const std::vector<float>& ours) {
  Score s;
  const size_t V = ref.n_vocab;
  int same = 0;
  for (size_t p = 0; p < ref.n_prompt; ++p) {
    const double kl = kl_div(&ref.logits[p * V], &ours[p * V], V);
    s.mean_kl += kl / ref.n_prompt;
    s.max_kl = std::max(s.max_kl, kl);
    same += argmax(&ref.logits[p * V], V) == argmax(&ours[p * V], V);
  }
  s.top1 = double(same) / ref.n_prompt;
  return s;
}

class Qwen3NextFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen3NextFixture, ExactModeMatchesReference) {
  const std::string base = kModels + "tiny-qwen3next-N-" + GetParam();
  const Slg ref = read_slg(base + ".f32ref.slg");
  std::shared_ptr<const Model> m = load_model(base + ".gguf");
  ASSERT_EQ(m->n_vocab(), int32_t(ref.n_vocab));
  const Eval ev = run(m, ref.prompt, int(ref.n_gen), MatmulMode::Exact, 64);
  const Score s = score(ref, ev.logits);
  std::printf("[ qwen3next %s exact ] mean KL %.3e  max KL %.3e  top-1 %.3f\n", GetParam().c_str(),
              s.mean_kl, s.max_kl, s.top1);
  EXPECT_LE(s.mean_kl, 1e-5);
  EXPECT_EQ(s.top1, 1.0);
  EXPECT_EQ(ev.gen, ref.gen);
}

TEST_P(Qwen3NextFixture, FastModeWithinLlamaCppKl) {
  const std::string base = kModels + "tiny-qwen3next-N-" + GetParam();
  const Slg ref = read_slg(base + ".f32ref.slg");
  // llama.cpp's own quantized kernels vs exact math (fixtures/README.md)
  const double llama_kl = GetParam() == "Q4_K_M" ? 7.44e-2 : 1.80e-1;
  const Eval ev = run(load_model(base + ".gguf"), ref.prompt, 0, MatmulMode::Fast, 64);
  const Score s = score(ref, ev.logits);
  std::printf("[ qwen3next %s fast ] mean KL %.3e (llama.cpp %.3e)  top-1 %.3f\n",
              GetParam().c_str(), s.mean_kl, llama_kl, s.top1);
  EXPECT_LE(s.mean_kl, 1.5 * llama_kl);
}

INSTANTIATE_TEST_SUITE_P(Formats, Qwen3NextFixture, ::testing::Values("Q4_K_M", "IQ2_XS"));

// One batch, chunks of 7 and token by token give the same exact-mode logits at every position, with
// prompts run by either form of the delta rule (token by token is always the recurrent form).
TEST(Qwen3Next, PrefillSplitsAgree) {
  const std::string base = kModels + "tiny-qwen3next-N-Q4_K_M";
  const Slg ref = read_slg(base + ".f32ref.slg");
  std::shared_ptr<const Model> m = load_model(base + ".gguf");
  const size_t V = ref.n_vocab;
  const GdnPrefill saved = qwen3next_gdn_prefill();
  set_qwen3next_gdn_prefill(GdnPrefill::Recurrent);
  const Eval base_run = run(m, ref.prompt, 0, MatmulMode::Exact, 1);  // token by token
  for (GdnPrefill form : {GdnPrefill::Chunked, GdnPrefill::Recurrent}) {
    set_qwen3next_gdn_prefill(form);
    for (int nb : {48, 7}) {
      const Eval split = run(m, ref.prompt, 0, MatmulMode::Exact, nb);
      double max_diff = 0;
      for (size_t p = 0; p < ref.n_prompt; ++p) {
        for (size_t i = 0; i < V; ++i)
          max_diff = std::max(max_diff, double(std::fabs(split.logits[p * V + i] -
                                                         base_run.logits[p * V + i])));
        ASSERT_EQ(argmax(&split.logits[p * V], V), argmax(&base_run.logits[p * V], V))
            << "position " << p;
      }
      std::printf("[ qwen3next %s prefill, batch %d vs token by token ] max |logit diff| %.3e\n",
                  form == GdnPrefill::Chunked ? "chunked" : "recurrent", nb, max_diff);
      EXPECT_LE(max_diff, 1e-3) << "batch " << nb;
    }
  }
  set_qwen3next_gdn_prefill(saved);
}

// Two sequences decoded in one batch give what each gives alone: the recurrent state is per sequence.
TEST(Qwen3Next, SequencesInOneDecodeBatchAreIndependent) {
  const std::string base = kModels + "tiny-qwen3next-N-Q4_K_M";
  const Slg ref = read_slg(base + ".f32ref.slg");
  std::shared_ptr<const Model> m = load_model(base + ".gguf");
  EngineOptions o;
  o.n_ctx = 64;
  o.n_batch = 16;
  o.n_threads = 2;
  o.mode = MatmulMode::Exact;
  Engine e(m, o);
  const size_t V = size_t(e.n_vocab());
  std::vector<int32_t> pa(ref.prompt.begin(), ref.prompt.begin() + 20);
  std::vector<int32_t> pb(ref.prompt.begin() + 20, ref.prompt.begin() + 31);
  auto a = e.new_sequence(), b = e.new_sequence(), a1 = e.new_sequence(), b1 = e.new_sequence();
  std::vector<float> la(V), lb(V), both(2 * V);
  e.prefill(*a, pa, la.data());
  e.prefill(*b, pb, lb.data());
  e.prefill(*a1, pa, nullptr);
  e.prefill(*b1, pb, nullptr);
  for (int step = 0; step < 4; ++step) {
    const int32_t ta = int32_t(argmax(la.data(), V)), tb = int32_t(argmax(lb.data(), V));
    SequenceState* sa[1] = {a1.get()};
    SequenceState* sb[1] = {b1.get()};
    e.decode(sa, std::span<const int32_t>(&ta, 1), la.data());
    e.decode(sb, std::span<const int32_t>(&tb, 1), lb.data());
    SequenceState* ab[2] = {a.get(), b.get()};
    const int32_t tt[2] = {ta, tb};
    e.decode(ab, tt, both.data());
    for (size_t i = 0; i < V; ++i) {
      ASSERT_NEAR(both[i], la[i], 1e-4) << "step " << step;
      ASSERT_NEAR(both[V + i], lb[i], 1e-4) << "step " << step;
    }
  }
  // memory: the state object owns the attention KV and the GDN states, sized up front
  EXPECT_GT(a->memory_bytes(), 0u);
  EXPECT_THROW(a->truncate(3), Error);  // a recurrent state cannot be rewound
}

TEST(Qwen3Next, BatchMustContinueTheSequence) {
  std::shared_ptr<const Model> m = load_model(kModels + "tiny-qwen3next-N-Q4_K_M.gguf");
  auto seq = m->new_sequence(32, KvType::F32);
  auto ws = m->new_workspace(8, 32, 1);
  ThreadPool pool(1);
  std::vector<float> logits(size_t(m->n_vocab()));
  SequenceState* seqs[1] = {seq.get()};
  const BatchToken skip[1] = {{5, 3, 0, true}};  // position 3 of an empty sequence
  try {
    ForwardOptions fo;
    fo.mode = MatmulMode::Exact;
    m->forward({skip, seqs}, *ws, logits.data(), pool, fo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent state holds 0 tokens"), std::string::npos)
        << e.what();
  }
}

// ---- files built from the fixture with the GGUF writer ----

struct Edit {
  std::vector<std::string> drop;                          // tensors left out
  std::vector<std::pair<std::string, gguf::Value>> meta;  // keys set
  bool add_mtp = false;                                   // append one MTP block (blk.4)
};

std::string write_edited(const std::string& name, const Edit& ed) {
  const gguf::File src = gguf::File::open(kModels + "tiny-qwen3next-N-Q4_K_M.gguf");
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") w.set_value(kv.key, kv.value);
  for (const auto& [k, v] : ed.meta) w.set_value(k, v);
  for (const auto& t : src.tensors()) {
    if (std::find(ed.drop.begin(), ed.drop.end(), t.name) != ed.drop.end()) continue;
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    w.add_tensor_view(t.name, t.type, dims, t.data, t.nbytes);
  }
  std::vector<std::vector<float>> keep;
  if (ed.add_mtp) {
    // an MTP block after the decoder: its projections plus a copy of layer 3's attention block
    const uint64_t E = 256;
    auto add_f32 = [&](const std::string& n, std::vector<uint64_t> dims, float val) {
      if (std::find(ed.drop.begin(), ed.drop.end(), n) != ed.drop.end()) return;
      uint64_t cnt = 1;
      for (auto d : dims) cnt *= d;
      keep.emplace_back(cnt, val);
      w.add_tensor_view(n, GgmlType::F32, dims, reinterpret_cast<const uint8_t*>(keep.back().data()),
                        cnt * 4);
    };
    keep.reserve(8);
    add_f32("blk.4.nextn.eh_proj.weight", {2 * E, E}, 0.01f);
    add_f32("blk.4.nextn.enorm.weight", {E}, 1.0f);
    add_f32("blk.4.nextn.hnorm.weight", {E}, 1.0f);
    add_f32("blk.4.nextn.shared_head_norm.weight", {E}, 1.0f);
    for (const auto& t : src.tensors()) {
      if (t.name.rfind("blk.3.", 0) != 0) continue;
      std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
      w.add_tensor_view("blk.4." + t.name.substr(6), t.type, dims, t.data, t.nbytes);
    }
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("strata_q3n_" + name + ".gguf")).string();
  w.write(path);
  return path;
}

void expect_load_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    load_model(path);
    ADD_FAILURE() << path << ": loaded without error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
  std::filesystem::remove(path);
}

TEST(Qwen3NextBadFiles, GdnLayerMissingSsmA) {
  expect_load_error(write_edited("no_ssm_a", {{"blk.1.ssm_a"}, {}}),
                    {"blk.1.ssm_a", "layer 1 is a Gated DeltaNet layer"});
}

TEST(Qwen3NextBadFiles, AttentionLayerMissingQuery) {
  expect_load_error(write_edited("no_attn_q", {{"blk.3.attn_q.weight"}, {}}),
                    {"blk.3.attn_q.weight", "layer 3 is a full-attention layer"});
}

TEST(Qwen3NextBadFiles, InconsistentHeadCounts) {
  expect_load_error(
      write_edited("heads", {{}, {{"qwen3next.ssm.time_step_rank", gguf::make_value<uint32_t>(3)}}}),
      {"inconsistent head counts", "time_step_rank", "group_count"});
  expect_load_error(
      write_edited("inner", {{}, {{"qwen3next.ssm.inner_size", gguf::make_value<uint32_t>(384)}}}),
      {"inconsistent head counts", "inner_size"});
}

TEST(Qwen3NextBadFiles, LayerPatternMismatchIsAShapeError) {
  // every layer attends: layer 0 has no attn_q, so the error names what the pattern expected
  expect_load_error(write_edited("interval", {{}, {{"qwen3next.full_attention_interval",
                                                    gguf::make_value<uint32_t>(1)}}}),
                    {"attn_q.weight", "full-attention layer"});
  expect_load_error(write_edited("interval0", {{}, {{"qwen3next.full_attention_interval",
                                                     gguf::make_value<uint32_t>(0)}}}),
                    {"full_attention_interval"});
}

TEST(Qwen3NextFiles, RecurrentLayersArrayEqualsInterval) {
  const std::string base = kModels + "tiny-qwen3next-N-Q4_K_M";
  const Slg ref = read_slg(base + ".f32ref.slg");
  const std::vector<int32_t> prompt(ref.prompt.begin(), ref.prompt.begin() + 12);
  const std::string path = write_edited(
      "rec_layers", {{}, {{"qwen3next.attention.recurrent_layers",
                           gguf::make_array<bool>({true, true, true, false})}}});
  const Eval a = run(load_model(path), prompt, 0, MatmulMode::Exact, 16);
  const Eval b = run(load_model(base + ".gguf"), prompt, 0, MatmulMode::Exact, 16);
  EXPECT_EQ(a.logits, b.logits);
  std::filesystem::remove(path);
}

TEST(Qwen3NextFiles, MtpBlockLoadsAndLeavesTheDecoderAlone) {
  const std::string base = kModels + "tiny-qwen3next-N-Q4_K_M";
  const Slg ref = read_slg(base + ".f32ref.slg");
  const std::vector<int32_t> prompt(ref.prompt.begin(), ref.prompt.begin() + 12);
  Edit ed;
  ed.add_mtp = true;
  ed.meta = {{"qwen3next.block_count", gguf::make_value<uint32_t>(5)},
             {"qwen3next.nextn_predict_layers", gguf::make_value<uint32_t>(1)}};
  const std::string path = write_edited("mtp", ed);
  std::shared_ptr<const Model> with_mtp = load_model(path);
  EXPECT_EQ(with_mtp->hparams().n_layer, 5);
  EXPECT_EQ(with_mtp->routed_layers(), 4);  // the shape of its expert-usage profile: the MTP block does not run
  const Eval a = run(with_mtp, prompt, 0, MatmulMode::Exact, 16);
  const Eval b = run(load_model(base + ".gguf"), prompt, 0, MatmulMode::Exact, 16);
  EXPECT_EQ(a.logits, b.logits);
  std::filesystem::remove(path);
  // an MTP block without its projection is an error
  ed.drop = {"blk.4.nextn.eh_proj.weight"};
  expect_load_error(write_edited("mtp_bad", ed), {"blk.4.nextn.eh_proj.weight"});
}

// The synthetic generator writes qwen3next files our loader (and llama.cpp's names) accept: a small
// version of the Qwen3-Next-80B-A3B geometry in Q4_K_M runs, stays finite over a long-ish prompt (the
// GDN decay is negative) and has the parameter count the spec says.
TEST(Qwen3NextFiles, SyntheticQwen3NextGeometry) {
  SyntheticSpec spec;
  spec.apply_preset("qwen3-next-80b-a3b");
  spec.n_layer = 4;
  spec.n_embd = 512;
  spec.n_expert = 12;
  spec.n_vocab = 1000;
  spec.format = "Q4_K_M";
  const std::string path =
      (std::filesystem::temp_directory_path() / "strata_q3n_synthetic.gguf").string();
  ThreadPool pool(2);
  write_synthetic_model(spec, path, pool);
  {
    const gguf::File f = gguf::File::open(path);
    uint64_t n = 0;
    for (const auto& t : f.tensors()) n += t.n_elements();
    EXPECT_EQ(n, spec.weight_count());
    EXPECT_TRUE(f.find_tensor("blk.0.ssm_a") && f.find_tensor("blk.3.attn_q.weight"));
    std::shared_ptr<const Model> m = load_model(path);
    std::vector<int32_t> prompt(96);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37) % 1000);
    const Eval ev = run(m, prompt, 4, MatmulMode::Fast, 64);
    for (float x : ev.logits) ASSERT_TRUE(std::isfinite(x));
  }
  std::filesystem::remove(path);
}

// Older GGUFs carry one fused `ssm_in` (q, k, v, z grouped per key head) instead of attn_qkv + attn_gate.
// The same weights re-packed that way (as f32) give the same exact-mode logits.
TEST(Qwen3NextFiles, LegacySsmInEqualsAttnQkv) {
  const std::string base = kModels + "tiny-qwen3next-N-Q4_K_M";
  const gguf::File src = gguf::File::open(base + ".gguf");
  const int64_t E = 256, D = 64, Hk = 2, Hv = 4, r = Hv / Hk, Kd = Hk * D, Vd = Hv * D;
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") w.set_value(kv.key, kv.value);
  auto dequant_rows = [&](const gguf::TensorInfo& t) {
    std::vector<float> out(t.n_elements());
    const uint64_t rb = t.nbytes / t.n_rows();
    for (uint64_t i = 0; i < t.n_rows(); ++i)
      dequantize_row(t.type, t.data + i * rb, out.data() + i * t.ne[0], int64_t(t.ne[0]));
    return out;
  };
  std::vector<std::vector<float>> keep;
  keep.reserve(3);
  for (const auto& t : src.tensors()) {
    const bool qkv = t.name.find(".attn_qkv.") != std::string::npos;
    if (t.name.find(".attn_gate.") != std::string::npos) continue;
    if (!qkv) {
      w.add_tensor_view(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
      continue;
    }
    const std::string p = t.name.substr(0, t.name.find("attn_qkv"));
    const std::vector<float> a = dequant_rows(t), z = dequant_rows(src.tensor(p + "attn_gate.weight"));
    std::vector<float>& m = keep.emplace_back();
    auto rows = [&](const std::vector<float>& from, int64_t r0, int64_t n) {
      m.insert(m.end(), from.begin() + r0 * E, from.begin() + (r0 + n) * E);
    };
    for (int64_t j = 0; j < Hk; ++j) {
      rows(a, j * D, D);                   // q_j
      rows(a, Kd + j * D, D);              // k_j
      rows(a, 2 * Kd + j * r * D, r * D);  // v of heads j*r..
      rows(z, j * r * D, r * D);           // z of heads j*r..
    }
    w.add_tensor_view(p + "ssm_in.weight", GgmlType::F32, {uint64_t(E), uint64_t(2 * Kd + 2 * Vd)},
                      reinterpret_cast<const uint8_t*>(m.data()), m.size() * 4);
  }
  const std::string path = (std::filesystem::temp_directory_path() / "strata_q3n_legacy.gguf").string();
  w.write(path);
  const Slg ref = read_slg(base + ".f32ref.slg");
  const std::vector<int32_t> prompt(ref.prompt.begin(), ref.prompt.begin() + 12);
  const Eval a = run(load_model(path), prompt, 0, MatmulMode::Exact, 16);
  const Eval b = run(load_model(base + ".gguf"), prompt, 0, MatmulMode::Exact, 16);
  double max_diff = 0;
  for (size_t i = 0; i < a.logits.size(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(a.logits[i] - b.logits[i])));
  EXPECT_LE(max_diff, 1e-4);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace strata
