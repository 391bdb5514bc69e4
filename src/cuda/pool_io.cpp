#include "cuda/pool_io.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/model_common.h"
#include "cuda/ops.cuh"
#include "moe/direct_rule.h"
#include "moe/expert_usage.h"

namespace strata::cuda {

PoolIo::PoolIo(Device& dev, int n_layer_, int32_t n_tok, const HParams& hp, int n_threads)
    : n_layer(n_layer_),
      k_used(hp.n_expert_used),
      moe(n_tok, hp.n_expert_used, hp.n_expert, hp.n_embd, hp.n_ff_exp),
      mb(n_threads, n_tok) {
  const size_t nk = size_t(n_tok) * size_t(hp.n_expert_used), E = size_t(n_tok) * size_t(hp.n_embd);
  const size_t V = size_t(n_tok) * size_t(hp.n_vocab);
  ids = dev.alloc(nk * size_t(n_layer) * 4, "ws.ids");
  wts = dev.alloc(nk * 4, "ws.wts");
  partial = dev.alloc(E * 4, "ws.partial");
  logits = dev.alloc(V * 4, "ws.logits");
  samp_u = dev.alloc(size_t(n_tok) * 4, "ws.samp_u");
  samp_ids = dev.alloc(size_t(n_tok) * 4, "ws.samp_ids");
  samp_parts = dev.alloc(ops::argmax_parts_bytes(n_tok, hp.n_vocab), "ws.samp_parts");
  samp_cand = dev.alloc(ops::sample_scratch_bytes(n_tok, hp.n_vocab), "ws.samp_cand");
  samp_ids_h = dev.alloc_pinned(size_t(n_tok) * 4, "ws.samp_ids_h");
  samp_ban = dev.alloc(size_t(DeviceSampling::kMaxDeviceBans) * 4 + size_t(n_tok), "ws.samp_ban");
  samp_ban_h.resize(samp_ban.bytes());
  samp_rules = dev.alloc(size_t(n_tok) * sizeof(ops::SampleParams), "ws.samp_rules");
  samp_rules_h.resize(size_t(n_tok));
  ids_h = dev.alloc_pinned(nk * size_t(n_layer) * 4, "ws.ids_h");
  wts_h = dev.alloc_pinned(nk * 4, "ws.wts_h");
  xn_h = dev.alloc_pinned(E * 4, "ws.xn_h");
  partial_h = dev.alloc_pinned(E * 4, "ws.partial_h");
  logits_h = dev.alloc_pinned(V * 4, "ws.logits_h");
  const size_t defer_tok = size_t(std::min<int64_t>(n_tok, kMaxDeferTokens));
  for (int b = 0; b < 2; ++b)
    ahead_h[b] = dev.alloc_pinned((size_t(n_layer) * size_t(hp.n_expert_used) + 1) * defer_tok * 4,
                                  b == 0 ? "ws.ahead_h0" : "ws.ahead_h1");
  ids_cpu.resize(nk);
  layer_recorded.resize(size_t(n_layer));
  stage_row = dev.alloc(size_t(hp.n_expert) * 4, "ws.stage_row");
  stage_row_h.resize(size_t(hp.n_expert));
  stage_count.resize(size_t(hp.n_expert));
  stage_order.reserve(size_t(hp.n_expert));
  stage_pairs.reserve(size_t(hp.n_expert));
  gates = std::make_unique<HostGates>(dev, n_layer, "ws.gates");
}

PoolIo::~PoolIo() {
  for (const Deferred& d : deferred)
    if (d.done.valid()) d.done.wait();
}

size_t PoolIo::memory_bytes() const {
  size_t b = moe.memory_bytes();
  for (const DeviceBuffer* d : {&ids, &wts, &partial, &logits, &samp_u, &samp_ids, &samp_parts, &samp_cand, &samp_ban,
                                &samp_rules, &stage_row})
    b += d->bytes();
  for (const PinnedBuffer* p : {&ids_h, &wts_h, &xn_h, &partial_h, &logits_h, &samp_ids_h, &ahead_h[0], &ahead_h[1]})
    b += p->bytes();
  return b;
}

void begin_forward(const PoolCtx& c, PoolIo& io, const DeviceBuffer& step_in, const void* step_host,
                   size_t step_bytes) {
  // Leftovers of a forward pass that threw half-way: its copies must be done before buffers are reused.
  if (io.ids_ticket.valid()) io.ids_ticket.wait(), io.ids_ticket = Ticket();
  if (io.partial_ticket.valid()) io.partial_ticket.wait(), io.partial_ticket = Ticket();
  c.cache.begin_step();  // host and device tables fixed from here to end_step()
  ++c.work.forwards;
  // All inputs of the pass in one copy (producer = consumer = compute: after the previous pass's readers,
  // before every kernel of this one).
  c.xfer.upload(head(step_in, step_bytes), step_host, step_bytes, c.cs, {&c.cs});
  ++c.work.transfers;
  std::fill(io.layer_recorded.begin(), io.layer_recorded.end(), uint8_t(0));
}

PoolDownloads pool_download(const PoolCtx& c, PoolIo& io, const DeviceBuffer& xn, int il, int64_t n,
                            int64_t n_embd) {
  // ids of this layer go to its own slice of ids_h; the host waits for them before it enqueues the
  // next layer's router (which writes another slice of the same device buffer).
  const size_t nk = size_t(n) * size_t(io.k_used), ib = nk * 4, ioff = size_t(il) * ib;
  PoolDownloads d;
  // Through mapped pinned memory by a copy kernel on the compute stream (Transfer::download_mapped: no
  // copy-stream hop on the layer's critical path), or the copy stream where the device cannot.
  d.done = c.xfer.download_mapped({{slice(io.ids_h, ioff, ib), slice(io.ids, ioff, ib)},
                                   {head(io.wts_h, nk * 4), head(io.wts, nk * 4)},
                                   {head(io.xn_h, size_t(n * n_embd) * 4), head(xn, size_t(n * n_embd) * 4)}},
                                  c.cs);
  ++c.work.transfers;
  return d;
}

namespace {
// After the host waited for layer il's downloads: records its routing and splits its pairs (pool_split).
// With direct_share > 0 the pairs the GPU's kernels read directly (moe/direct_rule.h, the same rule on
// the same ids and table) leave the CPU's share too.
int64_t split_pairs(const PoolCtx& c, PoolIo& io, int il, int64_t n, int n_expert, strata::moe::ExpertUsage* usage,
                    int direct_share = 0) {
  io.ids_h.note_host_access(strata::stream_check::Access::Read);
  io.wts_h.note_host_access(strata::stream_check::Access::Read);
  io.xn_h.note_host_access(strata::stream_check::Access::Read);
  const int64_t nk = n * io.k_used;
  const int32_t* hid = io.ids_h.as<const int32_t>() + size_t(il) * size_t(nk);
  const int32_t* row = c.cache.residency().layer_row(il);
  int64_t n_cpu = 0, n_direct = 0;
  for (int64_t i = 0; i < nk; ++i)
    STRATA_REQUIRE(hid[i] >= 0 && hid[i] < n_expert, "cuda: router of layer {} gave expert id {}", il, hid[i]);
  const int k = io.k_used;
  for (int64_t i = 0; i < nk; ++i) {
    const int64_t t0 = i - i % k;
    const bool direct = strata::moe::pair_is_direct(hid + t0, row, k, int(i - t0), direct_share);
    const bool on_gpu = row[hid[i]] >= 0 || direct;
    io.ids_cpu[size_t(i)] = on_gpu ? -1 : hid[i];
    n_cpu += !on_gpu;
    n_direct += direct;
  }
  c.work.direct_pairs += uint64_t(n_direct);
  if (n_direct > 0) c.work.direct_bytes += uint64_t(n_direct) * uint64_t(c.cache.layer_view(il).copy_bytes());
  c.cache.record(il, hid, nk);
  if (usage) usage->add(il, hid, n);
  io.layer_recorded[size_t(il)] = 1;
  return n_cpu;
}

// The CPU's pairs into io.partial_h; returns the time taken.
std::chrono::steady_clock::duration compute_partial(const PoolCtx& c, PoolIo& io, const ExpertWeights& experts,
                                                    int64_t n, ThreadPool& pool, MatmulMode mode) {
  io.partial_h.note_host_access(strata::stream_check::Access::Write);
  const auto t0 = std::chrono::steady_clock::now();
  moe_experts(experts, io.xn_h.as<const float>(), n, io.ids_cpu.data(), io.wts_h.as<const float>(), io.k_used,
              io.partial_h.as<float>(), io.moe, io.mb, pool, mode);
  const auto took = std::chrono::steady_clock::now() - t0;
  c.work.pool += took;
  return took;
}
}  // namespace

int64_t pool_split(const PoolCtx& c, PoolIo& io, const PoolDownloads& d, int il, int64_t n, int n_expert,
                   strata::moe::ExpertUsage* usage, int direct_share) {
  const auto t0 = std::chrono::steady_clock::now();
  d.done.wait();
  c.work.route_wait += std::chrono::steady_clock::now() - t0;
  return split_pairs(c, io, il, n, n_expert, usage, direct_share);
}

double pool_compute(const PoolCtx& c, PoolIo& io, const ExpertWeights& experts, int64_t n, int64_t n_embd,
                    ThreadPool& pool, MatmulMode mode) {
  if (io.partial_ticket.valid()) io.partial_ticket.wait();  // the previous upload has read partial_h
  const auto took = compute_partial(c, io, experts, n, pool, mode);
  const size_t bytes = size_t(n * n_embd) * 4;
  // The partial sum up by a copy kernel on the compute stream, which reads it in place (upload_mapped).
  io.partial_ticket = c.xfer.upload_mapped(head(io.partial, bytes), head(io.partial_h, bytes), c.cs);
  ++c.work.transfers;
  return std::chrono::duration<double, std::micro>(took).count();
}

bool gated_passes_enabled_by_env() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_GATED");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool direct_fetch_enabled_by_env() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_DIRECT_FETCH");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return on;
}

