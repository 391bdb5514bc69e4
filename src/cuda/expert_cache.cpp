// The GPU expert cache (see expert_cache.h for the ordering protocol). Plain C++: every CUDA call goes
// through cuda::Device / Stream / Event / Transfer, so every copy is ordered by the transfer module and
// seen by the stream-order checker.
#include "cuda/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "common/checked_math.h"
#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/quant_kernels.cuh"
#include "moe/direct_rule.h"
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/q4_0_x8.h"
#include "quant/q6_k_p.h"

namespace strata::cuda {

namespace sc = strata::stream_check;

namespace {

constexpr int64_t kAlign = 256;  // every matrix in a slot starts 256-byte aligned (vector loads)

int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The slot layout of one layer: gate | up | down, each in its GPU storage type.
struct Layout {
  GgmlType gate{}, up{}, down{};            // storage types
  int64_t gate_off = 0, up_off = 0, down_off = 0;
  int64_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;
  int64_t bytes = 0;  // aligned end of down
};

GgmlType checked_type(GgmlType t, int layer, const char* what) {
  STRATA_REQUIRE(file_type_traits(uint32_t(t)) != nullptr, "expert cache: layer {} {} has unknown type id {}", layer,
                 what, uint32_t(t));
  return t;
}

// STRATA_CUDA_Q4_0_X8: 1 keeps Q4_0 experts (rows of whole 256-value groups) regrouped as Q4_0_X8
// (quant/q4_0_x8.h), 0 as the file's Q4_0. The same values, bytes and sums (the kernels do Q4_0's
// arithmetic in Q4_0's order); why: the decode kernels read Q4_0_X8's codes with aligned 16-byte loads in
// place, where Q4_0's 18-byte blocks make them stage each row in shared memory first.
// On by default since session 34 (H200, 48-layer 30B-A3B geometry at Q4_0, tg64 alternating: 552.2 / 542.0
// against 530.2 / 526.6 tok/s, 2 of 2 pairs; the GPU tests give the same logits bit for bit;
// bench/results/2026-12-05-gpu-session34-h200.md). pp512 and 25% resident were not measured with it.
DigitSetting g_q4_0_x8("STRATA_CUDA_Q4_0_X8", "Q4_0 experts as q4_0x8", 0, 1, 1);

// STRATA_CUDA_Q6_K_P_DOWN: 1 keeps Q6_K expert down matrices padded as Q6_K_P (quant/q6_k_p.h: every block
// 16-byte aligned, 1.067x the bytes), 0 as the file's Q6_K. The same values and sums (the kernels do Q6_K's
// arithmetic in Q6_K's order); why: moe_down stages Q6_K's 2-byte aligned rows in shared memory.
// On by default since session 43 (H100, bench/cuda_matvec: moe_down with Q6_K down 13.37 -> 8.55 us a layer;
// 48-layer 30B-A3B geometry at Q4_K_M, tg64 alternating: one sequence 555.4 against 523.1 tok/s (3 of 3
// rounds), 4 sequences 789.2 against 739.1 (2 of 2), 25% resident even within its spread (81-93 either way);
// the GPU tests give the same logits bit for bit; bench/results/2026-12-06-gpu-session43-h100.md).
DigitSetting g_q6_k_p("STRATA_CUDA_Q6_K_P_DOWN", "Q6_K expert down matrices as q6_kp", 0, 1, 1);

// The type a file type is kept in inside a slot, for a matrix of `cols` columns (down: an ffn_down_exps one).
GgmlType slot_type(GgmlType t, bool exact, int64_t cols, bool down) {
  if (exact) return GgmlType::F32;
  if (t == GgmlType::Q4_0 && cols % kQ4_0X8Values == 0 && g_q4_0_x8.get() == 1) return GgmlType::Q4_0_X8;
  if (down && t == GgmlType::Q6_K && g_q6_k_p.get() == 1) return GgmlType::Q6_K_P;
  return quant::storage_type(t);
}

// Bytes of one expert matrix [rows][cols] of type t; validates cols against the block size.
int64_t matrix_bytes(GgmlType t, int64_t rows, int64_t cols, int layer, const char* what) {
  const auto& tt = type_traits(t);
  STRATA_REQUIRE(cols % tt.block_size == 0, "expert cache: layer {} {}: {} columns is not a multiple of {}'s block of {}",
                 layer, what, cols, tt.name, tt.block_size);
  auto b = checked_mul(row_bytes(t, uint64_t(cols)), uint64_t(rows));
  STRATA_REQUIRE(b && *b < (uint64_t(1) << 40), "expert cache: layer {} {} is too large", layer, what);
  return int64_t(*b);
}

Layout layout_of(int64_t n_embd, int64_t n_ff, const LayerExperts& le, int layer, bool exact) {
  Layout L;
  const GgmlType fg = checked_type(le.gate.type, layer, "ffn_gate_exps");
  const GgmlType fu = checked_type(le.up.type, layer, "ffn_up_exps");
  const GgmlType fd = checked_type(le.down.type, layer, "ffn_down_exps");
  // The file's own layout must be valid too (we read whole experts from it).
  matrix_bytes(fg, n_ff, n_embd, layer, "ffn_gate_exps");
  matrix_bytes(fu, n_ff, n_embd, layer, "ffn_up_exps");
  matrix_bytes(fd, n_embd, n_ff, layer, "ffn_down_exps");
  L.gate = slot_type(fg, exact, n_embd, false);
  L.up = slot_type(fu, exact, n_embd, false);
  L.down = slot_type(fd, exact, n_ff, true);
  for (auto [t, st] : {std::pair{fg, L.gate}, std::pair{fu, L.up}, std::pair{fd, L.down}})
    STRATA_REQUIRE(st == t || can_dequantize(t), "expert cache: layer {}: {} experts cannot be converted to {}",
                   layer, type_name(t), type_name(st));
  L.gate_bytes = matrix_bytes(L.gate, n_ff, n_embd, layer, "ffn_gate_exps (slot)");
  L.up_bytes = matrix_bytes(L.up, n_ff, n_embd, layer, "ffn_up_exps (slot)");
  L.down_bytes = matrix_bytes(L.down, n_embd, n_ff, layer, "ffn_down_exps (slot)");
  L.gate_off = 0;
  L.up_off = align_up(L.gate_bytes);
  L.down_off = align_up(L.up_off + L.up_bytes);
  L.bytes = align_up(L.down_off + L.down_bytes);
  return L;
}

// Expert `e` of a file tensor [n_expert][rows][cols] of type `from`, written into `dst` as type `to`.
void convert_expert(const ExpertTensor& t, int64_t e, int64_t rows, int64_t cols, GgmlType to, uint8_t* dst,
                    std::vector<float>& tmp) {
  const int64_t src_row = int64_t(row_bytes(t.type, uint64_t(cols)));
  const uint8_t* src = static_cast<const uint8_t*>(t.data) + e * rows * src_row;
  if (to == t.type) {
    std::memcpy(dst, src, size_t(rows * src_row));
  } else if (to == GgmlType::F32) {
    dequantize_row(t.type, src, reinterpret_cast<float*>(dst), rows * cols);
  } else if (to == GgmlType::Q4_0_X8 && t.type == GgmlType::Q4_0) {
    repack_q4_0_x8(src, dst, rows * cols);  // (rows are whole groups: slot_type checked cols)
  } else if (to == GgmlType::Q6_K_P && t.type == GgmlType::Q6_K) {
    repack_q6_k_p(src, dst, rows * cols);  // (dst: rows * cols / 256 blocks of 224 bytes)
  } else if (to == GgmlType::F16) {
    // Why F16: the type has no GPU kernel; F16 keeps every value of the common formats' grids.
    tmp.resize(size_t(cols));
    uint16_t* out = reinterpret_cast<uint16_t*>(dst);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, src + r * src_row, tmp.data(), cols);
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = q::fp32_to_fp16(tmp[size_t(c)]);
    }
  } else {
    fail("expert cache: no conversion from {} to {}", type_name(t.type), type_name(to));
  }
}

