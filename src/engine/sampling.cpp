#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace strata {

void SamplingParams::validate() const {
  STRATA_REQUIRE(std::isfinite(temperature), "temperature must be a finite number, got {}",
                 temperature);
  STRATA_REQUIRE(top_p > 0.0f && top_p <= 1.0f, "top-p must be in (0, 1], got {}", top_p);
  STRATA_REQUIRE(min_p >= 0.0f && min_p <= 1.0f, "min-p must be in [0, 1], got {}", min_p);
  STRATA_REQUIRE(repeat_penalty > 0.0f && std::isfinite(repeat_penalty),
                 "repeat penalty must be > 0, got {}", repeat_penalty);
  STRATA_REQUIRE(repeat_last_n >= -1, "repeat-last-n must be >= -1, got {}", repeat_last_n);
  STRATA_REQUIRE(std::isfinite(presence_penalty) && std::isfinite(frequency_penalty),
                 "presence/frequency penalties must be finite");
}

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void Rng::reseed(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  params_.validate();
  STRATA_REQUIRE(n_vocab > 0, "sampler: vocabulary size must be > 0");
  counts_.assign(static_cast<size_t>(n_vocab), 0);
  cand_.resize(static_cast<size_t>(n_vocab));
  pen_.reserve(static_cast<size_t>(std::min(n_vocab, params_.repeat_last_n > 0 ? params_.repeat_last_n : 1024)));
}

void Sampler::reset() {
  history_.clear();
  rng_.reseed(params_.seed);
}

bool Sampler::penalties_off() const {
  return params_.repeat_penalty == 1.0f && params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f;
}

double Sampler::next_draw() { return params_.temperature <= 0.0f ? 0.0 : rng_.uniform(); }

void Sampler::accept(int32_t token) {
  if (params_.repeat_last_n == 0) return;
  history_.push_back(token);
  if (params_.repeat_last_n > 0 && history_.size() > static_cast<size_t>(params_.repeat_last_n))
    history_.pop_front();
}

namespace {
// The candidate order of every step: higher logit first, the lower id on ties (a total order).
bool by_logit(const float la, int32_t ia, const float lb, int32_t ib) { return la > lb || (la == lb && ia < ib); }
}  // namespace

int32_t Sampler::sample(const float* logits) {
  const auto& P = params_;
  const auto before = [](const Cand& a, const Cand& b) { return by_logit(a.logit, a.id, b.logit, b.id); };

  // Penalties over the window (llama.cpp's penalties sampler): the adjusted logit of each distinct
  // token of the history, in pen_ (every other token keeps its logit).
  pen_.clear();
  const bool penalize = P.repeat_penalty != 1.0f || P.presence_penalty != 0.0f ||
                        P.frequency_penalty != 0.0f;
  if (penalize && !history_.empty()) {
    for (int32_t t : history_)
      if (t >= 0 && t < n_vocab_) ++counts_[t];
    for (int32_t t : history_) {
      if (t < 0 || t >= n_vocab_ || counts_[t] == 0) continue;  // each token once
      float l = logits[t];
      l = l > 0 ? l / P.repeat_penalty : l * P.repeat_penalty;
      l -= static_cast<float>(counts_[t]) * P.frequency_penalty + P.presence_penalty;
      pen_.push_back({t, l, 0.0f});
      counts_[t] = 0;
    }
  }

  // The first n candidates in order, n = top-k (1 when greedy), or every token when top-k is off.
  // Why not sort a copy of all n_vocab logits: only the k best can survive, and a token outside the
  // history keeps its logit, so the k best are among the k + |history| best raw logits (one pass with a
  // small heap) plus the history's adjusted ones: the same candidates in the same order, ~10x faster.
  const bool greedy = P.temperature <= 0.0f;
  const size_t V = static_cast<size_t>(n_vocab_);
  size_t n = greedy ? 1 : (P.top_k > 0 ? std::min(static_cast<size_t>(P.top_k), V) : V);
  if (n == V) {
    for (int32_t i = 0; i < n_vocab_; ++i) cand_[size_t(i)] = {i, logits[i], 0.0f};
    for (const Cand& c : pen_) cand_[size_t(c.id)].logit = c.logit;
    std::sort(cand_.begin(), cand_.end(), before);
  } else {
    const size_t m = std::min(V, n + pen_.size());
    // A heap of the m best raw logits so far, its worst on top. Ids come in increasing order, so a new
    // token beats the worst only with a strictly higher logit.
    auto heap_begin = cand_.begin(), heap_end = heap_begin;
    const auto offer = [&](int32_t i) {
      const float l = logits[i];
      if (size_t(heap_end - heap_begin) < m) {
        *heap_end++ = {i, l, 0.0f};
        std::push_heap(heap_begin, heap_end, before);
      } else if (l > heap_begin->logit) {
        std::pop_heap(heap_begin, heap_end, before);
        *(heap_end - 1) = {i, l, 0.0f};
        std::push_heap(heap_begin, heap_end, before);
      }
    };
    // Blocks of 32 whose maximum cannot enter a full heap are skipped after one vectorizable max.
    constexpr int32_t kBlock = 32;
    int32_t i = 0;
    for (; i + kBlock <= n_vocab_; i += kBlock) {
      if (size_t(heap_end - heap_begin) == m) {
        float mx = logits[i];
        for (int32_t j = 1; j < kBlock; ++j) mx = std::max(mx, logits[i + j]);
        if (!(mx > heap_begin->logit)) continue;
      }
      for (int32_t j = 0; j < kBlock; ++j) offer(i + j);
    }
    for (; i < n_vocab_; ++i) offer(i);
    // The history's tokens with their adjusted logits (replacing a raw entry, or added).
    size_t count = size_t(heap_end - heap_begin);
    for (const Cand& c : pen_) {
      bool found = false;
      for (size_t i = 0; i < m && !found; ++i)
        if (cand_[i].id == c.id) cand_[i].logit = c.logit, found = true;
      if (!found) cand_[count++] = c;
    }
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(count), before);
  }
  if (greedy) return cand_[0].id;

  auto softmax_n = [&](size_t m, float temp) {
    const float mx = cand_[0].logit;
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) {
      cand_[i].p = std::exp((cand_[i].logit - mx) / temp);
      sum += cand_[i].p;
    }
    for (size_t i = 0; i < m; ++i) cand_[i].p = static_cast<float>(cand_[i].p / sum);
  };
  // top-p: the smallest prefix whose probability reaches p (at least one token).
  if (P.top_p < 1.0f) {
    softmax_n(n, 1.0f);
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += cand_[i].p;
      if (cum >= P.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  // min-p: drop tokens less likely than min_p times the best one.
  if (P.min_p > 0.0f) {
    const float thresh = cand_[0].logit + std::log(P.min_p);  // p_i >= min_p * p_0 in logit space
    size_t keep = 1;
    while (keep < n && cand_[keep].logit >= thresh) ++keep;
    n = keep;
  }
  // temperature, then draw.
  softmax_n(n, P.temperature);
  const double u = rng_.uniform();
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += cand_[i].p;
    if (u < cum) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::feed(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  // A complete stop string: emit what precedes the earliest one and stop.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

}  // namespace strata
