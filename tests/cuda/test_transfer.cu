// GPU tests of the Device and the transfer module, run with the stream-order checker on. Compiled
// wherever nvcc is; skipped where there is no GPU. Every test fails if the checker reported anything it
// did not expect (fixture TearDown). The planted bugs below are test-only code paths that skip the
// ordering the transfer module does; the checker must catch each, and the same flow through the module
// must pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/transfer.h"

namespace {

using namespace strata::cuda;
namespace sc = strata::stream_check;

// ---- kernels ----
// table [n] int32: counts entries != expect into *bad.
__global__ void count_mismatch(const int* table, int n, int expect, unsigned* bad) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && table[i] != expect) atomicAdd(bad, 1u);
}

// Spins ~`cycles` before reading: keeps a reader in flight so that an unordered overwrite would show.
// src [n] float, out [1] float = sum(src) (one block).
__global__ void slow_sum(const float* src, int n, long long cycles, float* out) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  __shared__ float part[256];
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += src[i];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int i = 0; i < blockDim.x; ++i) t += part[i];
    *out = t;
  }
}

// Spins, then writes dst[i] = i * scale + bias (dst [n] float).
__global__ void slow_fill(float* dst, int n, long long cycles, float scale, float bias) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = i * scale + bias;
}

constexpr long long kSpin = 20'000'000;  // ~10 ms at H200 clocks

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
    sc::set_enabled(true);  // also when run outside ctest: the whole GPU suite runs checked
    sc::global().take_reports();
    dev = std::make_unique<Device>(0);
    // Small staging buffers so that ordinary sizes cycle through the ring.
    Transfer::Options opt;
    opt.staging_bytes = 64 << 10;
    opt.staging_buffers = 3;
    xfer = std::make_unique<Transfer>(*dev, opt);
  }
  void TearDown() override {
    if (dev) dev->synchronize();
    for (const auto& r : sc::global().take_reports()) ADD_FAILURE() << "stream-order checker: " << r.message;
    xfer.reset();
    dev.reset();
  }
  // Reports found since the last call; the test asserts on them (so TearDown does not fail it).
  std::vector<sc::Report> reports() { return sc::global().take_reports(); }

  // Two parts (a [n], b [n / 4] float; b's last b_trim bytes left out) downloaded in one call after slow
  // producers on compute, through the copy streams or the mapped route: every part holds the producers'
  // values; naming a stream that did not produce them (d2h) is caught for each part.
  void expect_two_part_download_waits_for_the_producer(int n, size_t b_trim, bool mapped) {
    auto a = dev->alloc(n * sizeof(float), "part a");
    auto b = dev->alloc(n / 4 * sizeof(float), "part b");
    auto ha = dev->alloc_pinned(n * sizeof(float), "part a (host)");
    auto hb = dev->alloc_pinned(n / 4 * sizeof(float), "part b (host)");
    for (int planted = 0; planted < 2; ++planted) {
      note_launch(dev->compute(), {}, {a.span(), b.span()});
      slow_fill<<<64, 256, 0, dev->compute().handle()>>>(a.as<float>(), n, kSpin, 0.5f, 1.0f + planted);
      slow_fill<<<16, 256, 0, dev->compute().handle()>>>(b.as<float>(), n / 4, kSpin, 2.0f, -3.0f - planted);
      CUDA_CHECK_LAUNCH();
      DevSpan bs = b.span();
      bs.bytes -= b_trim;
      Stream& producer = planted ? dev->d2h() : dev->compute();
      Ticket t = mapped ? xfer->download_mapped({{ha.span(), a.span()}, {hb.span(), bs}}, producer)
                        : xfer->download({{ha.span(), a.span()}, {hb.span(), bs}}, producer);
      t.wait();
      if (planted) break;
      ha.note_host_access(sc::Access::Read);
      hb.note_host_access(sc::Access::Read);
      int wrong = 0;
      for (int i = 0; i < n; ++i) wrong += ha.as<float>()[i] != i * 0.5f + 1.0f;
      for (size_t i = 0; i < bs.bytes / sizeof(float); ++i) wrong += hb.as<float>()[i] != float(i) * 2.0f - 3.0f;
      EXPECT_EQ(wrong, 0);
      EXPECT_TRUE(reports().empty());
    }
    dev->synchronize();
    auto r = reports();
    ASSERT_EQ(r.size(), 2u);  // both parts read buffers the compute stream was still writing
    EXPECT_EQ(r[0].buffer, "part a");
    EXPECT_EQ(r[1].buffer, "part b");
  }

  std::unique_ptr<Device> dev;
  std::unique_ptr<Transfer> xfer;
};