std::vector<LayerExperts> validated(std::vector<LayerExperts> layers, int64_t n_embd, int64_t n_ff, int n_expert,
                                    const ExpertCacheConfig& cfg) {
  STRATA_REQUIRE(!layers.empty(), "expert cache: no MoE layers");
  STRATA_REQUIRE(n_embd > 0 && n_ff > 0 && n_expert > 0, "expert cache: bad geometry n_embd {} n_ff {} n_expert {}",
                 n_embd, n_ff, n_expert);
  STRATA_REQUIRE(cfg.n_slots >= 0, "expert cache: --expert-cache must be >= 0, got {}", cfg.n_slots);
  STRATA_REQUIRE(cfg.adapt_every >= 0 && cfg.max_swaps >= 0, "expert cache: adapt_every ({}) and max_swaps ({}) must be >= 0",
                 cfg.adapt_every, cfg.max_swaps);
  STRATA_REQUIRE(cfg.decay >= 0 && cfg.decay <= 1, "expert cache: decay {} must be in [0, 1]", cfg.decay);
  STRATA_REQUIRE(cfg.n_stage >= 0 && cfg.n_stage <= n_expert, "expert cache: {} staging slots (0..{} allowed)",
                 cfg.n_stage, n_expert);
  for (size_t l = 0; l < layers.size(); ++l)
    for (const ExpertTensor* t : {&layers[l].gate, &layers[l].up, &layers[l].down})
      STRATA_REQUIRE(t->data != nullptr, "expert cache: layer {} has no expert weights", l);
  return layers;
}