moe::ExpertLayerView experts_view(const PoolCtx& c, int il, int share, int64_t n, int k, const int32_t* table,
                                  const int32_t* ids, bool launch) {
  if (share <= 0) return c.cache.layer_view(il);
  const moe::ExpertLayerView v = c.cache.direct_view(il, share, n, k, direct_fetch_enabled_by_env());
  if (v.stage != nullptr) {
    const int count = int(n) * v.stage_per_token;
    c.cache.note_stage_access(c.cs, count, /*write=*/true);
    if (launch) {
      moe::moe_direct_fetch(v, table, ids, n, k, c.cs.handle());
      ++c.work.op_calls;
    }
    c.cache.note_stage_access(c.cs, count, /*write=*/false);  // the expert kernels that follow
  }
  return v;
}

bool pool_fits_gated(const PoolIo& io, const Transfer& xfer, int64_t n, int64_t n_embd) {
  const size_t down = size_t(n) * size_t(io.k_used) * 8 + size_t(n * n_embd) * 4, up = size_t(n * n_embd) * 4;
  return Transfer::takes_mapped_route(xfer.mapped(), down) && Transfer::takes_mapped_route(xfer.mapped(), up);
}

void pool_download_signaled(const PoolCtx& c, PoolIo& io, const DeviceBuffer& xn, int il, int64_t n, int64_t n_embd,
                            bool enqueue) {
  const size_t nk = size_t(n) * size_t(io.k_used), ib = nk * 4, ioff = size_t(il) * ib;
  c.xfer.download_signaled({{slice(io.ids_h, ioff, ib), slice(io.ids, ioff, ib)},
                            {head(io.wts_h, nk * 4), head(io.wts, nk * 4)},
                            {head(io.xn_h, size_t(n * n_embd) * 4), head(xn, size_t(n * n_embd) * 4)}},
                           c.cs, *io.gates, il, enqueue);
  if (!enqueue) ++c.work.transfers;
}

