// Cost of the stream-order checker per kernel launch (CPU only). "off" is what every hook in the CUDA
// layer pays when STRATA_STREAM_CHECK is unset: one relaxed load and a branch. "on" is a launch that
// reads two shared registered buffers (published to every stream by an event) and writes one of its
// stream's own, on one of 4 streams, with an event record + 4 waits every 8 launches. No races: the
// normal path, not report building.
#include <benchmark/benchmark.h>

#include <vector>

#include "cuda/host/stream_check.h"

namespace sc = strata::stream_check;

static void BM_HookOff(benchmark::State& state) {
  sc::set_enabled(false);
  sc::Checker chk;
  auto s = chk.add_stream("compute", sc::StreamKind::NonBlocking);
  auto b = chk.add_buffer("x");
  std::vector<sc::BufferId> r{b}, w{};
  for (auto _ : state) {
    if (sc::enabled()) chk.on_launch(s, r, w, sc::Site::here());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_HookOff);

static void BM_LaunchChecked(benchmark::State& state) {
  sc::Checker chk;
  chk.set_print(false);
  std::vector<sc::AgentId> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(chk.add_stream("s", sc::StreamKind::NonBlocking));
  auto ev = chk.add_event("e");
  std::vector<sc::BufferId> shared, own;  // own[stream * 16 + k]
  for (int i = 0; i < 16; ++i) shared.push_back(chk.add_buffer("weights"));
  for (int i = 0; i < 64; ++i) own.push_back(chk.add_buffer("activations"));
  for (auto b : shared) chk.on_stream_access(streams[0], b, sc::Access::Write, sc::Site::here());
  chk.on_record(ev, streams[0]);
  for (auto t : streams) chk.on_wait(t, ev);
  size_t i = 0;
  for (auto _ : state) {
    sc::AgentId s = streams[i % 4];
    if (i % 8 == 0) {
      chk.on_record(ev, streams[(i / 8) % 4]);
      for (auto t : streams) chk.on_wait(t, ev);
    }
    std::vector<sc::BufferId> r{shared[i % 16], shared[(i + 7) % 16]}, w{own[(i % 4) * 16 + (i / 4) % 16]};
    chk.on_launch(s, r, w, sc::Site::here());
    ++i;
  }
  state.counters["reports"] = double(chk.report_count());
}
BENCHMARK(BM_LaunchChecked);

BENCHMARK_MAIN();