constexpr double kHysteresis = 0.25;  // a newcomer must be 25% hotter than the expert it replaces
constexpr double kMinGain = 1.0;      // ... and used at least once more (no churn on noise)

}  // namespace

void set_q4_0_experts_x8(bool on) { g_q4_0_x8.set(on ? 1 : 0); }
bool q4_0_experts_x8() { return g_q4_0_x8.get() == 1; }
void set_q6_k_down_padded(bool on) { g_q6_k_p.set(on ? 1 : 0); }
bool q6_k_down_padded() { return g_q6_k_p.get() == 1; }

int64_t ExpertCache::slot_bytes_for(int64_t n_embd, int64_t n_ff, const std::vector<LayerExperts>& layers,
                                    bool exact) {
  STRATA_REQUIRE(n_embd > 0 && n_ff > 0, "expert cache: bad geometry n_embd {} n_ff {}", n_embd, n_ff);
  int64_t b = 0;
  for (size_t l = 0; l < layers.size(); ++l) b = std::max(b, layout_of(n_embd, n_ff, layers[l], int(l), exact).bytes);
  return b;
}

ExpertCache::ExpertCache(Device& dev, Transfer& xfer, int64_t n_embd, int64_t n_ff, int n_expert,
                         std::vector<LayerExperts> layers, const ExpertCacheConfig& cfg,
                         const strata::moe::ExpertUsage* profile)
    : dev_(dev),
      xfer_(xfer),
      n_embd_(n_embd),
      n_ff_(n_ff),
      n_expert_(n_expert),
      layers_(validated(std::move(layers), n_embd, n_ff, n_expert, cfg)),
      cfg_(cfg),
      res_(int(layers_.size()), n_expert, cfg.n_slots),
      scores_(int(layers_.size()), n_expert),
      res_snapshot_(int(layers_.size()), n_expert, cfg.n_slots) {
  const int n_layer = int(layers_.size());
  const int n_slots = res_.n_slots();
  n_stage_ = cfg_.n_stage;
  if (cfg_.max_swaps == 0) cfg_.max_swaps = std::max(1, n_slots / 16);

  // Layouts and the views the kernels get.
  std::vector<Layout> lay;
  for (int l = 0; l < n_layer; ++l) {
    lay.push_back(layout_of(n_embd, n_ff, layers_[size_t(l)], l, cfg_.exact));
    slot_bytes_ = std::max(slot_bytes_, lay.back().bytes);
  }

  // First placement (before the expensive part, so a profile of another model fails fast).
  if (profile != nullptr)
    res_.place_from_profile(*profile);
  else
    res_.place_evenly();

  // Pinned host copy of every expert in slot layout: [n_layer][n_expert][slot_bytes].
  auto host_total = checked_mul(uint64_t(n_layer) * uint64_t(n_expert), uint64_t(slot_bytes_));
  STRATA_REQUIRE(host_total.has_value(), "expert cache: host copy size overflows");
  host_ = dev_.alloc_pinned(size_t(*host_total), "expert cache host copy");
  host_.note_host_access(sc::Access::Write);
  {
    // Layers in parallel: repacking (F16, exact f32) dequantizes every weight.
    std::atomic<int> next{0};
    std::exception_ptr err;
    std::mutex err_mu;
    auto work = [&] {
      std::vector<float> tmp;
      for (int l; (l = next.fetch_add(1)) < n_layer;) {
        try {
          const LayerExperts& le = layers_[size_t(l)];
          const Layout& L = lay[size_t(l)];
          for (int e = 0; e < n_expert; ++e) {
            uint8_t* dst = const_cast<uint8_t*>(host_expert(l, e));
            std::memset(dst, 0, size_t(slot_bytes_));  // padding is deterministic
            convert_expert(le.gate, e, n_ff, n_embd, L.gate, dst + L.gate_off, tmp);
            convert_expert(le.up, e, n_ff, n_embd, L.up, dst + L.up_off, tmp);
            convert_expert(le.down, e, n_embd, n_ff, L.down, dst + L.down_off, tmp);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lk(err_mu);
          if (!err) err = std::current_exception();
        }
      }
    };
    const int n_thr = std::clamp(int(std::thread::hardware_concurrency()), 1, std::min(n_layer, 16));
    std::vector<std::thread> thr;
    for (int i = 1; i < n_thr; ++i) thr.emplace_back(work);
    work();
    for (auto& t : thr) t.join();
    if (err) std::rethrow_exception(err);
  }

  // Device side: slots (each its own checked region) and the table.
  auto dev_total = checked_mul(uint64_t(n_slots + n_stage_), uint64_t(slot_bytes_));
  STRATA_REQUIRE(dev_total.has_value(), "expert cache: slot memory size overflows");
  slots_ = dev_.alloc(size_t(*dev_total), "expert slots (" + std::to_string(n_slots) + " + " +
                                               std::to_string(n_stage_) + " staging, x " +
                                               std::to_string(slot_bytes_) + " bytes)");
  slot_regions_.reserve(size_t(n_slots + n_stage_));
  for (int s = 0; s < n_slots + n_stage_; ++s)
    slot_regions_.push_back(slots_.region(size_t(s) * size_t(slot_bytes_), size_t(slot_bytes_),
                                          s < n_slots ? "expert slot " + std::to_string(s)
                                                      : "expert staging slot " + std::to_string(s - n_slots)));
  table_ = dev_.alloc(size_t(n_layer) * size_t(n_expert) * sizeof(int32_t), "residency table");

  for (int l = 0; l < n_layer; ++l) {
    const Layout& L = lay[size_t(l)];
    moe::ExpertLayerView v;
    v.slots = slots_.as<const uint8_t>();
    v.slot_bytes = slot_bytes_;
    v.expert_bytes = L.bytes;
    v.gate_type = L.gate;
    v.up_type = L.up;
    v.down_type = L.down;
    v.gate_off = L.gate_off;
    v.up_off = L.up_off;
    v.down_off = L.down_off;
    v.n_embd = n_embd;
    v.n_ff = n_ff;
    v.n_expert = n_expert;
    views_.push_back(v);
  }

  for (int32_t s = 0; s < n_slots; ++s) {
    const strata::moe::ExpertId id = res_.owner(s);
    if (id.layer < 0) continue;
    const HostSpan src = host_expert_span(id.layer, id.expert);
    xfer_.upload(slot_regions_[size_t(s)].span(), src, dev_.compute(), {&dev_.compute()});
    stats_.bytes_uploaded += src.bytes;
  }
  upload_table();

  if (cfg_.adapt_every > 0) planner_ = std::thread([this] { planner_loop(); });
}

ExpertCache::~ExpertCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (planner_.joinable()) planner_.join();
  // The DMA of a pending swap reads host_: it must finish before host_ is freed.
  for (const Pending& p : pending_) p.copy.wait();
}