void pool_add_gated(const PoolCtx& c, PoolIo& io, const DeviceBuffer& x, int il, int64_t n, int64_t n_embd,
                    bool enqueue) {
  const size_t bytes = size_t(n * n_embd) * 4;
  c.xfer.upload_gated(head(x, bytes), head(io.partial_h, bytes), c.cs, *io.gates, il, enqueue,
                      Transfer::GatedWrite::AddF32);
  if (!enqueue) ++c.work.transfers;
}

std::vector<uint8_t> gated_layer_kinds(const strata::moe::Residency& res, int n_layer, int n_expert,
                                       std::vector<int>* pool_layers) {
  std::vector<uint8_t> kinds(static_cast<size_t>(n_layer), 0);
  pool_layers->clear();
  for (int il = 0; il < n_layer; ++il) {
    const int n_res = res.resident_in_layer(il);
    kinds[size_t(il)] = n_res == n_expert ? 0 : n_res > 0 ? 1 : 2;
    if (kinds[size_t(il)] != 0) pool_layers->push_back(il);
  }
  return kinds;
}

GatedPiece gated_piece_layers(const std::vector<int>& pl, size_t k, int n_layer) {
  STRATA_REQUIRE(k <= pl.size(), "gated pass: piece {} of {}", k, pl.size() + 1);
  const int after = k > 0 ? pl[k - 1] : -1;
  const int pool = k < pl.size() ? pl[k] : -1;
  return GatedPiece{after, after + 1, pool >= 0 ? pool : n_layer, pool};
}