TEST_F(Gpu, DeviceOwnsNonBlockingStreams) {
  EXPECT_FALSE(dev->info().name.empty());
  EXPECT_GT(dev->info().sm_count, 0);
  EXPECT_GT(dev->free_bytes(), size_t(0));
  for (Stream* s : {&dev->compute(), &dev->h2d(), &dev->d2h()}) {
    unsigned flags = 0;
    CUDA_CHECK(cudaStreamGetFlags(s->handle(), &flags));
    EXPECT_EQ(flags, unsigned(cudaStreamNonBlocking)) << s->name();
    EXPECT_NE(s->handle(), nullptr);
  }
  EXPECT_NE(dev->compute().handle(), dev->h2d().handle());
  EXPECT_NE(dev->h2d().handle(), dev->d2h().handle());
  EXPECT_TRUE(dev->legacy().is_legacy());
}

TEST_F(Gpu, AllocationFailureIsAnError) {
  EXPECT_THROW(dev->alloc(size_t(1) << 50, "too big"), strata::Error);
  auto ok = dev->alloc(1024, "after the failure");  // the context is still usable
  EXPECT_NE(ok.data(), nullptr);
}

TEST_F(Gpu, StagedUploadRoundTrip) {
  std::mt19937 rng(7);
  for (size_t bytes : {size_t(0), size_t(1), size_t(4096 + 3), size_t(3 * 65536 + 17), size_t(1 << 20)}) {
    std::vector<unsigned char> src(bytes), back(bytes, 0);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    auto buf = dev->alloc(bytes, "roundtrip");
    xfer->upload(buf.span(), src.data(), bytes, dev->compute(), {&dev->compute()});
    xfer->download_sync(back.data(), buf.span(), bytes, dev->compute());
    EXPECT_EQ(src, back) << bytes << " bytes";
  }
}

TEST_F(Gpu, PageableSourceMayBeReusedAtOnce) {
  // Staging means the host may overwrite its pageable source as soon as upload() returns.
  const int n = 200'000;  // 800 KB: > the 3 x 64 KiB ring, so staging buffers are recycled
  std::vector<int> host(n);
  auto a = dev->alloc(n * sizeof(int), "a"), b = dev->alloc(n * sizeof(int), "b");
  std::fill(host.begin(), host.end(), 1);
  xfer->upload(a.span(), host.data(), n * sizeof(int), dev->compute(), {&dev->compute()});
  std::fill(host.begin(), host.end(), 2);
  xfer->upload(b.span(), host.data(), n * sizeof(int), dev->compute(), {&dev->compute()});
  std::fill(host.begin(), host.end(), 3);
  std::vector<int> ra(n), rb(n);
  xfer->download_sync(ra.data(), a.span(), n * sizeof(int), dev->compute());
  xfer->download_sync(rb.data(), b.span(), n * sizeof(int), dev->compute());
  EXPECT_EQ(std::count(ra.begin(), ra.end(), 1), n);
  EXPECT_EQ(std::count(rb.begin(), rb.end(), 2), n);
}

// The residency-table flow of the expert cache: every step re-uploads the table and at once a kernel on
// the (non-blocking) compute stream reads every entry. Through the module, no launch sees an old table.
TEST_F(Gpu, ResidencyTableUpdatesAreSeenByEveryLaunch) {
  const int n_layer = 48, n_expert = 512, n = n_layer * n_expert;  // table [n_layer][n_expert] int32
  auto table = dev->alloc(n * sizeof(int), "residency table");
  auto bad = dev->alloc(sizeof(unsigned), "mismatches");
  xfer->fill(bad.span(), 0, dev->compute(), {&dev->compute()});
  std::vector<int> host(n);
  const int steps = 300;
  for (int gen = 1; gen <= steps; ++gen) {
    std::fill(host.begin(), host.end(), gen);
    xfer->upload(table.span(), host.data(), host.size() * sizeof(int), dev->compute(), {&dev->compute()});
    note_launch(dev->compute(), {table.span()}, {bad.span()});
    count_mismatch<<<(n + 255) / 256, 256, 0, dev->compute().handle()>>>(table.as<int>(), n, gen,
                                                                         bad.as<unsigned>());
    CUDA_CHECK_LAUNCH();
  }
  unsigned mismatches = 1;
  xfer->download_sync(&mismatches, bad.span(), sizeof(unsigned), dev->compute());
  EXPECT_EQ(mismatches, 0u);
}

// ---- the planted bug: an upload that skips the event ----
// What a buggy module would do: the copy is on the copy stream, but no event orders the reader after it.
void planted_upload_without_event(Device& d, const DevSpan& dst, const void* pinned_src, size_t bytes,
                                  sc::Site site = sc::Site::here()) {
  if (sc::enabled()) sc::global().on_stream_access(d.h2d().check_id(), dst.check_id, sc::Access::Write, site);
  CUDA_CHECK(cudaMemcpyAsync(dst.ptr, pinned_src, bytes, cudaMemcpyHostToDevice, d.h2d().handle()));
}
// Bug 1 of DEVELOPERS.md as written: a plain pageable cudaMemcpy (legacy stream, returns before the DMA
// lands, so the host is not ordered after it).
void planted_pageable_memcpy(Device& d, const DevSpan& dst, const void* src, size_t bytes,
                             sc::Site site = sc::Site::here()) {
  if (sc::enabled()) sc::global().on_stream_access(d.legacy().check_id(), dst.check_id, sc::Access::Write, site);
  CUDA_CHECK(cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice));
}

