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
  // Positions [0, n) of cand_ hold the first n candidates of the order (as a set); [0, sorted) of them are
  // in order.
  size_t sorted = 0;
  if (n == V) {
    // Top-k off: every token is a candidate. Why not sort them all (~12 ms a row at a 152k vocabulary): the
    // walks below over ranks (top-p, the draw) go through the sorted prefix, then split the rest by mass
    // (walk) and sort only the last ~1k candidates; sums are taken over positions, in the array's order. They differ from sums in rank order in the double's last bits only, so the picks are a full
    // sort's except where a cumulative sum falls within ~1e-16 of the target (tests/test_sampling.cpp).
    for (int32_t i = 0; i < n_vocab_; ++i) cand_[size_t(i)] = {i, logits[i], 0.0f};
    for (const Cand& c : pen_) cand_[size_t(c.id)].logit = c.logit;
    std::iter_swap(cand_.begin(), std::min_element(cand_.begin(), cand_.end(), before));  // the best first
    sorted = 1;
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
    sorted = count;
  }
  if (greedy) return cand_[0].id;
  const float mx = cand_[0].logit;
  // Each candidate's weight exp((logit - max) / temp) (kept in Cand::w for the walk that follows) and
  // their sum over positions [0, m).
  const auto total = [&](size_t m, float temp) {
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) {
      cand_[i].w = std::exp((cand_[i].logit - mx) / temp);
      sum += cand_[i].w;
    }
    return sum;
  };
  // The first rank i < m whose cumulative probability (ranks 0..i) satisfies stop, or m when none does;
  // on return positions [0, i] hold ranks [0, i], position i rank i. The sorted prefix is walked in order;
  // the rest is split while more than ~1024 ranks remain, the better part's mass saying on which side the
  // target is: first at the candidates within a factor 1e-3 of the best weight (one pass; the target is
  // among them unless the distribution is flat), then at medians (nth_element).
  // Cand::w must hold total's weights. A probability is the float w / sum, as a full sort's softmax stored.
  const auto walk = [&](size_t m, double sum, float temp, auto stop) -> size_t {
    const auto prob = [sum](const Cand& c) { return static_cast<float>(c.w / sum); };
    double cum = 0.0;
    size_t lo = 0, hi = m;
    for (; lo < std::min(sorted, hi); ++lo) {
      cum += prob(cand_[lo]);
      if (stop(cum)) return lo;
    }
    const auto at = [&](size_t i) { return cand_.begin() + std::ptrdiff_t(i); };
    for (bool first = true; hi - lo > 1024; first = false) {
      size_t mid;
      if (first) {
        const float thresh = mx + temp * std::log(1e-3f);
        mid = size_t(std::partition(at(lo), at(hi), [thresh](const Cand& c) { return c.logit >= thresh; }) -
                     cand_.begin());
        if (mid == lo || mid == hi) continue;  // nothing split off: on to the medians
      } else {
        mid = lo + (hi - lo) / 2;
        std::nth_element(at(lo), at(mid), at(hi), before);
      }
      double left = 0.0;
      for (size_t i = lo; i < mid; ++i) left += prob(cand_[i]);
      if (stop(cum + left)) {
        hi = mid;
      } else {
        cum += left;
        lo = mid;
      }
    }
    const bool extends_prefix = lo == sorted;
    std::sort(at(lo), at(hi), before);
    if (extends_prefix) sorted = hi;
    for (; lo < hi; ++lo) {
      cum += prob(cand_[lo]);
      if (stop(cum)) return lo;
    }
    return m;
  };
  // top-p: the smallest prefix whose probability (softmax at temperature 1) reaches p (at least one token).
  if (P.top_p < 1.0f) {
    const double top_p = P.top_p;
    const double sum = total(n, 1.0f);
    const size_t at = walk(n, sum, 1.0f, [top_p](double cum) { return cum >= top_p; });
    if (at < n) n = at + 1;
  }
  // min-p: drop tokens less likely than min_p times the best one. Those with logit >= thresh are a prefix
  // of the order: counted, then moved to the front where they are not there yet.
  if (P.min_p > 0.0f) {
    const float thresh = cand_[0].logit + std::log(P.min_p);  // p_i >= min_p * p_0 in logit space
    size_t keep = 0;
    for (size_t i = 0; i < n; ++i) keep += cand_[i].logit >= thresh;
    keep = std::max<size_t>(keep, 1);
    if (keep > sorted && keep < n)
      std::partition(cand_.begin() + std::ptrdiff_t(sorted), cand_.begin() + std::ptrdiff_t(n),
                     [thresh](const Cand& c) { return c.logit >= thresh; });
    n = keep;
  }
  // temperature, then draw (u beyond the last cumulative sum: the last candidate).
  const double u = rng_.uniform();
  const double sum = total(n, P.temperature);
  const size_t at = walk(n, sum, P.temperature, [u](double cum) { return u < cum; });
  if (at < n) return cand_[at].id;
  if (n > sorted) std::nth_element(cand_.begin() + std::ptrdiff_t(sorted), cand_.begin() + std::ptrdiff_t(n - 1),
                                   cand_.begin() + std::ptrdiff_t(n), before);
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