void run_gated_host(const PoolCtx& c, PoolIo& io, const GatedHost& g, ThreadPool& pool, MatmulMode mode,
                    strata::moe::ExpertUsage* usage) {
  try {
    g.release(0);  // released by the launch
    for (size_t k = 0; k < g.pool_layers.size(); ++k) {
      const int il = g.pool_layers[k];
      const auto t0 = std::chrono::steady_clock::now();
      io.gates->wait_signal(il, c.cs);
      c.work.route_wait += std::chrono::steady_clock::now() - t0;
      if (split_pairs(c, io, il, g.n, g.n_expert, usage, g.direct_share) > 0) {
        compute_partial(c, io, g.experts(il), g.n, pool, mode);
      } else {  // every pair on the GPU this time
        io.partial_h.note_host_access(strata::stream_check::Access::Write);
        std::memset(io.partial_h.data(), 0, size_t(g.n * g.n_embd) * 4);
      }
      io.gates->open(il);
      g.release(k + 1);  // released by the gate
    }
  } catch (...) {
    io.gates->abort_rest();
    c.cs.synchronize();
    throw;
  }
}

int staging_slots(int stream_slots, int n_slots, int total, int n_expert) {
  STRATA_REQUIRE(stream_slots >= -1, "stream slots must be >= -1 (-1: auto), got {}", stream_slots);
  if (stream_slots < 0) return n_slots < total ? n_expert : 0;
  return std::min(stream_slots, n_expert);
}

int stream_min_pairs_from_env() {
  const char* e = std::getenv("STRATA_CUDA_STREAM_MIN_TOKENS");
  if (e == nullptr) return 4;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  STRATA_REQUIRE(end != e && *end == '\0' && v >= 1 && v <= 1 << 20,
                 "STRATA_CUDA_STREAM_MIN_TOKENS must be a whole number >= 1, got '{}'", e);
  return int(v);
}

int stream_candidates(PoolIo& io, int64_t n, int n_expert, int min_pairs, int max_stage) {
  const int64_t nk = n * io.k_used;
  std::fill(io.stage_count.begin(), io.stage_count.begin() + n_expert, 0);
  for (int64_t i = 0; i < nk; ++i)
    if (io.ids_cpu[size_t(i)] >= 0) ++io.stage_count[size_t(io.ids_cpu[size_t(i)])];
  io.stage_order.clear();
  int misses = 0;
  for (int e = 0; e < n_expert; ++e) {
    misses += io.stage_count[size_t(e)] > 0;
    if (io.stage_count[size_t(e)] >= min_pairs) io.stage_order.push_back(e);
  }
  const auto& cnt = io.stage_count;
  std::sort(io.stage_order.begin(), io.stage_order.end(), [&](int32_t a, int32_t b) {
    return cnt[size_t(a)] > cnt[size_t(b)] || (cnt[size_t(a)] == cnt[size_t(b)] && a < b);
  });
  if (io.stage_order.size() > size_t(std::max(max_stage, 0))) io.stage_order.resize(size_t(std::max(max_stage, 0)));
  return misses;
}