TEST_F(Gpu, PlantedUploadWithoutEventIsCaught) {
  const int n = 48 * 512;
  auto table = dev->alloc(n * sizeof(int), "residency table");
  auto bad = dev->alloc(sizeof(unsigned), "mismatches");
  auto host = dev->alloc_pinned(n * sizeof(int), "host table");
  xfer->fill(bad.span(), 0, dev->compute(), {&dev->compute()});
  std::fill(host.as<int>(), host.as<int>() + n, 5);

  const int plant_line = __LINE__ + 1;
  planted_upload_without_event(*dev, table.span(), host.data(), n * sizeof(int));
  const int read_line = __LINE__ + 1;
  note_launch(dev->compute(), {table.span()}, {bad.span()});
  count_mismatch<<<(n + 255) / 256, 256, 0, dev->compute().handle()>>>(table.as<int>(), n, 5, bad.as<unsigned>());
  CUDA_CHECK_LAUNCH();
  dev->synchronize();
  auto r = reports();
  ASSERT_EQ(r.size(), 1u) << "the checker missed the planted upload";
  EXPECT_EQ(r[0].buffer, "residency table");
  EXPECT_EQ(r[0].before.line, plant_line) << r[0].message;
  EXPECT_EQ(r[0].now.line, read_line) << r[0].message;
  EXPECT_NE(std::string(r[0].before.file).find("test_transfer.cu"), std::string::npos);
  EXPECT_NE(r[0].before_agent.find("h2d"), std::string::npos);
  EXPECT_NE(r[0].now_agent.find("compute"), std::string::npos);

  // The plant removed: the same flow through the module passes.
  std::fill(host.as<int>(), host.as<int>() + n, 6);
  xfer->upload(table.span(), host.span(), dev->compute(), {&dev->compute()});
  note_launch(dev->compute(), {table.span()}, {bad.span()});
  count_mismatch<<<(n + 255) / 256, 256, 0, dev->compute().handle()>>>(table.as<int>(), n, 6, bad.as<unsigned>());
  CUDA_CHECK_LAUNCH();
  dev->synchronize();
  EXPECT_TRUE(reports().empty());
}

TEST_F(Gpu, PlantedPageableMemcpyWithNonBlockingReaderIsCaught) {
  const int n = 48 * 512;
  auto table = dev->alloc(n * sizeof(int), "residency table");
  auto bad = dev->alloc(sizeof(unsigned), "mismatches");
  std::vector<int> host(n, 9);
  xfer->fill(bad.span(), 0, dev->compute(), {&dev->compute()});
  planted_pageable_memcpy(*dev, table.span(), host.data(), n * sizeof(int));
  note_launch(dev->compute(), {table.span()}, {bad.span()});
  count_mismatch<<<(n + 255) / 256, 256, 0, dev->compute().handle()>>>(table.as<int>(), n, 9, bad.as<unsigned>());
  CUDA_CHECK_LAUNCH();
  dev->synchronize();
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].before_agent.find("legacy"), std::string::npos) << r[0].message;

  // The fix of the original report (cudaStreamSynchronize(nullptr) after the copy) also passes.
  planted_pageable_memcpy(*dev, table.span(), host.data(), n * sizeof(int));
  dev->legacy().synchronize();
  note_launch(dev->compute(), {table.span()}, {bad.span()});
  count_mismatch<<<(n + 255) / 256, 256, 0, dev->compute().handle()>>>(table.as<int>(), n, 9, bad.as<unsigned>());
  CUDA_CHECK_LAUNCH();
  dev->synchronize();
  EXPECT_TRUE(reports().empty());
}