void ExpertCache::upload_table() {
  // Producer = consumer = compute: after every kernel that read the old table, before every one that
  // reads the new one.
  xfer_.upload(table_.span(), res_.table(), size_t(res_.n_layer()) * size_t(n_expert_) * sizeof(int32_t),
               dev_.compute(), {&dev_.compute()});
}

void ExpertCache::start_swaps(const std::vector<strata::moe::Swap>& plan) {
  // Drop what the table made stale since the plan was made (the planner saw a snapshot).
  std::vector<strata::moe::Swap> live;
  auto in_range = [&](const strata::moe::ExpertId& id) {
    return id.layer >= 0 && id.layer < res_.n_layer() && id.expert >= 0 && id.expert < n_expert_;
  };
  for (const strata::moe::Swap& sw : plan) {
    if (!in_range(sw.in) || !in_range(sw.out)) continue;
    if (res_.resident(sw.in.layer, sw.in.expert)) continue;               // already in
    if (sw.slot < 0 || res_.slot(sw.out.layer, sw.out.expert) != sw.slot) continue;  // out moved/left
    bool dup = std::any_of(live.begin(), live.end(),
                           [&](const strata::moe::Swap& o) { return o.in == sw.in || o.slot == sw.slot; });
    bool in_flight = std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) {
      return p.swap.in == sw.in || p.swap.slot == sw.slot;
    });
    if (!dup && !in_flight) live.push_back(sw);
  }
  if (live.empty()) return;
  // Phase 1: evict (host and device table), so no kernel enqueued from now on reads these slots. The
  // table goes first on the copy stream so the compute stream never waits behind the expert copies.
  for (const strata::moe::Swap& sw : live) res_.evict(sw.out);
  upload_table();
  // The new experts' copies: producer = compute, so each starts only after every kernel enqueued so far
  // (the only ones that may still read the old expert from the slot) has finished. No consumer: the
  // compute stream waits on the copy only when the swap is admitted (begin_step).
  for (const strata::moe::Swap& sw : live) {
    const HostSpan src = host_expert_span(sw.in.layer, sw.in.expert);
    Ticket t = xfer_.upload(slot_regions_[size_t(sw.slot)].span(), src, dev_.compute(), {});
    stats_.bytes_uploaded += src.bytes;
    pending_.push_back({sw, std::move(t)});
  }
}