void balance_prefill_candidates(PoolIo& io, int n_expert, const strata::moe::PrefillStreamCosts& costs) {
  std::vector<int32_t>& pairs = io.stage_pairs;
  pairs.clear();
  int64_t others = 0;  // the CPU pairs of experts that are not candidates
  for (int e = 0; e < n_expert; ++e) others += io.stage_count[size_t(e)];
  for (int32_t e : io.stage_order) pairs.push_back(io.stage_count[size_t(e)]), others -= pairs.back();
  io.stage_order.resize(size_t(strata::moe::prefill_stream_count(pairs, others, costs)));
}

int64_t stage_experts(const PoolCtx& c, PoolIo& io, int il, int64_t n, int n_expert, bool keep_resident) {
  STRATA_REQUIRE(!io.stage_order.empty() && int(io.stage_order.size()) <= c.cache.n_stage(),
                 "stage_experts: {} experts for {} staging slots", io.stage_order.size(), c.cache.n_stage());
  if (keep_resident) {
    const int32_t* row = c.cache.residency().layer_row(il);
    std::copy(row, row + n_expert, io.stage_row_h.begin());
  } else {
    std::fill(io.stage_row_h.begin(), io.stage_row_h.begin() + n_expert, -1);
  }
  for (size_t j = 0; j < io.stage_order.size(); ++j)
    io.stage_row_h[size_t(io.stage_order[j])] = c.cache.stage(il, io.stage_order[j], int(j));
  c.xfer.upload(io.stage_row.span(), io.stage_row_h.data(), size_t(n_expert) * 4, c.cs, {&c.cs});
  c.work.transfers += 1 + io.stage_order.size();
  int64_t moved = 0;
  const int64_t nk = n * io.k_used;
  for (int64_t i = 0; i < nk; ++i) {
    const int32_t e = io.ids_cpu[size_t(i)];
    if (e >= 0 && io.stage_row_h[size_t(e)] >= 0) io.ids_cpu[size_t(i)] = -1, ++moved;
  }
  return moved;
}

void check_logits_target(const PoolIo& io, const float* logits, int64_t n_out, int64_t n_vocab,
                         const DeviceSampling* sampling) {
  if (n_out <= 0 || sampling != nullptr) return;
  STRATA_REQUIRE(logits != nullptr, "forward: {} rows want logits but the logits argument is null", n_out);
  const uintptr_t at = reinterpret_cast<uintptr_t>(io.logits_h.data()), dst = reinterpret_cast<uintptr_t>(logits);
  const uintptr_t bytes = uintptr_t(n_out) * uintptr_t(n_vocab) * sizeof(float);
  STRATA_REQUIRE(dst == at || dst + bytes <= at || dst >= at + io.logits_h.bytes(),
                 "forward: the logits argument points into the workspace's logits buffer, not at its start");
}

// The rows of a device-sampled pass that must never pick some tokens (DeviceSampling::ban): their logits set
// to -inf on the device before the pick, as the CPU path edits its copy (cpu::ban_tokens). Nothing when no
// row asks.
static void apply_bans(const PoolCtx& c, PoolIo& io, int64_t n_out, int64_t n_vocab, const DeviceSampling& s) {
  if (s.n_ban <= 0 || s.ban_rows == nullptr) return;
  if (std::none_of(s.ban_rows, s.ban_rows + n_out, [](uint8_t r) { return r != 0; })) return;
  STRATA_REQUIRE(s.n_ban <= DeviceSampling::kMaxDeviceBans && s.ban != nullptr,
                 "device sampling: {} banned ids (at most {})", s.n_ban, DeviceSampling::kMaxDeviceBans);
  const size_t ids_at = 0, rows_at = size_t(DeviceSampling::kMaxDeviceBans) * 4;
  std::memcpy(io.samp_ban_h.data() + ids_at, s.ban, size_t(s.n_ban) * 4);
  std::memcpy(io.samp_ban_h.data() + rows_at, s.ban_rows, size_t(n_out));
  c.xfer.upload(head(io.samp_ban, rows_at + size_t(n_out)), io.samp_ban_h.data(), rows_at + size_t(n_out), c.cs,
                {&c.cs});
  note_launch(c.cs, {io.samp_ban.span()}, {io.logits.span()});
  const auto* base = io.samp_ban.as<const unsigned char>();
  ops::ban_tokens(io.logits.as<float>(), n_out, n_vocab, reinterpret_cast<const int32_t*>(base + ids_at), s.n_ban,
                  base + rows_at, c.cs.handle());
  ++c.work.op_calls;
  ++c.work.transfers;
}

