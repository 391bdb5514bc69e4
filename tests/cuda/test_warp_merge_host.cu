// The sampler prefilter's sorting networks (cuda/warp_merge.cuh), run on the host without a GPU: the same
// template code on std::threads that emulate a block (a shuffle is an exchange through a per-warp array
// between two barriers of the warp's 32 threads; sync() a barrier of the whole block). Checked against
// std::sort: a warp's sort of 64 keys, the top 64 of two sorted lists (and of lists padded with 0, as the
// sampler's merge of top-k lists pads them), and the tree over 32 lists, fed by 32 warps' sorts as in
// sample_cand_merge_kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cuda/warp_merge.cuh"

namespace wm = strata::cuda::warp_merge;

namespace {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  uint64_t gen_ = 0;
};

struct Block {
  explicit Block(int n_threads) : block(n_threads), slots(size_t(n_threads)) {
    for (int w = 0; w < n_threads / 32; ++w) warps.push_back(std::make_unique<Barrier>(32));
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<uint64_t> slots;  // [thread]: a shuffle's exchange
};

struct HostLanes {
  unsigned t;
  Block* b;
  unsigned tid() const { return t; }
  uint64_t exchange(uint64_t v, unsigned src_lane) const {
    const unsigned base = t & ~31u;
    Barrier& w = *b->warps[t / 32];
    b->slots[t] = v;
    w.wait();
    const uint64_t o = b->slots[base + src_lane];
    w.wait();
    return o;
  }
  uint64_t shfl_xor(uint64_t v, int mask) const { return exchange(v, (t & 31u) ^ unsigned(mask)); }
  uint64_t shfl(uint64_t v, int src) const { return exchange(v, unsigned(src)); }
  void sync() const { b->block.wait(); }
};

// Runs body(lanes) on n_threads threads emulating one block.
void run_block(int n_threads, const std::function<void(const HostLanes&)>& body) {
  Block blk(n_threads);
  std::vector<std::thread> th;
  th.reserve(size_t(n_threads));
  for (int t = 0; t < n_threads; ++t) th.emplace_back([&, t] { body(HostLanes{unsigned(t), &blk}); });
  for (auto& x : th) x.join();
}

std::vector<uint64_t> random_keys(std::mt19937_64& rng, size_t n, bool small_range) {
  std::vector<uint64_t> k(n);
  for (auto& x : k) x = small_range ? rng() % 16 : rng();  // small range: many equal keys
  return k;
}

std::vector<uint64_t> sorted_desc(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end(), [](uint64_t a, uint64_t b) { return a > b; });
  return v;
}

}  // namespace

TEST(WarpMergeHost, Sort64SortsAWarpsKeysDescending) {
  std::mt19937_64 rng(1);
  for (int c = 0; c < 40; ++c) {
    const auto in = random_keys(rng, 64, c % 4 == 3);
    std::vector<uint64_t> out(64);
    run_block(32, [&](const HostLanes& L) {
      uint64_t a0 = in[L.t], a1 = in[L.t + 32];
      wm::sort64_desc(L, a0, a1);
      out[L.t] = a0;
      out[L.t + 32] = a1;
    });
    EXPECT_EQ(out, sorted_desc(in)) << "case " << c;
  }
}

TEST(WarpMergeHost, Merge64KeepsTheTop64OfTwoSortedLists) {
  std::mt19937_64 rng(2);
  for (int c = 0; c < 40; ++c) {
    auto a = sorted_desc(random_keys(rng, 64, c % 4 == 3));
    auto b = sorted_desc(random_keys(rng, 64, c % 4 == 3));
    if (c % 5 == 1) {  // b as a top-k list padded with 0 (the sampler's lists of k < 64)
      const size_t k = 1 + size_t(rng() % 63);
      std::fill(b.begin() + long(k), b.end(), 0);
    }
    if (c % 7 == 2) std::fill(a.begin(), a.end(), 0);  // an empty accumulator (the first merge)
    std::vector<uint64_t> all(a);
    all.insert(all.end(), b.begin(), b.end());
    auto want = sorted_desc(all);
    want.resize(64);
    std::vector<uint64_t> out(64);
    run_block(32, [&](const HostLanes& L) {
      uint64_t a0 = a[L.t], a1 = a[L.t + 32];
      wm::merge64_desc(L, a0, a1, b[L.t], b[L.t + 32]);
      out[L.t] = a0;
      out[L.t + 32] = a1;
    });
    EXPECT_EQ(out, want) << "case " << c;
  }
}

TEST(WarpMergeHost, TreeOfWarpSortsKeepsTheTop64OfABlocksKeys) {
  std::mt19937_64 rng(3);
  for (int c = 0; c < 2; ++c) {
    const auto in = random_keys(rng, 2048, c == 1);
    std::vector<uint64_t> keys(2048);
    run_block(1024, [&](const HostLanes& L) {  // as sample_cand_merge_kernel: warp w sorts keys [64 w, + 64)
      const unsigned w = L.t / 32, lane = L.t % 32;
      uint64_t a0 = in[w * 64 + lane], a1 = in[w * 64 + lane + 32];
      wm::sort64_desc(L, a0, a1);
      keys[w * 64 + lane] = a0;
      keys[w * 64 + lane + 32] = a1;
      L.sync();
      wm::tree_top64(L, keys.data());
    });
    auto want = sorted_desc(in);
    want.resize(64);
    EXPECT_EQ(std::vector<uint64_t>(keys.begin(), keys.begin() + 64), want) << "case " << c;
  }
}
