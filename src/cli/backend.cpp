// load_model_for: the one place the CLI picks a backend.
#include <cstdio>

#include "cli/engine_flags.h"
#ifdef STRATA_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace strata::cli {

std::shared_ptr<const Model> load_model_for(const EngineFlags& ef) {
  if (ef.backend == "cpu") return load_model(ef.model);
  STRATA_REQUIRE(ef.backend == "cuda", "--backend must be cpu or cuda, got '{}'", ef.backend);
#ifdef STRATA_HAVE_CUDA
  cuda::CudaOptions co;
  co.gpu = ef.gpu;
  co.expert_cache = ef.expert_cache;
  co.vram_budget_gib = ef.vram_budget_gib;
  co.vram_reserve_mib = ef.vram_reserve_mib;
  co.expert_profile = ef.expert_profile;
  co.adapt_every = ef.adapt_every;
  co.stream_slots = ef.stream_slots;
  co.decode_stream = ef.decode_stream;
  co.prefill_stream = ef.prefill_stream;
  co.decode_direct = ef.decode_direct;
  co.exact = ef.exact;
  co.n_ctx = ef.n_ctx > 0 ? ef.n_ctx : ef.ctx_hint;
  co.n_batch = std::max<int32_t>(ef.n_batch, ef.kv_sequences);
  co.kv_sequences = ef.kv_sequences;
  return cuda::load_model_cuda(ef.model, co);
#else
  fail("--backend cuda: this strata was built without CUDA (rebuild with -DSTRATA_CUDA=ON where nvcc is)");
#endif
}

void print_cache_report(const ExpertCacheReport& r, const std::string& backend, const char* what) {
  if (!r.present) return;
  const double mib = 1024.0 * 1024.0;
  std::fprintf(stderr,
               "strata: %s expert cache (%s): hit rate %.1f%% (%lld from GPU slots, %lld on the CPU pool), "
               "slots %d/%d used of %d experts, %lld swaps, moved h2d %.1f MiB d2h %.1f MiB\n",
               what, backend.c_str(), 100.0 * r.hit_rate(), (long long)r.hits, (long long)r.misses,
               r.slots_used, r.n_slots, r.n_experts_total, (long long)r.swaps, double(r.bytes_h2d) / mib,
               double(r.bytes_d2h) / mib);
  if (r.direct > 0)
    std::fprintf(stderr, "strata: %s expert cache (%s): of the CPU pool's share above, %lld pairs were read by the GPU "
                 "straight from host memory instead (direct reads, %.1f MiB over PCIe)\n", what, backend.c_str(),
                 (long long)r.direct, double(r.direct_bytes) / mib);
  if (r.streamed > 0)
    std::fprintf(stderr, "strata: %s expert cache (%s): %lld non-resident experts streamed to the GPU for a pass, "
                 "%.1f MiB\n", what, backend.c_str(), (long long)r.streamed,
                 double(r.streamed_bytes) / mib);
  if (r.streamed > 0 && r.stream_copy_us > 0)
    std::fprintf(stderr, "strata: %s expert cache (%s): decode streaming split by the cost of one expert: copy %.1f us, "
                 "CPU pool %.1f us\n", what, backend.c_str(), r.stream_copy_us, r.stream_cpu_us);
  if (r.forwards > 0)
    std::fprintf(stderr,
                 "strata: %s host work (%s): CUDA graphs %s, %lld of %lld forward passes replayed a graph (%lld "
                 "captured); per pass %.1f kernel-launcher calls, %.1f transfers, host %.1f us + waiting for "
                 "the GPU %.1f us\n",
                 what, backend.c_str(), r.graphs_enabled ? "on" : "off", (long long)r.graph_forwards,
                 (long long)r.forwards, (long long)r.graph_captures, double(r.op_calls) / double(r.forwards),
                 double(r.transfers) / double(r.forwards), 1e6 * r.host_s / double(r.forwards),
                 1e6 * r.wait_s / double(r.forwards));
  if (r.predicted > 0)
    std::fprintf(stderr, "strata: %s expert prediction (%s): %.1f%% of the %lld experts routed in predicting layers "
                 "were predicted from the layer's input and asked into L2 before gate_up read them\n", what,
                 backend.c_str(), 100.0 * double(r.predict_hits) / double(r.predicted), (long long)r.predicted);
  if (r.gated_forwards > 0)
    std::fprintf(stderr, "strata: %s host work (%s): %lld of the CPU-pool passes ran gated (enqueued whole, "
                 "the host releasing each layer)\n", what, backend.c_str(), (long long)r.gated_forwards);
  if (r.forwards > 0 && r.pool_s > 0)
    std::fprintf(stderr, "strata: %s host work (%s): of the host time per pass, CPU pool experts %.1f us, waiting "
                 "for layers' routing (GPU work + copies) %.1f us\n", what, backend.c_str(),
                 1e6 * r.pool_s / double(r.forwards), 1e6 * r.route_wait_s / double(r.forwards));
}

}  // namespace strata::cli
