// The decode roofline's parts: weight bytes a token reads (model/decode_traffic.h), the roofline of two
// memories read at once, the host read-bandwidth probe (cpu/mem_bandwidth.h) and `strata bench`'s lines.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/mem_bandwidth.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/decode_traffic.h"
#include "model/model.h"

namespace strata {
namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

// A file with known tensor sizes (F32: 4 bytes a value): token_embd 10 rows of 4, a 4x4 attention
// matrix in layers 0 and 1, 8 experts of [4][2] gate values in layer 0 and 1, and optionally an output.
gguf::File small_file(bool with_output) {
  gguf::Writer w;
  auto zeros = [](size_t n) { return std::vector<uint8_t>(n * 4, 0); };
  w.add_tensor("token_embd.weight", GgmlType::F32, {4, 10}, zeros(40));  // 160 B, 16 B a row
  if (with_output) w.add_tensor("output.weight", GgmlType::F32, {4, 10}, zeros(40));
  w.add_tensor("output_norm.weight", GgmlType::F32, {4}, zeros(4));  // 16 B
  for (int il = 0; il < 2; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    w.add_tensor(p + "attn_q.weight", GgmlType::F32, {4, 4}, zeros(16));               // 64 B
    w.add_tensor(p + "ffn_gate_inp.weight", GgmlType::F32, {4, 8}, zeros(32));         // 128 B, the router
    w.add_tensor(p + "ffn_gate_exps.weight", GgmlType::F32, {4, 2, 8}, zeros(64));     // 256 B, 32 B an expert
  }
  return gguf::File::from_bytes(w.to_bytes(), "small");
}

HParams small_hparams() {
  HParams hp;
  hp.n_expert = 8;
  hp.n_expert_used = 2;
  hp.n_layer = 2;
  return hp;
}

TEST(DecodeTraffic, CountsEachTensorByHowADecodedTokenReadsIt) {
  const gguf::File f = small_file(true);
  const DecodeTraffic t = decode_traffic(f, small_hparams(), 2);
  EXPECT_EQ(t.embedding, 16u);                            // one row of token_embd
  EXPECT_EQ(t.dense, 160u + 16u + 2 * (64u + 128u));      // output, its norm, attention and routers
  EXPECT_EQ(t.routed, 2 * (256u / 8 * 2));                // 2 of 8 experts in each layer
  EXPECT_EQ(t.skipped, 0u);
  EXPECT_EQ(t.total(), t.dense + t.routed + t.embedding);
  // Layer 1 not run (as qwen3next's MTP block): its tensors are skipped.
  const DecodeTraffic one = decode_traffic(f, small_hparams(), 1);
  EXPECT_EQ(one.skipped, 64u + 128u + 256u);
  EXPECT_EQ(one.routed, 256u / 8 * 2);
  // Tied output: the whole token_embd is read by the output product.
  const DecodeTraffic tied = decode_traffic(small_file(false), small_hparams(), 2);
  EXPECT_EQ(tied.dense, 160u + 16u + 2 * (64u + 128u));
  EXPECT_EQ(tied.embedding, 16u);
}

TEST(DecodeTraffic, ExpertTensorsWithoutExpertCountsAreAnError) {
  HParams hp = small_hparams();
  hp.n_expert_used = 9;  // more than n_expert
  EXPECT_THROW(decode_traffic(small_file(true), hp, 2), Error);
  hp.n_expert = 0;
  EXPECT_THROW(decode_traffic(small_file(true), hp, 2), Error);
}

// The fixtures: every tensor is counted once (skipped + read whole + routed + embedding-only), and
// qwen3next's MTP block is skipped.
TEST(DecodeTraffic, FixtureModelsAddUp) {
  for (const char* name : {"tiny-qwen3moe-A-Q4_K_M.gguf", "tiny-qwen3next-N-Q4_K_M.gguf"}) {
    std::shared_ptr<const Model> m = load_model(kModels + name);
    const DecodeTraffic t = decode_traffic(m->file(), m->hparams(), m->routed_layers());
    uint64_t all = 0, exps = 0;
    for (const auto& ti : m->file().tensors()) {
      all += ti.nbytes;
      if (ti.name.find("_exps") != std::string::npos) exps += ti.nbytes;
    }
    const HParams& hp = m->hparams();
    const uint64_t embd = m->file().tensor("token_embd.weight").nbytes;
    const bool tied = m->file().find_tensor("output.weight") == nullptr;
    SCOPED_TRACE(name);
    EXPECT_GT(t.routed, 0u);
    EXPECT_LT(t.routed, exps);  // k of n experts
    // Each *_exps tensor's bytes are a multiple of n_expert (one block-aligned matrix per expert), so
    // the routed share scales back exactly.
    EXPECT_EQ(t.dense + t.skipped + (tied ? 0 : embd) + t.routed / uint64_t(hp.n_expert_used) * uint64_t(hp.n_expert),
              all)
        << "dense " << t.dense << " skipped " << t.skipped << " routed " << t.routed;
    if (m->routed_layers() < hp.n_layer) {
      EXPECT_GT(t.skipped, 0u);
    }
  }
}

TEST(DecodeRoofline, TwoMemoriesReadAtOnce) {
  EXPECT_DOUBLE_EQ(roofline_tok_s(1e9, 100), 100);                 // 1 GB at 100 GB/s
  EXPECT_DOUBLE_EQ(roofline_tok_s(1e9, 4000, 0.5e9, 50), 100);     // the host side is slower: 10 ms
  EXPECT_DOUBLE_EQ(roofline_tok_s(2e9, 100, 0.1e9, 50), 50);       // the GPU side: 20 ms
  EXPECT_DOUBLE_EQ(roofline_tok_s(1e9, 100, 0, 0), 100);           // nothing from the second memory
  EXPECT_EQ(roofline_tok_s(1e9, 0), 0);                            // not measured
  EXPECT_EQ(roofline_tok_s(1e9, 100, 1e6, 0), 0);
  EXPECT_EQ(roofline_tok_s(0, 100), 0);
}

TEST(HostBandwidth, MeasuresAPositiveRateAndRejectsBadSizes) {
  ThreadPool pool(2);
  const double gbs = cpu::measure_host_read_gbs(pool, size_t(32) << 20, 2);
  EXPECT_GT(gbs, 0.05);
  EXPECT_LT(gbs, 10000);  // 10 TB/s from 2 threads would be a broken timer or dropped loads
  EXPECT_THROW(cpu::measure_host_read_gbs(pool, 32, 1), Error);
  EXPECT_THROW(cpu::measure_host_read_gbs(pool, size_t(1) << 20, 0), Error);
}

}  // namespace
}  // namespace strata