void ExpertCache::begin_step() {
  bool dirty = false;
  if (!pending_.empty()) {
    // Phase 2: once every started copy is done, admit them all (one table upload). They were enqueued
    // together on one copy stream, so they finish together.
    const bool all_done = std::all_of(pending_.begin(), pending_.end(), [](const Pending& p) { return p.copy.done(); });
    if (!all_done) return;
    for (const Pending& p : pending_) {
      res_.admit(p.swap.in, p.swap.slot);
      dev_.compute().wait(p.copy.event());  // kernels reading the slot from now on run after its copy
      ++stats_.swaps;
    }
    pending_.clear();
    dirty = true;
  }
  std::vector<strata::moe::Swap> plan;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (plan_ready_) {
      plan.swap(plan_);
      plan_ready_ = false;
    }
  }
  const size_t before = pending_.size();
  if (!plan.empty()) start_swaps(plan);  // uploads the table itself when it starts anything
  if (dirty && pending_.size() == before) upload_table();
}

void ExpertCache::record(int layer, const int32_t* ids, int64_t n) {
  STRATA_REQUIRE(layer >= 0 && layer < res_.n_layer(), "expert cache: layer {} out of range [0, {})", layer,
                 res_.n_layer());
  STRATA_REQUIRE(n >= 0 && (ids != nullptr || n == 0), "expert cache: bad routing list (n = {})", n);
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    STRATA_REQUIRE(ids[i] >= 0 && ids[i] < n_expert_, "expert cache: expert id {} out of range [0, {})", ids[i],
                   n_expert_);
    hits += res_.resident(layer, ids[i]);
  }
  stats_.hits += hits;
  stats_.misses += n - hits;
  scores_.add(layer, ids, n);  // also without adapt_every: adapt_now() plans on them
}