// Issue 7's rule: a slot a launched kernel may still read is never overwritten. A slow kernel reads
// slot 0; the upload of a new expert into it names the compute stream as producer, so the copy waits.
TEST_F(Gpu, SlotOverwriteWaitsForTheKernelReadingIt) {
  const int n = 1 << 16;  // slot [n] float
  auto slots = dev->alloc(2 * n * sizeof(float), "expert slots");
  Region slot0 = slots.region(0, n * sizeof(float), "slot 0");
  Region slot1 = slots.region(n * sizeof(float), n * sizeof(float), "slot 1");
  auto out = dev->alloc(sizeof(float), "sum");
  auto old_expert = dev->alloc_pinned(n * sizeof(float), "expert A (host)");
  auto new_expert = dev->alloc_pinned(n * sizeof(float), "expert B (host)");
  std::fill(old_expert.as<float>(), old_expert.as<float>() + n, 1.0f);
  std::fill(new_expert.as<float>(), new_expert.as<float>() + n, 2.0f);
  xfer->upload(slot0.span(), old_expert.span(), dev->compute(), {&dev->compute()});

  note_launch(dev->compute(), {slot0.span()}, {out.span()});
  slow_sum<<<1, 256, 0, dev->compute().handle()>>>(slot0.span().as<float>(), n, kSpin, out.as<float>());
  CUDA_CHECK_LAUNCH();
  xfer->upload(slot0.span(), new_expert.span(), dev->compute(), {&dev->compute()});
  float sum = 0;
  xfer->download_sync(&sum, out.span(), sizeof(float), dev->compute());
  EXPECT_EQ(sum, float(n)) << "the kernel saw the new expert: the slot was overwritten under it";
  EXPECT_TRUE(reports().empty());

  // Planted: the upload into slot 1 names the copy stream itself as producer, so nothing orders it
  // after the kernel still reading slot 1. The checker catches it whatever the GPU did.
  xfer->upload(slot1.span(), old_expert.span(), dev->compute(), {&dev->compute()});
  note_launch(dev->compute(), {slot1.span()}, {out.span()});
  slow_sum<<<1, 256, 0, dev->compute().handle()>>>(slot1.span().as<float>(), n, kSpin, out.as<float>());
  CUDA_CHECK_LAUNCH();
  xfer->upload(slot1.span(), new_expert.span(), dev->h2d(), {&dev->compute()});
  dev->synchronize();
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "slot 1");
  EXPECT_EQ(r[0].now_access, sc::Access::Write);
  EXPECT_EQ(r[0].before_access, sc::Access::Read);
}

// Bug 2 of DEVELOPERS.md: the producer is the legacy stream 0. The module records its event there too.
TEST_F(Gpu, DefaultStreamProducerIsWaitedFor) {
  const int n = 1 << 20;  // kv block [n] float
  auto kv = dev->alloc(n * sizeof(float), "kv block");
  auto host = dev->alloc_pinned(n * sizeof(float), "kv block (host)");
  std::fill(host.as<float>(), host.as<float>() + n, -1.0f);
  note_launch(dev->legacy(), {}, {kv.span()});
  slow_fill<<<64, 256, 0, dev->legacy().handle()>>>(kv.as<float>(), n, kSpin, 0.5f, 3.0f);
  CUDA_CHECK_LAUNCH();
  Ticket t = xfer->download(host.span(), kv.span(), dev->legacy());
  t.wait();
  host.note_host_access(sc::Access::Read);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host.as<float>()[i] != i * 0.5f + 3.0f;
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(reports().empty());

  // Planted: the offload skips the producer (as the pool did for handle 0) by naming its own stream.
  note_launch(dev->legacy(), {}, {kv.span()});
  slow_fill<<<64, 256, 0, dev->legacy().handle()>>>(kv.as<float>(), n, kSpin, 0.25f, 1.0f);
  CUDA_CHECK_LAUNCH();
  xfer->download(host.span(), kv.span(), dev->d2h()).wait();
  dev->synchronize();
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "kv block");
  EXPECT_NE(r[0].before_agent.find("legacy"), std::string::npos) << r[0].message;
}

// Activations to the CPU pool and the partial sums back.
TEST_F(Gpu, ActivationsToHostAndBack) {
  const int n = 4096;  // act [n] float
  auto act = dev->alloc(n * sizeof(float), "activations");
  auto back = dev->alloc(n * sizeof(float), "cpu partial sums");
  auto out = dev->alloc(sizeof(float), "sum");
  auto h_act = dev->alloc_pinned(n * sizeof(float), "activations (host)");
  auto h_back = dev->alloc_pinned(n * sizeof(float), "cpu partial sums (host)");
  for (int step = 0; step < 20; ++step) {
    note_launch(dev->compute(), {}, {act.span()});
    slow_fill<<<16, 256, 0, dev->compute().handle()>>>(act.as<float>(), n, step == 0 ? kSpin : 0, 1.0f, float(step));
    CUDA_CHECK_LAUNCH();
    xfer->download(h_act.span(), act.span(), dev->compute()).wait();
    h_act.note_host_access(sc::Access::Read);
    h_back.note_host_access(sc::Access::Write);
    for (int i = 0; i < n; ++i) h_back.as<float>()[i] = h_act.as<float>()[i] * 0.0f + 1.0f;
    EXPECT_EQ(h_act.as<float>()[n - 1], float(n - 1 + step));
    Ticket t = xfer->upload(back.span(), h_back.span(), dev->compute(), {&dev->compute()});
    note_launch(dev->compute(), {back.span()}, {out.span()});
    slow_sum<<<1, 256, 0, dev->compute().handle()>>>(back.as<float>(), n, 0, out.as<float>());
    CUDA_CHECK_LAUNCH();
    t.wait();  // h_back may be refilled only after its upload is done
  }
  float sum = 0;
  xfer->download_sync(&sum, out.span(), sizeof(float), dev->compute());
  EXPECT_EQ(sum, float(n));
}

