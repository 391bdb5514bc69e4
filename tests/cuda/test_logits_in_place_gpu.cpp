// Logits left in the workspace's pinned download buffer (Model::logits_in_place, Engine::decode_logits /
// prefill_logits): the CUDA models offer that buffer, a forward whose logits point at it skips the copy to
// the caller's memory, and the logits are the same bits as those copied. A synthetic Q4_0 qwen3moe of 2
// layers and 16 experts, fast mode, at 100% resident (graph replays) and 50% (CPU-pool passes): a 40-token
// prefill with every row, then greedy decode steps of one sequence and of two in one batch, with the engine's
// switch on and off. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "decode_test_util.h"

using namespace strata;

namespace {

// Every logit row of the run, in order: the prefill's 40 rows, `one` steps of sequence a, `two` steps of a
// and b in one batch (b prefilled with the prompt's first 10 tokens).
std::vector<float> run(std::shared_ptr<const Model> model, bool in_place, const std::vector<int32_t>& prompt,
                       int one, int two) {
  EngineOptions opt = test::small_engine_options(MatmulMode::Fast, cpu::AttnMath::F32);
  opt.n_batch = 64;
  opt.logits_in_place = in_place;
  Engine eng(model, opt);
  EXPECT_EQ(eng.options().logits_in_place, in_place);
  const size_t V = size_t(model->n_vocab());
  auto sa = eng.new_sequence(), sb = eng.new_sequence();
  std::span<const float> lg = eng.prefill_logits(*sb, std::span(prompt).first(10));
  std::vector<float> all;
  lg = eng.prefill_logits(*sa, prompt, /*all_logits=*/true);
  all.insert(all.end(), lg.begin(), lg.end());
  int32_t ta = test::argmax(lg.data() + (prompt.size() - 1) * V, V), tb = prompt[10];
  for (int i = 0; i < one; ++i) {
    SequenceState* s = sa.get();
    lg = eng.decode_logits({&s, 1}, {&ta, 1});
    all.insert(all.end(), lg.begin(), lg.end());
    ta = test::argmax(lg.data(), V);
  }
  for (int i = 0; i < two; ++i) {
    SequenceState* seqs[2] = {sa.get(), sb.get()};
    const int32_t toks[2] = {ta, tb};
    lg = eng.decode_logits({seqs, 2}, {toks, 2});
    all.insert(all.end(), lg.begin(), lg.end());
    ta = test::argmax(lg.data(), V);
    tb = test::argmax(lg.data() + V, V);
  }
  return all;
}

}  // namespace

TEST(LogitsInPlaceGpu, SameBitsAsCopied) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string path = test::write_small_synthetic("Q4_0", 17, "logits-in-place");
  const std::vector<int32_t> prompt = test::random_prompt(40, test::kSmallSyntheticVocab, 3);
  for (const char* cache : {"100%", "50%"}) {
    SCOPED_TRACE(std::string("expert cache ") + cache);
    cuda::CudaOptions o = test::small_cuda_options(cache, /*exact=*/false);
    o.n_batch = 64;
    std::shared_ptr<const Model> model = cuda::load_model_cuda(path, o);
    const std::vector<float> copied = run(model, false, prompt, 4, 3), kept = run(model, true, prompt, 4, 3);
    ASSERT_EQ(copied.size(), (40 + 4 + 2 * 3) * size_t(test::kSmallSyntheticVocab));
    EXPECT_EQ(test::bit_differences(copied, kept), 0u);

    // The model's side: its buffer has room for the workspace's rows and no more; a forward into it leaves
    // there what a forward into other memory gets.
    auto ws = model->new_workspace(64, 64, 2);
    ASSERT_NE(model->logits_in_place(*ws, 64), nullptr);
    EXPECT_EQ(model->logits_in_place(*ws, 65), nullptr);
    float* at = model->logits_in_place(*ws, 1);
    ThreadPool pool(2);
    std::vector<float> mine(size_t(test::kSmallSyntheticVocab));
    for (float* dst : {mine.data(), at}) {
      auto seq = model->new_sequence(64, KvType::F32);
      const BatchToken bt{prompt[0], 0, 0, true};
      SequenceState* s = seq.get();
      model->forward({{&bt, 1}, {&s, 1}}, *ws, dst, pool, {MatmulMode::Fast, cpu::AttnMath::F32});
    }
    EXPECT_EQ(std::memcmp(mine.data(), at, mine.size() * 4), 0);
    // A pointer inside the buffer but not at its start is refused, not copied over itself.
    auto seq = model->new_sequence(64, KvType::F32);
    const BatchToken bt{prompt[0], 0, 0, true};
    SequenceState* s = seq.get();
    EXPECT_THROW(model->forward({{&bt, 1}, {&s, 1}}, *ws, at + 1, pool, {MatmulMode::Fast, cpu::AttnMath::F32}),
                 Error);
  }
  std::remove(path.c_str());
}