namespace {

// The sampler's scratch (null where the workspace has none: a vocabulary too long for the prefilter).
void* cand_scratch(PoolIo& io) { return io.samp_cand.bytes() > 0 ? io.samp_cand.data() : nullptr; }

// The device pick of n_out rows of io.logits into io.samp_ids (ops::sample on the compute stream, after the
// draws, bans and rules go up). Why on the device: the pick needs one pass over each row; copying the rows
// (600 KB a row at a 152k vocabulary) and sampling on the CPU costs more than the kernel.
void launch_sampler(const PoolCtx& c, PoolIo& io, int64_t n_out, int64_t n_vocab, const DeviceSampling& sampling) {
  const DeviceSampling* s = &sampling;
  // Greedy picks (one rule, temperature <= 0) by many blocks a row (ops::argmax_wide: the same ids as the
  // sampler's greedy branch, whose one block a row cost ~50 us a step on an H100 at a 152k vocabulary,
  // session 45), without the draws; on by default since session 46 (H100 tg64 with device picks: 602.3 tok/s
  // against 595.4 with the one block, the GPU suite passing with it). STRATA_CUDA_WIDE_ARGMAX=0 turns it off.
  static const bool wide = env_digit("STRATA_CUDA_WIDE_ARGMAX", 0, 1, 1) == 1;
  if (wide && !s->rules && s->temperature <= 0.0f) {
    apply_bans(c, io, n_out, n_vocab, *s);
    note_launch(c.cs, {io.logits.span()}, {io.samp_parts.span(), io.samp_ids.span()});
    ops::argmax_wide(io.logits.as<const float>(), n_out, n_vocab, io.samp_parts.as<uint64_t>(),
                     io.samp_ids.as<int32_t>(), c.cs.handle());
    ++c.work.op_calls;
    io.pick_rows = n_out;
    return;
  }
  const size_t ub = size_t(n_out) * 4;
  c.xfer.upload(head(io.samp_u, ub), s->u, ub, c.cs, {&c.cs});
  ++c.work.transfers;
  apply_bans(c, io, n_out, n_vocab, *s);
  if (s->rules) {  // a rule per row, checked here (the kernel reads them from device memory)
    for (int64_t r = 0; r < n_out; ++r) {
      const DeviceSampling::Rule& q = s->rules[r];
      io.samp_rules_h[size_t(r)] = ops::SampleParams{q.temperature, q.top_k, q.top_p, q.min_p};
      ops::check_sample_params(io.samp_rules_h[size_t(r)]);
    }
    const size_t rb = size_t(n_out) * sizeof(ops::SampleParams);
    c.xfer.upload(head(io.samp_rules, rb), io.samp_rules_h.data(), rb, c.cs, {&c.cs});
    ++c.work.transfers;
    note_launch(c.cs, {io.logits.span(), io.samp_u.span(), io.samp_rules.span()},
                {io.samp_cand.span(), io.samp_ids.span()});
    ops::sample_rows(io.logits.as<const float>(), n_out, n_vocab, io.samp_rules.as<const ops::SampleParams>(),
                     io.samp_u.as<const float>(), cand_scratch(io), io.samp_ids.as<int32_t>(), c.cs.handle());
  } else {
    note_launch(c.cs, {io.logits.span(), io.samp_u.span()}, {io.samp_cand.span(), io.samp_ids.span()});
    ops::sample(io.logits.as<const float>(), n_out, n_vocab,
                ops::SampleParams{s->temperature, s->top_k, s->top_p, s->min_p}, io.samp_u.as<const float>(),
                cand_scratch(io), io.samp_ids.as<int32_t>(), c.cs.handle());
  }
  ++c.work.op_calls;
  io.pick_rows = n_out;
}

}  // namespace

