#pragma once
// The MoE layer and routing the GPU MoE tests share (test_moe_kernels.cu, test_moe_grouped.cu).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/moe_kernels.cuh"
#include "gpu_test_util.h"

namespace strata::test {

// 16 experts (n_embd 2048, n_ff 768) with host weights; 10 of them resident in scattered slots of one host
// slot buffer laid out as moe_kernels.cuh says (slots 4 and 8 stay empty: random bytes), the rest -1.
// extra_offset is added to the tensors' offsets and the slot size (odd: unaligned rows). slot_tail > 0:
// slots that many bytes larger than the expert (view.expert_bytes, as a layer whose experts are smaller
// than the largest layer's), the tail random like the rest.
// view.slots is left null: the caller uploads `slots` and points it there.
struct MoeTestLayer {
  static constexpr int64_t n_embd = 2048, n_ff = 768;
  static constexpr int n_expert = 16, n_slots = 12;
  cuda::moe::ExpertLayerView view;
  std::vector<std::vector<uint8_t>> G, U, D;  // [n_expert] gate, up [n_ff][n_embd]; down [n_embd][n_ff]
  std::vector<int32_t> table;                 // [n_expert] slot or -1
  std::vector<uint8_t> slots;                 // [n_slots][view.slot_bytes]
};

inline MoeTestLayer make_moe_test_layer(GgmlType gate, GgmlType up, GgmlType down, int64_t extra_offset,
                                        std::mt19937& rng, int64_t slot_tail = 0) {
  MoeTestLayer L;
  const int64_t n_embd = L.n_embd, n_ff = L.n_ff;
  const int64_t gb = int64_t(row_bytes(gate, n_embd)) * n_ff, ub = int64_t(row_bytes(up, n_embd)) * n_ff,
                db = int64_t(row_bytes(down, n_ff)) * n_embd;
  auto& v = L.view;
  v.gate_type = gate, v.up_type = up, v.down_type = down;
  v.gate_off = extra_offset, v.up_off = v.gate_off + gb + extra_offset, v.down_off = v.up_off + ub;
  v.slot_bytes = v.down_off + db + extra_offset;
  if (slot_tail > 0) v.expert_bytes = v.slot_bytes, v.slot_bytes += slot_tail;
  v.n_embd = n_embd, v.n_ff = n_ff;

  L.G.resize(L.n_expert), L.U.resize(L.n_expert), L.D.resize(L.n_expert);
  for (int e = 0; e < L.n_expert; ++e) {
    L.G[e] = random_weights(gate, n_ff, n_embd, rng);
    L.U[e] = random_weights(up, n_ff, n_embd, rng);
    L.D[e] = random_weights(down, n_embd, n_ff, rng);
  }
  L.table.assign(L.n_expert, -1);
  const int resident[] = {0, 2, 3, 5, 8, 9, 11, 12, 14, 15};
  const int slot_of[] = {7, 0, 11, 3, 9, 1, 5, 10, 2, 6};
  L.slots.resize(v.slot_bytes * L.n_slots);
  for (auto& b : L.slots) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < 10; ++i) {
    const int e = resident[i], s = slot_of[i];
    L.table[e] = s;
    uint8_t* base = L.slots.data() + s * v.slot_bytes;
    std::copy(L.G[e].begin(), L.G[e].end(), base + v.gate_off);
    std::copy(L.U[e].begin(), L.U[e].end(), base + v.up_off);
    std::copy(L.D[e].begin(), L.D[e].end(), base + v.down_off);
  }
  return L;
}

// Routing of n tokens over MoeTestLayer's experts: k distinct random experts per token with random weights
// summing to 1, except token 1 (when n > 1): only the 6 non-resident experts (two of them twice), so it
// has no resident expert. ids, wts: [n][k].
inline void make_moe_test_routing(int64_t n, int k, std::mt19937& rng, std::vector<int32_t>& ids,
                                  std::vector<float>& wts) {
  ids.assign(n * k, 0);
  wts.assign(n * k, 0.f);
  const int non_resident[] = {1, 4, 6, 7, 10, 13};
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(MoeTestLayer::n_expert);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < k; ++j) ids[t * k + j] = t == 1 ? non_resident[j % 6] : perm[j];
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += (wts[t * k + j] = 0.1f + float(rng() % 1000) / 1000.f);
    for (int j = 0; j < k; ++j) wts[t * k + j] /= sum;
  }
}

}  // namespace strata::test
