// Sampling: each filter against a direct count of what it should keep, reproducibility by seed,
// penalties, stop strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "common/error.h"
#include "engine/sampling.h"
#include "sampling_reference.h"

using namespace strata;

namespace {
SamplingParams plain() {  // every filter off, temperature 1
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}
std::map<int, int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(logits.data())];
  return h;
}
}  // namespace

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p = plain();
  p.temperature = 0;
  Sampler s(p, 5);
  std::vector<float> l = {0.1f, 3.f, -1.f, 3.f, 2.f};
  EXPECT_EQ(s.sample(l.data()), 1);
}

TEST(Sampling, TemperatureOneFollowsSoftmax) {
  std::vector<float> l = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};  // p = .1 .2 .3 .4
  Sampler s(plain(), 4);
  auto h = histogram(s, l, 40000);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i] / 40000.0, (i + 1) / 10.0, 0.01) << i;
}

TEST(Sampling, TopKKeepsOnlyKBest) {
  std::vector<float> l = {5.f, 4.f, 3.f, 2.f, 1.f, 0.f};
  SamplingParams p = plain();
  p.top_k = 2;
  Sampler s(p, 6);
  auto h = histogram(s, l, 5000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[0], h[1]);
}

TEST(Sampling, TopPKeepsSmallestPrefixReachingP) {
  std::vector<float> l = {std::log(.5f), std::log(.3f), std::log(.15f), std::log(.05f)};
  SamplingParams p = plain();
  p.top_p = 0.79f;  // .5 + .3 reaches .79: tokens 0 and 1
  Sampler s(p, 4);
  auto h = histogram(s, l, 5000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_NEAR(h[0] / 5000.0, 0.5 / 0.8, 0.03);
  p.top_p = 0.81f;  // needs token 2 as well
  Sampler s2(p, 4);
  EXPECT_EQ(histogram(s2, l, 5000).size(), 3u);
}

TEST(Sampling, MinPDropsUnlikelyTokens) {
  std::vector<float> l = {std::log(.5f), std::log(.3f), std::log(.15f), std::log(.05f)};
  SamplingParams p = plain();
  p.min_p = 0.2f;  // keeps p >= 0.1: tokens 0, 1, 2
  Sampler s(p, 4);
  auto h = histogram(s, l, 5000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
}

TEST(Sampling, LowTemperatureSharpens) {
  std::vector<float> l = {1.f, 0.f};
  SamplingParams p = plain();
  p.temperature = 0.25f;  // p0 = 1 / (1 + e^-4)
  Sampler s(p, 2);
  auto h = histogram(s, l, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 1.0 / (1.0 + std::exp(-4.0)), 0.01);
}

TEST(Sampling, SeedReproducesAndDiffers) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[i] = std::sin(i * 1.3f);
  SamplingParams p = plain();
  p.seed = 42;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 100);
    std::vector<int> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(l.data()));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  Sampler s(p, 100);  // reset() replays the same draws
  std::vector<int> a, b;
  for (int i = 0; i < 10; ++i) a.push_back(s.sample(l.data()));
  s.reset();
  for (int i = 0; i < 10; ++i) b.push_back(s.sample(l.data()));
  EXPECT_EQ(a, b);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p = plain();
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p, 3);
  std::vector<float> l = {3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data()), 0);
  s.accept(0);  // 3 -> 1.5 < 2
  EXPECT_EQ(s.sample(l.data()), 1);
  std::vector<float> neg = {-1.0f, -1.5f, -5.0f};
  Sampler s2(p, 3);
  s2.accept(0);  // -1 -> -2 < -1.5
  EXPECT_EQ(s2.sample(neg.data()), 1);
}

TEST(Sampling, PresenceAndFrequencyPenalties) {
  SamplingParams p = plain();
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 2);
  std::vector<float> l = {1.0f, 0.2f};
  s.accept(0);  // 1 - 0.5 = 0.5 > 0.2
  EXPECT_EQ(s.sample(l.data()), 0);
  s.accept(0);  // 1 - 1.0 = 0 < 0.2
  EXPECT_EQ(s.sample(l.data()), 1);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.9f;
  Sampler s2(p, 2);
  s2.accept(0);
  s2.accept(0);  // once only: 1 - 0.9 = 0.1 < 0.2
  EXPECT_EQ(s2.sample(l.data()), 1);
  // The window forgets: with repeat_last_n = 1, an older token is not penalised.
  p.presence_penalty = 0.9f;
  p.repeat_last_n = 1;
  Sampler s3(p, 2);
  s3.accept(0);
  s3.accept(1);
  EXPECT_EQ(s3.sample(l.data()), 0);
}

TEST(Sampling, BadParamsAreErrors) {
  SamplingParams p = plain();
  p.top_p = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = plain();
  p.min_p = 2;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = plain();
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = plain();
  p.temperature = NAN;
  EXPECT_THROW(Sampler(p, 10), Error);
}

