// Hazard probe (issue 8): reproduces a real engine's bug report on this GPU. A 96 KiB int32 table
// [48 layers][512 experts] is uploaded with a plain pageable cudaMemcpy, then at once a kernel on a
// cudaStreamNonBlocking stream checks every entry. Pageable H2D cudaMemcpy returns once the data is
// staged, before the DMA lands, and a non-blocking stream does not wait for the legacy stream: the kernel
// may read the old table. Each trial is independent (the reader stream is drained before the next).
//
// Arms (2,000 trials each, delay arms 1,000 each, every arm in two runs):
//   plain            pageable cudaMemcpy, reader on a non-blocking stream
//   +sync(0)         ... then cudaStreamSynchronize(nullptr) before the launch
//   blocking reader  reader on a stream made with cudaStreamCreate (blocking: waits for stream 0)
//   delay D us       plain, with a host busy-wait of D us (0, 10, 20, 50, uniform 100-200) before launch
//   transfer module  strata::cuda::Transfer::upload (event on producer, copy stream, consumer waits)
// and every arm twice: with the copy engines idle, and while another stream's large pinned async upload
// (--bulk-mib in flight, in --chunk-mib pieces, topped up before every trial) is running.
//
// Usage: stream_hazard [--trials 2000] [--delay-trials 1000] [--runs 2] [--bulk-mib 256] [--chunk-mib 32]
//                      [--max-seconds 20]   (per arm and run; a capped arm reports the trials it did)
// Prints a markdown table. Raw cudaMemcpy here is the point of the probe (bench/ is outside the contract).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/transfer.h"

namespace {

using namespace strata::cuda;
using Clock = std::chrono::steady_clock;

constexpr int kLayers = 48, kExperts = 512, kEntries = kLayers * kExperts;  // table [48][512] int32
constexpr size_t kTableBytes = size_t(kEntries) * sizeof(int);              // 96 KiB

// table [kEntries] int32, expected generation `gen`; counts[trial] += entries that differ.
__global__ void check_table(const int* table, int gen, int trial, unsigned* counts) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kEntries && table[i] != gen) atomicAdd(&counts[trial], 1u);
}