void ExpertCache::end_step() {
  ++steps_;
  if (cfg_.adapt_every <= 0 || steps_ % cfg_.adapt_every != 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (want_plan_ || plan_ready_) return;  // the last plan is still being made or not yet picked up
  auto s = scores_.scores();
  snapshot_.assign(s.begin(), s.end());
  res_snapshot_ = res_;
  scores_.decay(cfg_.decay);
  want_plan_ = true;
  cv_.notify_one();
}

void ExpertCache::planner_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || want_plan_; });
    if (stop_) return;
    std::vector<double> snap = std::move(snapshot_);
    strata::moe::Residency res = res_snapshot_;
    lk.unlock();
    std::vector<strata::moe::Swap> plan;
    try {
      plan = res.plan(snap, cfg_.max_swaps, kHysteresis, kMinGain);
    } catch (const std::exception&) {
      plan.clear();  // a plan is an optimization: none is always safe
    }
    lk.lock();
    plan_ = std::move(plan);
    plan_ready_ = true;
    want_plan_ = false;
  }
}

void ExpertCache::adapt_now() {
  drain();
  // Synchronous: the same plan the helper thread would make, on the live scores.
  auto plan = res_.plan(scores_.scores(), cfg_.max_swaps, kHysteresis, kMinGain);
  scores_.decay(cfg_.decay);
  start_swaps(plan);
}

void ExpertCache::drain() {
  while (!pending_.empty()) {
    for (const Pending& p : pending_) p.copy.wait();
    begin_step();
  }
}

moe::ExpertLayerView ExpertCache::layer_view(int layer) const {
  STRATA_REQUIRE(layer >= 0 && layer < res_.n_layer(), "expert cache: layer {} out of range [0, {})", layer,
                 res_.n_layer());
  return views_[size_t(layer)];
}

const int32_t* ExpertCache::device_layer_row(int layer) const {
  STRATA_REQUIRE(layer >= 0 && layer < res_.n_layer(), "expert cache: layer {} out of range [0, {})", layer,
                 res_.n_layer());
  return table_.as<const int32_t>() + size_t(layer) * size_t(n_expert_);
}

DevSpan ExpertCache::slot_span(int32_t slot) const {
  STRATA_REQUIRE(slot >= 0 && slot < res_.n_slots() + n_stage_, "expert cache: slot {} out of range [0, {})", slot,
                 res_.n_slots() + n_stage_);
  return slot_regions_[size_t(slot)].span();
}

int32_t ExpertCache::stage(int layer, int expert, int j) {
  STRATA_REQUIRE(j >= 0 && j < n_stage_, "expert cache: staging slot {} out of range [0, {})", j, n_stage_);
  const int32_t slot = int32_t(res_.n_slots() + j);
  const HostSpan src = host_expert_span(layer, expert);
  xfer_.upload(slot_regions_[size_t(slot)].span(), src, dev_.compute(), {&dev_.compute()});
  stats_.bytes_uploaded += src.bytes;
  stats_.bytes_streamed += src.bytes;
  ++stats_.streamed;
  return slot;
}