void finish_forward(const PoolCtx& c, PoolIo& io, int64_t n, int64_t n_out, int64_t n_vocab, float* logits,
                    const DeviceSampling* sampling, strata::moe::ExpertUsage* usage,
                    std::chrono::steady_clock::time_point t_start) {
  // Routing of the fully resident layers: one download of every layer's ids (the CPU pool's layers'
  // slices come along unchanged), read after the end-of-forward wait.
  const int64_t nk = n * io.k_used;
  const bool any_unrecorded =
      std::any_of(io.layer_recorded.begin(), io.layer_recorded.end(), [](uint8_t r) { return r == 0; });
  if (any_unrecorded) {
    const size_t ib = size_t(io.n_layer) * size_t(nk) * 4;
    io.ids_ticket = c.xfer.download(head(io.ids_h, ib), head(io.ids, ib), c.cs);
    ++c.work.transfers;
  }
  const auto t_wait = std::chrono::steady_clock::now();
  if (n_out > 0 && sampling) {
    const size_t ub = size_t(n_out) * 4;
    launch_sampler(c, io, n_out, n_vocab, *sampling);
    c.xfer.download(head(io.samp_ids_h, ub), head(io.samp_ids, ub), c.cs).wait();
    ++c.work.transfers;
    io.samp_ids_h.note_host_access(strata::stream_check::Access::Read);
    std::memcpy(sampling->out, io.samp_ids_h.data(), ub);
  } else if (n_out > 0) {
    io.pick_rows = 0;
    const size_t lb = size_t(n_out) * size_t(n_vocab) * 4;
    c.xfer.download(head(io.logits_h, lb), head(io.logits, lb), c.cs).wait();
    ++c.work.transfers;
    io.logits_h.note_host_access(strata::stream_check::Access::Read);
    // Logits at logits_h itself (Model::logits_in_place) are already where the caller reads them.
    if (static_cast<void*>(logits) != io.logits_h.data()) std::memcpy(logits, io.logits_h.data(), lb);
  } else {
    io.pick_rows = 0;
    c.cs.synchronize();
  }
  const auto t_waited = std::chrono::steady_clock::now();
  if (io.ids_ticket.valid()) {
    io.ids_ticket.wait();
    io.ids_ticket = Ticket();
    io.ids_h.note_host_access(strata::stream_check::Access::Read);
    for (int il = 0; il < io.n_layer; ++il) {
      if (io.layer_recorded[size_t(il)]) continue;
      const int32_t* hid = io.ids_h.as<const int32_t>() + size_t(il) * size_t(nk);
      c.cache.record(il, hid, nk);
      if (usage) usage->add(il, hid, n);
    }
  }
  if (io.partial_ticket.valid()) {
    io.partial_ticket.wait();
    io.partial_ticket = Ticket();
  }
  c.cache.end_step();
  c.work.wait += t_waited - t_wait;
  c.work.host += (t_wait - t_start) + (std::chrono::steady_clock::now() - t_waited);
}

bool can_defer(const PoolIo& io, int64_t n, int64_t n_out, const DeviceSampling* sampling) {
  return sampling != nullptr && n >= 1 && n_out == n && n <= kMaxDeferTokens && io.deferred.size() < 2;
}

void finish_forward_deferred(const PoolCtx& c, PoolIo& io, int64_t n, int64_t n_vocab, const DeviceSampling& sampling,
                             strata::moe::ExpertUsage* usage, std::chrono::steady_clock::time_point t_start) {
  STRATA_REQUIRE(can_defer(io, n, n, &sampling), "forward: a pass of {} tokens cannot be left pending ({} pending)", n,
                 io.deferred.size());
  launch_sampler(c, io, n, n_vocab, sampling);
  // Its routing and its picks into its own ahead_h, by one copy kernel after the sampler (the compute
  // stream's order: before the next pass rewrites ids or samp_ids).
  const int b = io.next_ahead;
  io.next_ahead ^= 1;
  const size_t ib = size_t(io.n_layer) * size_t(n) * size_t(io.k_used) * 4, pb = size_t(n) * 4;
  PinnedBuffer& dst = io.ahead_h[b];
  Ticket done = c.xfer.download_mapped(
      {{slice(dst, 0, ib), head(io.ids, ib)}, {slice(dst, ib, pb), head(io.samp_ids, pb)}}, c.cs);
  ++c.work.transfers;
  io.deferred.push_back({std::move(done), b, n, n, sampling.out, usage, t_start});
  c.work.host += std::chrono::steady_clock::now() - t_start;
}