// Several downloads after one producer point, one ticket (a CPU-pool layer's ids, weights, activations):
// every part holds the slow kernel's values; naming the wrong producer is caught for each part.
TEST_F(Gpu, MultiPartDownloadWaitsForTheProducer) {
  expect_two_part_download_waits_for_the_producer(1 << 18, 0, /*mapped=*/false);
}

TEST_F(Gpu, PinnedSourceRewrittenBeforeItsTicketIsCaught) {
  const int n = 1 << 16;
  auto dst = dev->alloc(n * sizeof(float), "dst");
  auto src = dev->alloc_pinned(n * sizeof(float), "pinned src");
  Ticket t = xfer->upload(dst.span(), src.span(), dev->compute(), {&dev->compute()});
  src.note_host_access(sc::Access::Write);  // too early
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "pinned src");
  Ticket t2 = xfer->upload(dst.span(), src.span(), dev->compute(), {&dev->compute()});
  t2.wait();
  src.note_host_access(sc::Access::Write);  // fine now
  EXPECT_TRUE(reports().empty());
}

TEST_F(Gpu, FillAndDeviceCopy) {
  const size_t bytes = 3 << 20;
  auto a = dev->alloc(bytes, "a"), b = dev->alloc(bytes, "b");
  xfer->fill(a.span(), 0x5A, dev->compute(), {});
  xfer->copy(b.span(), a.span(), dev->h2d(), {&dev->compute()});
  std::vector<unsigned char> host(bytes, 0);
  xfer->download_sync(host.data(), b.span(), bytes, dev->compute());
  EXPECT_EQ(std::count(host.begin(), host.end(), 0x5A), static_cast<long>(bytes));
  EXPECT_EQ(xfer->bytes_d2d(), bytes);
  EXPECT_THROW(xfer->copy(a.span(), dev->alloc(bytes + 1, "c").span(), dev->compute(), {}), strata::Error);
}

}  // namespace

// ---- same-stream transfers through mapped pinned memory (Transfer::download_mapped / upload_mapped) ----

// The CPU pool's round trip through the mapped route: each step a slow kernel writes the activations
// (the first one spins ~10 ms), they go to the host by a copy kernel on the same stream, the host writes
// partial sums that come back the same way and a kernel sums them. Meanwhile the copy engine is kept busy
// with a large upload on the h2d stream (where unordered copies showed the stale data on the H200).
TEST_F(Gpu, MappedActivationsToHostAndBack) {
  ASSERT_TRUE(xfer->mapped());  // 64-bit Linux: unified addressing
  const int n = 4096;           // act, back [n] float
  auto act = dev->alloc(n * sizeof(float), "activations");
  auto back = dev->alloc(n * sizeof(float), "cpu partial sums");
  auto out = dev->alloc(sizeof(float), "sum");
  auto h_act = dev->alloc_pinned(n * sizeof(float), "activations (host)");
  auto h_back = dev->alloc_pinned(n * sizeof(float), "cpu partial sums (host)");
  const size_t big = size_t(256) << 20;
  auto busy = dev->alloc(big, "busy copy target");
  auto h_busy = dev->alloc_pinned(big, "busy copy source");
  for (int step = 0; step < 20; ++step) {
    if (step % 5 == 0) xfer->upload(busy.span(), h_busy.span(), dev->h2d(), {});
    note_launch(dev->compute(), {}, {act.span()});
    slow_fill<<<16, 256, 0, dev->compute().handle()>>>(act.as<float>(), n, step == 0 ? kSpin : 0, 1.0f, float(step));
    CUDA_CHECK_LAUNCH();
    xfer->download_mapped({{h_act.span(), act.span()}}, dev->compute()).wait();
    h_act.note_host_access(sc::Access::Read);
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += h_act.as<float>()[i] != float(i + step);
    EXPECT_EQ(wrong, 0) << "step " << step;
    h_back.note_host_access(sc::Access::Write);
    for (int i = 0; i < n; ++i) h_back.as<float>()[i] = float(step % 3);
    Ticket t = xfer->upload_mapped(back.span(), h_back.span(), dev->compute());
    note_launch(dev->compute(), {back.span()}, {out.span()});
    slow_sum<<<1, 256, 0, dev->compute().handle()>>>(back.as<float>(), n, 0, out.as<float>());
    CUDA_CHECK_LAUNCH();
    t.wait();  // h_back may be refilled only after the kernel that reads it ran
    float sum = 0;
    xfer->download_sync(&sum, out.span(), sizeof(float), dev->compute());
    EXPECT_EQ(sum, float(n * (step % 3))) << "step " << step;
  }
}