TEST(StopStrings, HoldsBackPrefixesAndStopsBeforeMatch) {
  StopMatcher m({"</s>", "STOP"});
  std::string out;
  out += m.feed("Hello <");
  EXPECT_EQ(out, "Hello ");  // "<" may start "</s>"
  out += m.feed("b>");       // "<b>" cannot: released
  EXPECT_EQ(out, "Hello <b>");
  out += m.feed(" ST");
  EXPECT_EQ(out, "Hello <b> ");
  out += m.feed("OP and more");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(out, "Hello <b> ");
  EXPECT_EQ(m.feed("x"), "");
}

TEST(StopStrings, FinishReleasesHeldTextAndEarliestMatchWins) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.feed("xab"), "x");
  EXPECT_EQ(m.finish(), "ab");
  StopMatcher m2({"cd", "bcd"});
  EXPECT_EQ(m2.feed("abcde"), "a");
  EXPECT_EQ(m2.matched(), "bcd");
  StopMatcher none({});
  EXPECT_EQ(none.feed("anything"), "anything");
}

// The sampler's candidate selection (a heap over the raw logits plus the history's penalized tokens)
// against the direct rule (sampling_reference.h): every logit penalized in a full copy, sorted (partial_sort
// for top-k), then the same top-p / min-p / temperature / draw. Same seed, same picks, on logits with many
// ties, with and without penalties and top-k, histories with repeats and out-of-range ids.

TEST(Sampling, CandidateSelectionMatchesFullSort) {
  Rng gen(7);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t V = trial % 3 == 0 ? 50 : 3000;
    SamplingParams P;
    P.seed = uint64_t(trial);
    P.temperature = trial % 5 == 0 ? 0.0f : 0.3f + 0.1f * float(trial % 9);
    P.top_k = std::array<int, 4>{0, 1, 40, 2999}[size_t(trial % 4)];
    P.top_p = trial % 2 ? 0.9f : 1.0f;
    P.min_p = trial % 3 ? 0.05f : 0.0f;
    P.repeat_last_n = trial % 7 == 0 ? -1 : 16;
    if (trial % 4 != 1) {
      P.repeat_penalty = trial % 8 < 4 ? 1.3f : 0.7f;  // < 1 raises positive logits
      P.presence_penalty = trial % 6 < 3 ? 0.5f : -0.5f;
      P.frequency_penalty = 0.25f;
    }
    Sampler s(P, V);
    Rng ref_rng(P.seed);
    std::vector<int32_t> hist;
    std::vector<float> logits(static_cast<size_t>(V), 0.0f);
    for (int step = 0; step < 40; ++step) {
      for (float& l : logits) l = float(int(gen.uniform() * 16)) * 0.5f - 4.0f;  // coarse: many ties
      const int32_t got = s.sample(logits.data());
      std::vector<int32_t> window = hist;
      if (P.repeat_last_n > 0 && window.size() > size_t(P.repeat_last_n))
        window.erase(window.begin(), window.end() - P.repeat_last_n);
      const int32_t want = test::reference_pick(P, logits, window, ref_rng);
      ASSERT_EQ(got, want) << "trial " << trial << " step " << step;
      // Accept the pick, and now and then a token the model did not pick (a prompt token, an id the
      // vocabulary does not have: ignored by the penalties).
      const int32_t extra = step % 5 == 0 ? (step % 10 == 0 ? V + 3 : int32_t(gen.uniform() * V)) : -2;
      s.accept(got);
      hist.push_back(got);
      if (extra != -2) s.accept(extra), hist.push_back(extra);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 60 * 40);
}

// Top-k off at the real vocabulary size: the sampler orders only the ranks its walks reach (a sorted prefix,
// then halving by mass) and sums over positions; the picks equal the full sort's, for peaked and flat
// logits, with top-p and min-p on and off, at several temperatures, and with -inf logits (a ban).
TEST(Sampling, TopKOffMatchesFullSortAtVocabularySize) {
  const int32_t V = 151936;
  Rng gen(11);
  int checked = 0;
  for (int trial = 0; trial < 12; ++trial) {
    SamplingParams P;
    P.seed = 1000 + uint64_t(trial);
    P.top_k = 0;
    P.temperature = std::array<float, 3>{1.0f, 0.7f, 1.6f}[size_t(trial % 3)];
    P.top_p = std::array<float, 4>{1.0f, 0.95f, 0.5f, 0.999f}[size_t(trial % 4)];
    P.min_p = trial % 5 == 2 ? 0.01f : trial % 5 == 4 ? 1e-6f : 0.0f;
    const float sd = std::array<float, 4>{0.5f, 1.0f, 3.0f, 6.0f}[size_t((trial / 3) % 4)];
    Sampler s(P, V);
    Rng ref_rng(P.seed);
    std::vector<float> logits(static_cast<size_t>(V));
    for (int step = 0; step < 6; ++step) {
      for (float& l : logits) {  // a sum of uniforms: roughly normal with deviation sd
        double x = 0;
        for (int j = 0; j < 3; ++j) x += gen.uniform() - 0.5;
        l = float(x * 2.0 * sd);
      }
      if (step % 2) logits[size_t(step * 7)] = -std::numeric_limits<float>::infinity();
      const int32_t got = s.sample(logits.data());
      ASSERT_EQ(got, test::reference_pick(P, logits, {}, ref_rng)) << "trial " << trial << " step " << step;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12 * 6);
}