double ExpertCache::time_stage_copy() {
  const int n = std::min(n_stage_, std::min(n_expert_, 8));
  if (n == 0) return 0;
  Stream& cs = dev_.compute();
  double us = 0;
  for (int round = 0; round < 2; ++round) {  // the first round pays for first-touch costs
    cs.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int j = 0; j < n; ++j)  // (whole slots: the largest layer's experts, the costliest copy)
      xfer_.upload(slot_regions_[size_t(res_.n_slots() + j)].span(), host_slot_span(0, j), cs, {&cs});
    cs.synchronize();
    us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  }
  return us;
}

void ExpertCache::note_row_reads(const Stream& s, const DevSpan& row_buf, const int32_t* row, Site site) const {
  if (!sc::enabled()) return;
  std::vector<sc::BufferId> reads{row_buf.check_id};
  for (int e = 0; e < n_expert_; ++e)
    if (row[e] >= 0) reads.push_back(slot_span(row[e]).check_id);
  sc::global().on_launch(s.check_id(), reads, {}, site);
}

void ExpertCache::note_expert_reads(const Stream& s, int layer, Site site) const {
  if (!sc::enabled()) return;
  STRATA_REQUIRE(layer >= 0 && layer < res_.n_layer(), "expert cache: layer {} out of range [0, {})", layer,
                 res_.n_layer());
  note_row_reads(s, table_.span(), res_.layer_row(layer), site);
}

const uint8_t* ExpertCache::host_expert(int layer, int expert) const {
  STRATA_REQUIRE(layer >= 0 && layer < res_.n_layer() && expert >= 0 && expert < n_expert_,
                 "expert cache: expert ({}, {}) out of range", layer, expert);
  return host_.as<const uint8_t>() + (size_t(layer) * size_t(n_expert_) + size_t(expert)) * size_t(slot_bytes_);
}

moe::ExpertLayerView ExpertCache::direct_view(int layer, int share, int64_t n, int k, bool fetch) const {
  moe::ExpertLayerView v = layer_view(layer);
  v.direct = host_expert(layer, 0);
  v.direct_share = share;
  const int per = strata::moe::direct_count(k, share);
  if (fetch && per > 0 && n > 0 && n * per <= n_stage_) {
    v.stage = static_cast<uint8_t*>(slot_span(res_.n_slots()).ptr);
    v.stage_per_token = per;
  }
  return v;
}

void ExpertCache::note_stage_access(const Stream& s, int count, bool write, Site site) const {
  if (!sc::enabled() || count <= 0) return;
  std::vector<sc::BufferId> ids;
  for (int i = 0; i < count; ++i) ids.push_back(slot_span(res_.n_slots() + i).check_id);
  if (write)
    sc::global().on_launch(s.check_id(), {}, ids, site);
  else
    sc::global().on_launch(s.check_id(), ids, {}, site);
}

HostSpan ExpertCache::host_expert_span(int layer, int expert) const {
  const uint8_t* p = host_expert(layer, expert);  // (validates layer and expert)
  return HostSpan{const_cast<uint8_t*>(p), size_t(views_[size_t(layer)].copy_bytes()), host_.span().check_id, true};
}

HostSpan ExpertCache::host_slot_span(int layer, int expert) const {
  return HostSpan{const_cast<uint8_t*>(host_expert(layer, expert)), size_t(slot_bytes_), host_.span().check_id, true};
}

ExpertCache::Stats ExpertCache::stats() const {
  Stats s = stats_;
  s.slots_used = res_.used_slots();
  s.n_slots = res_.n_slots();
  return s;
}

void ExpertCache::reset_stats() { stats_ = Stats{}; }

}  // namespace strata::cuda