// Several parts in one mapped download, after slow producers: every part holds the producers' values.
// Naming a stream that did not produce them (the d2h stream) is caught for each part.
TEST_F(Gpu, MappedDownloadWaitsForTheProducer) {
  const int n = 1 << 15;  // a [n], b [n / 4] float: 160 KiB in all, within Transfer::kMappedMaxBytes
  ASSERT_TRUE(Transfer::takes_mapped_route(xfer->mapped(), size_t(n + n / 4) * sizeof(float)));
  expect_two_part_download_waits_for_the_producer(n, 3, /*mapped=*/true);  // b not whole words: the byte loop
}

// A mapped upload's source is read by a kernel that may not have run yet: rewriting it before the
// ticket is done is caught; after the ticket it is fine.
TEST_F(Gpu, MappedUploadSourceRewrittenBeforeItsTicketIsCaught) {
  const int n = 1 << 16;
  auto dst = dev->alloc(n * sizeof(float), "dst");
  auto src = dev->alloc_pinned(n * sizeof(float), "pinned src");
  note_launch(dev->compute(), {}, {dst.span()});
  slow_fill<<<16, 256, 0, dev->compute().handle()>>>(dst.as<float>(), n, kSpin, 1.0f, 0.0f);
  CUDA_CHECK_LAUNCH();
  Ticket t = xfer->upload_mapped(dst.span(), src.span(), dev->compute());
  src.note_host_access(sc::Access::Write);  // too early
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "pinned src");
  Ticket t2 = xfer->upload_mapped(dst.span(), src.span(), dev->compute());
  t2.wait();
  src.note_host_access(sc::Access::Write);  // fine now
  EXPECT_TRUE(reports().empty());
}

// STRATA_CUDA_MAPPED_IO=0: the same calls take the copy-stream route, with the same results.
TEST_F(Gpu, MappedRouteOffUsesTheCopyStreams) {
  setenv("STRATA_CUDA_MAPPED_IO", "0", 1);
  Transfer plain(*dev);
  unsetenv("STRATA_CUDA_MAPPED_IO");
  EXPECT_FALSE(plain.mapped());
  const int n = 1 << 14;
  auto d = dev->alloc(n * sizeof(float), "dev");
  auto h = dev->alloc_pinned(n * sizeof(float), "host");
  note_launch(dev->compute(), {}, {d.span()});
  slow_fill<<<16, 256, 0, dev->compute().handle()>>>(d.as<float>(), n, kSpin, 3.0f, 1.0f);
  CUDA_CHECK_LAUNCH();
  plain.download_mapped({{h.span(), d.span()}}, dev->compute()).wait();
  h.note_host_access(sc::Access::Read);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += h.as<float>()[i] != i * 3.0f + 1.0f;
  EXPECT_EQ(wrong, 0);
  h.note_host_access(sc::Access::Write);
  for (int i = 0; i < n; ++i) h.as<float>()[i] = 2.0f;
  plain.upload_mapped(d.span(), h.span(), dev->compute()).wait();
  float x = 0;
  plain.download_sync(&x, d.span(), sizeof(float), dev->compute());
  EXPECT_EQ(x, 2.0f);
}

// Above Transfer::kMappedMaxBytes (a prefill's activations) the same call takes the copy streams, ordered
// after the producer all the same.
TEST_F(Gpu, LargeMappedDownloadTakesTheCopyStreams) {
  const int n = 1 << 18;  // [n] float: 1 MiB
  EXPECT_TRUE(Transfer::takes_mapped_route(true, Transfer::kMappedMaxBytes));
  EXPECT_FALSE(Transfer::takes_mapped_route(true, size_t(n) * sizeof(float)));
  EXPECT_FALSE(Transfer::takes_mapped_route(false, 4));
  auto d = dev->alloc(n * sizeof(float), "big activations");
  auto h = dev->alloc_pinned(n * sizeof(float), "big activations (host)");
  note_launch(dev->compute(), {}, {d.span()});
  slow_fill<<<64, 256, 0, dev->compute().handle()>>>(d.as<float>(), n, kSpin, 0.25f, 2.0f);
  CUDA_CHECK_LAUNCH();
  xfer->download_mapped({{h.span(), d.span()}}, dev->compute()).wait();
  h.note_host_access(sc::Access::Read);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += h.as<float>()[i] != i * 0.25f + 2.0f;
  EXPECT_EQ(wrong, 0);
}

// ---- gated passes: HostGates, Transfer::download_signaled / upload_gated (docs/gpu.md "Gated passes") ----