void finish_deferred(const PoolCtx& c, PoolIo& io) {
  if (io.deferred.empty()) return;
  const PoolIo::Deferred d = io.deferred.front();
  io.deferred.pop_front();
  const auto t_wait = std::chrono::steady_clock::now();
  d.done.wait();
  const auto t_waited = std::chrono::steady_clock::now();
  const PinnedBuffer& src = io.ahead_h[d.buf];
  src.note_host_access(strata::stream_check::Access::Read);
  const int64_t nk = d.n * io.k_used;
  const int32_t* ids = src.as<const int32_t>();
  std::memcpy(d.out, ids + size_t(io.n_layer) * size_t(nk), size_t(d.n_out) * 4);
  for (int il = 0; il < io.n_layer; ++il) {
    const int32_t* hid = ids + size_t(il) * size_t(nk);
    c.cache.record(il, hid, nk);
    if (d.usage) d.usage->add(il, hid, d.n);
  }
  c.cache.end_step();
  c.work.wait += t_waited - t_wait;
  c.work.host += std::chrono::steady_clock::now() - t_waited;
}

void check_chain(const PoolIo& io, int64_t n) {
  STRATA_REQUIRE(n >= 1 && io.pick_rows == n,
                 "forward: a chained pass of {} tokens needs the previous pass's {} device picks ({} there)", n, n,
                 io.pick_rows);
}

void chain_tokens(const PoolCtx& c, PoolIo& io, const DevSpan& step_in, size_t tokens_offset, int64_t n) {
  check_chain(io, n);
  STRATA_REQUIRE(tokens_offset + size_t(n) * 4 <= step_in.bytes, "forward: chained tokens outside the step inputs");
  note_launch(c.cs, {io.samp_ids.span()}, {step_in});
  ops::copy_i32(reinterpret_cast<int32_t*>(static_cast<char*>(step_in.ptr) + tokens_offset),
                io.samp_ids.as<const int32_t>(), n, c.cs.handle());
  ++c.work.op_calls;
}

HostWork HostWork::starting_now(const Transfer& xfer) {
  HostWork w;
  w.h2d_base = xfer.bytes_h2d();
  w.d2h_base = xfer.bytes_d2h();
  return w;
}

ExpertCacheReport make_cache_report(const ExpertCache& cache, const Transfer& xfer, int n_layer, int n_expert,
                                    bool graphs, const HostWork& work) {
  const ExpertCache::Stats s = cache.stats();
  ExpertCacheReport r;
  r.present = true;
  r.hits = s.hits;
  r.misses = s.misses;
  r.swaps = s.swaps;
  r.streamed = s.streamed;
  r.direct = int64_t(work.direct_pairs);
  r.direct_bytes = work.direct_bytes;
  r.streamed_bytes = s.bytes_streamed;
  r.slots_used = s.slots_used;
  r.n_slots = s.n_slots;
  r.n_experts_total = n_layer * n_expert;
  r.bytes_h2d = xfer.bytes_h2d() - work.h2d_base;
  r.bytes_d2h = xfer.bytes_d2h() - work.d2h_base;
  r.slot_bytes = uint64_t(cache.slot_bytes());
  r.graphs_enabled = graphs;
  r.forwards = int64_t(work.forwards);
  r.graph_forwards = int64_t(work.graph_forwards);
  r.graph_captures = int64_t(work.captures);
  r.gated_forwards = int64_t(work.gated_forwards);
  r.op_calls = int64_t(work.op_calls);
  r.transfers = int64_t(work.transfers);
  r.predicted = int64_t(work.predicted);
  r.predict_hits = int64_t(work.predict_hits);
  r.host_s = std::chrono::duration<double>(work.host).count();
  r.wait_s = std::chrono::duration<double>(work.wait).count();
  r.pool_s = std::chrono::duration<double>(work.pool).count();
  r.route_wait_s = std::chrono::duration<double>(work.route_wait).count();
  return r;
}

}  // namespace strata::cuda
