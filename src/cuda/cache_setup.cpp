#include "cuda/cache_setup.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "cuda/host/slot_spec.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/pool_io.h"
#include "moe/direct_rule.h"
#include "moe/expert_usage.h"
#include "moe/residency.h"

namespace strata::cuda {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

// --expert-profile: the usage counts of `strata profile`, shaped for this model (null without one).
std::unique_ptr<strata::moe::ExpertUsage> read_profile(const std::string& path, int n_layer, int n_expert) {
  if (path.empty()) return nullptr;
  std::ifstream f(path, std::ios::binary);
  STRATA_REQUIRE(f.good(), "--expert-profile {}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto profile = std::make_unique<strata::moe::ExpertUsage>(strata::moe::ExpertUsage::from_json(ss.str()));
  STRATA_REQUIRE(profile->n_layer() == n_layer && profile->n_expert() == n_expert,
                 "--expert-profile {}: made for {} layers x {} experts, the model has {} x {}", path,
                 profile->n_layer(), profile->n_expert(), n_layer, n_expert);
  return profile;
}
}  // namespace

MadeCache make_expert_cache(Device& dev, Transfer& xfer, const CudaOptions& opt, CacheGeometry g) {
  STRATA_REQUIRE(opt.vram_reserve_mib >= 0, "--vram-reserve-mib must be >= 0, got {}", opt.vram_reserve_mib);
  STRATA_REQUIRE(opt.vram_budget_gib >= 0, "--vram-budget must be >= 0 GiB, got {}", opt.vram_budget_gib);
  STRATA_REQUIRE(opt.adapt_every >= 0, "--adapt-every must be >= 0, got {}", opt.adapt_every);
  const int total = g.n_layer * g.n_expert;
  const int64_t slot_bytes = ExpertCache::slot_bytes_for(g.n_embd, g.n_ff, g.layers, opt.exact);
  const int64_t reserve = opt.vram_reserve_mib * (int64_t(1) << 20);
  int64_t budget = int64_t(g.free_bytes);
  if (opt.vram_budget_gib > 0) budget = std::min<int64_t>(budget, int64_t(opt.vram_budget_gib * kGiB) - g.dense_bytes);
  const auto slots_for = [&](int64_t staging_bytes) {
    return opt.expert_cache == "auto"
               ? strata::moe::auto_expert_slots(size_t(std::max<int64_t>(budget, 0)), size_t(reserve),
                                                size_t(g.kv_bytes + g.ws_bytes + int64_t(total) * 4 + staging_bytes),
                                                slot_bytes, total)
               : expert_slots_from_spec(opt.expert_cache, total, slot_bytes, 0);
  };
  int n_slots = slots_for(0);
  // Staging slots for prefill streaming: by default one layer's experts, when some are not resident
  // (auto sizing then leaves room for them).
  const int n_stage = staging_slots(opt.stream_slots, n_slots, total, g.n_expert);
  if (opt.stream_slots < 0 && n_stage > 0) n_slots = slots_for(int64_t(n_stage) * slot_bytes);
  MadeCache made;
  made.stream_min_pairs = stream_min_pairs_from_env();
  made.prefill_stream = strata::moe::PrefillStreamMode::parse(opt.prefill_stream, "--prefill-stream");
  made.decode_stream = strata::moe::DecodeStreamMode::parse(opt.decode_stream, "--decode-stream");
  made.direct_share = strata::moe::parse_direct_share(opt.decode_direct, "--decode-direct");
  const DeviceInfo& info = dev.info();
  std::fprintf(stderr, "strata: cuda: %s (%.1f GiB), %sdense weights %.2f GiB; expert cache %d/%d slots of %.2f MiB (%.2f GiB)",
               info.name.c_str(), double(info.total_bytes) / kGiB, g.model.c_str(), double(g.dense_bytes) / kGiB,
               n_slots, total, double(slot_bytes) / kMiB, double(slot_bytes) * n_slots / kGiB);
  if (opt.expert_cache == "auto")
    std::fprintf(stderr, " = what fits in %.2f GiB after %s %.2f GiB (%d x %d tokens), workspace %.2f GiB, reserve %.2f GiB",
                 double(budget) / kGiB, g.kv_what.c_str(), double(g.kv_bytes) / kGiB, std::max(opt.kv_sequences, 1),
                 std::max(opt.n_ctx, 1), double(g.ws_bytes) / kGiB, double(reserve) / kGiB);
  std::fprintf(stderr, "\n");

  const std::unique_ptr<strata::moe::ExpertUsage> profile = read_profile(opt.expert_profile, g.n_layer, g.n_expert);
  ExpertCacheConfig cfg;
  cfg.n_slots = n_slots;
  cfg.exact = opt.exact;
  cfg.adapt_every = opt.adapt_every;
  cfg.n_stage = n_stage;
  made.cache = std::make_unique<ExpertCache>(dev, xfer, g.n_embd, g.n_ff, g.n_expert, std::move(g.layers), cfg,
                                             profile.get());
  std::fprintf(stderr, "strata: cuda: %s\n", made.cache->residency().summary().c_str());
  if (made.direct_share > 0 && n_slots < total) {
    if (opt.exact) {
      std::fprintf(stderr, "strata: cuda: --decode-direct %s is off in the exact mode (f32 experts)\n",
                   opt.decode_direct.c_str());
      made.direct_share = 0;
    } else if (!xfer.mapped()) {
      std::fprintf(stderr, "strata: cuda: --decode-direct %s is off: kernels cannot read pinned host memory here "
                   "(no unified addressing, or STRATA_CUDA_MAPPED_IO=0)\n", opt.decode_direct.c_str());
      made.direct_share = 0;
    } else {
      std::fprintf(stderr, "strata: cuda: direct reads: passes of < %lld tokens read %s of each token's "
                   "non-resident experts from pinned host memory over PCIe; the CPU pool runs the rest\n",
                   (long long)moe::kMoeGroupedMinTokens, strata::moe::direct_share_str(made.direct_share).c_str());
    }
  }
  if (n_stage > 0) {
    const bool balance = made.prefill_stream.kind == strata::moe::PrefillStreamMode::Auto;
    std::fprintf(stderr,
                 "strata: cuda: prefill streaming: %d staging slots (%.2f GiB); passes of >= %lld tokens copy the "
                 "non-resident experts with >= %d of their pairs to the GPU%s\n",
                 n_stage, double(slot_bytes) * n_stage / kGiB, (long long)moe::kMoeGroupedMinTokens,
                 made.stream_min_pairs, balance ? ", the busiest first, as many as balance the CPU pool (auto)" : "");
    if (balance || made.decode_stream.kind != strata::moe::DecodeStreamMode::Off)
      made.copy_us = made.cache->time_stage_copy();
  }
  return made;
}

void print_dense_repacks(const RepackLog& log, bool exact) {
  if (exact)
    std::fprintf(stderr, "strata: cuda: exact mode: %d dense tensors dequantized to F32 on the CPU (%.1f MiB in the "
                 "file -> %.1f MiB on the GPU)\n", log.n, log.file_bytes / kMiB, log.gpu_bytes / kMiB);
  else if (log.n > 0)
    std::fprintf(stderr, "strata: cuda: repacked %d dense tensors without a GPU kernel (%s): %.1f MiB in the file -> "
                 "%.1f MiB on the GPU\n", log.n, log.types.c_str(), log.file_bytes / kMiB, log.gpu_bytes / kMiB);
}

}  // namespace strata::cuda