// A pass captured whole like a gated decode pass, over L layers. Piece k: (k > 0) the gated upload of the
// host's answer to layer k-1 and a kernel summing it into sums[k-1]; (k < L) a slow kernel writing layer
// k's activations and their signaled download. The host waits for each signal, checks the activations,
// writes its answer, opens the gate and gives the notes of the piece it released. Meanwhile the copy
// engine is kept busy with a large upload.
struct GatedPass {
  static constexpr int L = 6, n = 2048;  // act, back [n] float; sums [L] float
  Device& dev;
  Transfer& xfer;
  DeviceBuffer act, back, sums;
  PinnedBuffer h_act, h_back;
  HostGates gates;
  GatedPass(Device& d, Transfer& x)
      : dev(d), xfer(x), act(d.alloc(n * sizeof(float), "activations")),
        back(d.alloc(n * sizeof(float), "cpu partial sums")), sums(d.alloc(L * sizeof(float), "sums")),
        h_act(d.alloc_pinned(n * sizeof(float), "activations (host)")),
        h_back(d.alloc_pinned(n * sizeof(float), "cpu partial sums (host)")), gates(d, L, "test.gates") {}
  void piece(int k, bool enqueue) {
    Stream& cs = dev.compute();
    if (k > 0) {
      xfer.upload_gated(back.span(), h_back.span(), cs, gates, k - 1, enqueue);
      note_launch(cs, {back.span()}, {sums.span()});
      if (enqueue) slow_sum<<<1, 256, 0, cs.handle()>>>(back.as<float>(), n, 0, sums.as<float>() + (k - 1));
    }
    if (k < L) {
      note_launch(cs, {}, {act.span()});
      if (enqueue) slow_fill<<<16, 256, 0, cs.handle()>>>(act.as<float>(), n, k == 0 ? kSpin : kSpin / 10, 1.0f, float(k));
      xfer.download_signaled({{h_act.span(), act.span()}}, cs, gates, k, enqueue);
    }
    if (enqueue) CUDA_CHECK_LAUNCH();
  }
  Graph capture() {
    const sc::PauseNotes quiet;  // the notes are given where the host releases each piece
    return Graph::capture(dev.compute(), [&] {
      for (int k = 0; k <= L; ++k) piece(k, true);
    });
  }
};

TEST_F(Gpu, GatedPassHandsOffEachLayer) {
  ASSERT_TRUE(xfer->mapped());
  GatedPass gp(*dev, *xfer);
  Stream& cs = dev->compute();
  const size_t big = size_t(256) << 20;
  auto busy = dev->alloc(big, "busy copy target");
  auto h_busy = dev->alloc_pinned(big, "busy copy source");
  const Graph g = gp.capture();
  for (int run = 0; run < 3; ++run) {  // the same graph again: the flags are reset between runs
    gp.gates.reset();
    xfer->upload(busy.span(), h_busy.span(), dev->h2d(), {});
    g.launch(cs);
    gp.piece(0, false);
    for (int k = 0; k < GatedPass::L; ++k) {
      gp.gates.wait_signal(k, cs);
      EXPECT_TRUE(gp.gates.signaled(k));
      gp.h_act.note_host_access(sc::Access::Read);
      int wrong = 0;
      for (int i = 0; i < GatedPass::n; ++i) wrong += gp.h_act.as<float>()[i] != float(i + k);
      EXPECT_EQ(wrong, 0) << "run " << run << " layer " << k;
      gp.h_back.note_host_access(sc::Access::Write);
      for (int i = 0; i < GatedPass::n; ++i) gp.h_back.as<float>()[i] = float(k + 1 + run);
      gp.gates.open(k);
      gp.piece(k + 1, false);
    }
    float sums[GatedPass::L] = {};
    xfer->download_sync(sums, gp.sums.span(), sizeof(sums), cs);
    for (int k = 0; k < GatedPass::L; ++k) EXPECT_EQ(sums[k], float(GatedPass::n * (k + 1 + run))) << "layer " << k;
  }
  EXPECT_TRUE(reports().empty());
}

// The host reading a signaled download before its signal, or rewriting a gated upload's source before a
// later signal of the stream (the gated copy may not have run), is caught; in order it is not.
TEST_F(Gpu, GatedHandOffsOutOfOrderAreCaught) {
  GatedPass gp(*dev, *xfer);
  Stream& cs = dev->compute();
  const Graph g = gp.capture();
  gp.gates.reset();
  g.launch(cs);
  gp.piece(0, false);
  gp.h_act.note_host_access(sc::Access::Read);  // too early
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "activations (host)");
  gp.gates.wait_signal(0, cs);
  gp.h_act.note_host_access(sc::Access::Read);
  gp.h_back.note_host_access(sc::Access::Write);
  gp.gates.open(0);
  gp.piece(1, false);
  EXPECT_TRUE(reports().empty());
  gp.h_back.note_host_access(sc::Access::Write);  // too early: gate 0's copy may still read it
  r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "cpu partial sums (host)");
  for (int k = 1; k < GatedPass::L; ++k) {
    gp.gates.wait_signal(k, cs);
    gp.h_back.note_host_access(sc::Access::Write);  // fine: signal k follows gate k-1's copy
    gp.gates.open(k);
    gp.piece(k + 1, false);
  }
  cs.synchronize();
  EXPECT_TRUE(reports().empty());
}