std::string one_decimal(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

void spin_us(double us) {
  auto t0 = Clock::now();
  while (std::chrono::duration<double, std::micro>(Clock::now() - t0).count() < us) {
  }
}

struct Options {
  int trials = 2000, delay_trials = 1000, runs = 2;
  size_t bulk_mib = 256, chunk_mib = 32;
  double max_seconds = 20;
};

// Keeps `in_flight` bytes of pinned async H2D upload queued on its own stream.
class BulkUpload {
 public:
  BulkUpload(size_t total, size_t chunk) : total_(total), chunk_(chunk) {
    CUDA_CHECK(cudaHostAlloc(&host_, total_, cudaHostAllocDefault));
    std::memset(host_, 0x3c, total_);
    CUDA_CHECK(cudaMalloc(&dev_, total_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    n_ = total_ / chunk_;
    events_.resize(n_);
    for (auto& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~BulkUpload() {
    cudaStreamSynchronize(stream_);
    for (auto& e : events_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
    cudaFree(dev_);
    cudaFreeHost(host_);
  }
  // Called before every trial: re-queues every chunk whose previous copy finished.
  void top_up() {
    // Retire finished chunks from the oldest; then refill them.
    while (pending_ > 0 && cudaEventQuery(events_[oldest_]) == cudaSuccess) {
      oldest_ = (oldest_ + 1) % n_;
      --pending_;
      ++completed_;
    }
    while (pending_ < n_) enqueue();
  }
  void drain() {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    completed_ += pending_;
    pending_ = 0;
  }
  size_t completed_bytes() const { return completed_ * chunk_; }

 private:
  void enqueue() {
    size_t slot = (oldest_ + pending_) % n_;
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dev_) + slot * chunk_, static_cast<char*>(host_) + slot * chunk_,
                               chunk_, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(events_[slot], stream_));
    ++pending_;
  }
  size_t total_, chunk_, n_ = 0, pending_ = 0, oldest_ = 0, completed_ = 0;
  void* host_ = nullptr;
  void* dev_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

struct ArmResult {
  int trials = 0, stale = 0;
  double stale_entries_mean = 0;  // old entries per stale launch
  double us_per_trial = 0;
  double copy_us_stale = 0, copy_us_fresh = 0;  // mean time the copy call took to return
};

struct Arm {
  std::string name;
  int trials;
  // One trial: make the device table hold `gen` (the host table already does) and launch the checker.
  std::function<void(int gen, int trial)> run;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "stream_hazard: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--trials") o.trials = std::atoi(next());
    else if (a == "--delay-trials") o.delay_trials = std::atoi(next());
    else if (a == "--runs") o.runs = std::atoi(next());
    else if (a == "--bulk-mib") o.bulk_mib = std::strtoull(next(), nullptr, 10);
    else if (a == "--chunk-mib") o.chunk_mib = std::strtoull(next(), nullptr, 10);
    else if (a == "--max-seconds") o.max_seconds = std::atof(next());
    else {
      std::fprintf(stderr, "usage: stream_hazard [--trials N] [--delay-trials N] [--runs N] [--bulk-mib N] "
                           "[--chunk-mib N] [--max-seconds S]\n");
      return 2;
    }
  }
  if (o.trials <= 0 || o.delay_trials <= 0 || o.runs <= 0 || o.chunk_mib == 0 || o.bulk_mib < o.chunk_mib) {
    std::fprintf(stderr, "stream_hazard: counts must be positive and --bulk-mib >= --chunk-mib\n");
    return 2;
  }
  if (!device_available()) {
    std::fprintf(stderr, "stream_hazard: no CUDA device\n");
    return 1;
  }

  Device dev(0);
  Transfer xfer(dev);
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("device: %s (sm_%d%d, %d SMs), driver %d, runtime %d\n", dev.info().name.c_str(),
              dev.info().cc_major, dev.info().cc_minor, dev.info().sm_count, driver, runtime);

  DeviceBuffer table = dev.alloc(kTableBytes, "residency table");
  const int max_trials = std::max(o.trials, o.delay_trials);
  unsigned* counts = nullptr;  // counts [max_trials] uint32: old entries seen per trial
  CUDA_CHECK(cudaMalloc(&counts, max_trials * sizeof(unsigned)));
  std::vector<int> host(kEntries);  // pageable, as in the report
  std::vector<unsigned> h_counts(max_trials);
  std::vector<double> copy_us(max_trials);  // per trial: how long the copy call blocked the host

  cudaStream_t nonblocking = nullptr, blocking = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreate(&blocking));
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> jitter(100.0, 200.0);
  const dim3 grid((kEntries + 255) / 256), block(256);

  auto plain = [&](cudaStream_t reader, double delay_us, bool sync0) {
    return [&, reader, delay_us, sync0](int gen, int trial) {
      auto c0 = Clock::now();
      CUDA_CHECK(cudaMemcpy(table.data(), host.data(), kTableBytes, cudaMemcpyHostToDevice));
      copy_us[trial] = std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
      if (sync0) CUDA_CHECK(cudaStreamSynchronize(nullptr));
      double d = delay_us < 0 ? jitter(rng) : delay_us;
      if (d > 0) spin_us(d);
      check_table<<<grid, block, 0, reader>>>(table.as<int>(), gen, trial, counts);
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(cudaStreamSynchronize(reader));
    };
  };
  auto module = [&](int gen, int trial) {
    auto c0 = Clock::now();
    xfer.upload(table.span(), host.data(), kTableBytes, dev.compute(), {&dev.compute()});
    copy_us[trial] = std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
    note_launch(dev.compute(), {table.span()}, {});
    check_table<<<grid, block, 0, dev.compute().handle()>>>(table.as<int>(), gen, trial, counts);
    CUDA_CHECK_LAUNCH();
    dev.compute().synchronize();
  };

  std::vector<Arm> arms = {
      {"plain copy + non-blocking reader", o.trials, plain(nonblocking, 0, false)},
      {"+ cudaStreamSynchronize(nullptr) after copy", o.trials, plain(nonblocking, 0, true)},
      {"reader on a blocking stream", o.trials, plain(blocking, 0, false)},
      {"host delay 0 us", o.delay_trials, plain(nonblocking, 0, false)},
      {"host delay 10 us", o.delay_trials, plain(nonblocking, 10, false)},
      {"host delay 20 us", o.delay_trials, plain(nonblocking, 20, false)},
      {"host delay 50 us", o.delay_trials, plain(nonblocking, 50, false)},
      {"host delay 100-200 us", o.delay_trials, plain(nonblocking, -1, false)},
      {"transfer module (strata::cuda::Transfer)", o.trials, module},
  };

  // results[busy][arm][run]
  std::vector<std::vector<std::vector<ArmResult>>> results(
      2, std::vector<std::vector<ArmResult>>(arms.size(), std::vector<ArmResult>(o.runs)));
  int gen = 0;
  double bulk_gbps = 0;
  for (int busy = 0; busy < 2; ++busy) {
    std::unique_ptr<BulkUpload> bulk;
    auto bulk_t0 = Clock::now();
    if (busy) bulk = std::make_unique<BulkUpload>(o.bulk_mib << 20, o.chunk_mib << 20);
    for (int run = 0; run < o.runs; ++run) {
      for (size_t a = 0; a < arms.size(); ++a) {
        CUDA_CHECK(cudaMemset(counts, 0, max_trials * sizeof(unsigned)));
        CUDA_CHECK(cudaDeviceSynchronize());
        ArmResult& r = results[busy][a][run];
        auto t0 = Clock::now();
        int t = 0;
        for (; t < arms[a].trials; ++t) {
          if (std::chrono::duration<double>(Clock::now() - t0).count() > o.max_seconds) break;
          if (bulk) bulk->top_up();
          ++gen;
          std::fill(host.begin(), host.end(), gen);
          arms[a].run(gen, t);
        }
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h_counts.data(), counts, t * sizeof(unsigned), cudaMemcpyDeviceToHost));
        r.trials = t;
        double sum = 0, cs = 0, cf = 0;
        for (int k = 0; k < t; ++k)
          if (h_counts[k] > 0) {
            ++r.stale;
            sum += h_counts[k];
            cs += copy_us[k];
          } else {
            cf += copy_us[k];
          }
        r.stale_entries_mean = r.stale ? sum / r.stale : 0;
        r.copy_us_stale = r.stale ? cs / r.stale : 0;
        r.copy_us_fresh = t > r.stale ? cf / (t - r.stale) : 0;
        r.us_per_trial = t ? secs * 1e6 / t : 0;
        std::fprintf(stderr, "[%s] run %d %-45s stale %d/%d (%.1f us/trial)\n", busy ? "busy" : "idle", run + 1,
                     arms[a].name.c_str(), r.stale, r.trials, r.us_per_trial);
      }
    }
    if (bulk) {
      bulk->drain();
      double s = std::chrono::duration<double>(Clock::now() - bulk_t0).count();
      bulk_gbps = bulk->completed_bytes() / s / 1e9;
    }
  }

  std::printf("\ntable: int32 [%d][%d] = %zu bytes, pageable host source; reader checks every entry\n", kLayers,
              kExperts, kTableBytes);
  std::printf("busy = another non-blocking stream keeps %zu MiB of pinned async H2D upload in flight (%zu MiB "
              "chunks; it moved %.1f GB/s on average during the busy arms)\n\n",
              o.bulk_mib, o.chunk_mib, bulk_gbps);
  std::printf("| arm | copy engine |");
  for (int run = 0; run < o.runs; ++run) std::printf(" run %d stale/trials |", run + 1);
  std::printf(" old entries per stale launch (mean, all runs) | us per trial (run 1) |"
              " copy call returned after, us (run 1: stale / fresh trials) |\n|---|---|");
  for (int run = 0; run < o.runs; ++run) std::printf("---|");
  std::printf("---|---|---|\n");
  for (int busy = 0; busy < 2; ++busy)
    for (size_t a = 0; a < arms.size(); ++a) {
      std::printf("| %s | %s |", arms[a].name.c_str(), busy ? "busy" : "idle");
      double sum = 0;
      int stale = 0;
      for (int run = 0; run < o.runs; ++run) {
        const ArmResult& r = results[busy][a][run];
        std::printf(" %d / %d |", r.stale, r.trials);
        sum += r.stale_entries_mean * r.stale;
        stale += r.stale;
      }
      const ArmResult& r1 = results[busy][a][0];
      std::printf(" %.0f | %.1f | %s / %.1f |\n", stale ? sum / stale : 0.0, r1.us_per_trial,
                  r1.stale ? one_decimal(r1.copy_us_stale).c_str() : "-", r1.copy_us_fresh);
    }
  int module_stale = 0;
  for (int busy = 0; busy < 2; ++busy)
    for (int run = 0; run < o.runs; ++run) module_stale += results[busy][arms.size() - 1][run].stale;
  std::printf("\ntransfer module stale launches, all runs: %d\n", module_stale);

  CUDA_CHECK(cudaStreamDestroy(nonblocking));
  CUDA_CHECK(cudaStreamDestroy(blocking));
  CUDA_CHECK(cudaFree(counts));
  return module_stale == 0 ? 0 : 3;
}