// A pass that threw half-way: the gates not yet opened are aborted, their copies are skipped and the
// stream runs to its end. A gate opens once.
TEST_F(Gpu, AbortedGatesSkipTheirCopies) {
  const int L = 3, n = 1024;
  Stream& cs = dev->compute();
  std::vector<DeviceBuffer> dst;
  for (int k = 0; k < L; ++k) {
    dst.push_back(dev->alloc(n * sizeof(float), "dst" + std::to_string(k)));
    xfer->fill(dst.back().span(), 0xff, cs, {&cs});
  }
  auto src = dev->alloc_pinned(n * sizeof(float), "src (host)");
  HostGates gates(*dev, L, "test.gates");
  Graph g;
  {
    const sc::PauseNotes quiet;
    g = Graph::capture(cs, [&] {
      for (int k = 0; k < L; ++k) xfer->upload_gated(dst[size_t(k)].span(), src.span(), cs, gates, k, true);
    });
  }
  gates.reset();
  g.launch(cs);
  src.note_host_access(sc::Access::Write);
  for (int i = 0; i < n; ++i) src.as<float>()[i] = 5.0f;
  gates.open(0);
  xfer->upload_gated(dst[0].span(), src.span(), cs, gates, 0, false);
  gates.abort_rest();
  cs.synchronize();
  EXPECT_THROW(gates.open(1), strata::Error);
  std::vector<float> got(n);
  for (int k = 0; k < L; ++k) {
    xfer->download_sync(got.data(), dst[size_t(k)].span(), n * sizeof(float), cs);
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &got[size_t(i)], 4);
      wrong += k == 0 ? got[size_t(i)] != 5.0f : bits != 0xffffffffu;
    }
    EXPECT_EQ(wrong, 0) << "dst" << k;
  }
}

// Bad uses are errors, not hangs: copies the mapped route cannot take, an index out of range, and a wait
// for a signal that an idle stream will never raise.
TEST_F(Gpu, GatedCopiesRefuseWhatTheyCannotDo) {
  Stream& cs = dev->compute();
  HostGates gates(*dev, 2, "test.gates");
  const size_t big = Transfer::kMappedMaxBytes + 4;
  auto d = dev->alloc(big, "big");
  auto h = dev->alloc_pinned(big, "big (host)");
  EXPECT_THROW(xfer->download_signaled({{h.span(), d.span()}}, cs, gates, 0, true), strata::Error);
  EXPECT_THROW(xfer->upload_gated(d.span(), h.span(), cs, gates, 0, true), strata::Error);
  DevSpan small = d.span();
  small.bytes = 64;
  EXPECT_THROW(xfer->download_signaled({{h.span(), small}}, cs, gates, 2, true), strata::Error);
  setenv("STRATA_CUDA_MAPPED_IO", "0", 1);
  Transfer plain(*dev);
  unsetenv("STRATA_CUDA_MAPPED_IO");
  EXPECT_THROW(plain.download_signaled({{h.span(), small}}, cs, gates, 0, true), strata::Error);
  EXPECT_THROW(HostGates(*dev, 0, "none"), strata::Error);
  gates.reset();
  cs.synchronize();
  EXPECT_FALSE(gates.signaled(1));
  EXPECT_THROW(gates.wait_signal(1, cs), strata::Error);  // nothing on the stream will raise it
}

// GatedWrite::AddF32 (the CPU pool's partial into the residual stream): dst += src once the gate opens;
// misaligned buffers are refused.
TEST_F(Gpu, GatedAddAddsIntoTheDestination) {
  const int n = 3000;  // not a multiple of the block size
  Stream& cs = dev->compute();
  auto x = dev->alloc(n * sizeof(float), "residual");
  auto h = dev->alloc_pinned(n * sizeof(float), "partial (host)");
  std::vector<float> init(n), got(n);
  for (int i = 0; i < n; ++i) init[size_t(i)] = float(i);
  xfer->upload(x.span(), init.data(), n * sizeof(float), cs, {&cs});
  HostGates gates(*dev, 1, "test.gates");
  Graph g;
  {
    const sc::PauseNotes quiet;
    g = Graph::capture(cs, [&] {
      xfer->upload_gated(x.span(), h.span(), cs, gates, 0, true, Transfer::GatedWrite::AddF32);
    });
  }
  gates.reset();
  g.launch(cs);
  h.note_host_access(sc::Access::Write);
  for (int i = 0; i < n; ++i) h.as<float>()[i] = 0.5f - float(i % 7);
  gates.open(0);
  xfer->upload_gated(x.span(), h.span(), cs, gates, 0, false, Transfer::GatedWrite::AddF32);
  xfer->download_sync(got.data(), x.span(), n * sizeof(float), cs);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += got[size_t(i)] != float(i) + (0.5f - float(i % 7));
  EXPECT_EQ(wrong, 0);
  gates.check();
  HostSpan odd = h.span();
  odd.ptr = static_cast<char*>(odd.ptr) + 2;
  odd.bytes = 64;
  EXPECT_THROW(xfer->upload_gated(x.span(), odd, cs, gates, 0, true, Transfer::GatedWrite::AddF32), strata::Error);
}
