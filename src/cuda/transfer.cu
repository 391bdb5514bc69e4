// The one place in src/ that calls cudaMemcpy*/cudaMemset* (tests/test_cuda_contract.cpp enforces it).
#include "cuda/transfer.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <chrono>

#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"

namespace strata::cuda {

namespace sc = strata::stream_check;

namespace {
void note(const Stream& s, sc::BufferId b, sc::Access a, Site site) {
  if (sc::enabled()) sc::global().on_stream_access(s.check_id(), b, a, site);
}
void note_host(sc::BufferId b, sc::Access a, Site site) {
  if (sc::enabled()) sc::global().on_host_access(b, a, site);
}
// Up to kMaxMappedParts copies (src -> dst, `bytes` each) in one launch; 4-byte words where both ends and
// the size allow (the pool's ids, weights and activations), else bytes. Grid-stride over each part.
constexpr int kMaxMappedParts = 4;
struct MappedParts {
  const void* src[kMaxMappedParts];
  void* dst[kMaxMappedParts];
  size_t bytes[kMaxMappedParts];
  int n;
};
__global__ void mapped_copy_kernel(MappedParts p) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (int k = 0; k < p.n; ++k) {
    const bool words = ((reinterpret_cast<uintptr_t>(p.src[k]) | reinterpret_cast<uintptr_t>(p.dst[k]) | p.bytes[k]) & 3) == 0;
    if (words) {
      const auto* s = static_cast<const uint32_t*>(p.src[k]);
      auto* d = static_cast<uint32_t*>(p.dst[k]);
      for (size_t i = tid; i < p.bytes[k] / 4; i += stride) d[i] = s[i];
    } else {
      const auto* s = static_cast<const unsigned char*>(p.src[k]);
      auto* d = static_cast<unsigned char*>(p.dst[k]);
      for (size_t i = tid; i < p.bytes[k]; i += stride) d[i] = s[i];
    }
  }
}
void launch_mapped_copy(const MappedParts& p, size_t total_bytes, cudaStream_t s) {
  const unsigned blocks = unsigned(std::min<size_t>(64, std::max<size_t>(1, total_bytes / 4 / 256)));
  mapped_copy_kernel<<<blocks, 256, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}
// Flags of HostGates: 0 = down / closed; a raised signal and an open gate are kFlagUp; an aborted gate
// kGateAborted. System-scope acquire / release: the flags and the data they guard are in host memory
// that the GPU reads and writes across PCIe.
constexpr uint32_t kFlagUp = 1, kGateAborted = 2;
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The parts into host memory (one block), then the signal. Every thread's stores are made visible to the
// host (fence) before the barrier after which thread 0 raises the signal. Launched with PDL where the
// stream's kernels are (pdl.cuh): it is on the GPU when the router ends, and the next kernel launches
// while it copies.
__global__ void signaled_copy_kernel(MappedParts p, uint32_t* signal) {
  pdl_wait();
  pdl_launch_dependents();
  for (int k = 0; k < p.n; ++k) {
    const bool words = ((reinterpret_cast<uintptr_t>(p.src[k]) | reinterpret_cast<uintptr_t>(p.dst[k]) | p.bytes[k]) & 3) == 0;
    if (words) {
      const auto* s = static_cast<const uint32_t*>(p.src[k]);
      auto* d = static_cast<uint32_t*>(p.dst[k]);
      for (size_t i = threadIdx.x; i < p.bytes[k] / 4; i += blockDim.x) d[i] = s[i];
    } else {
      const auto* s = static_cast<const unsigned char*>(p.src[k]);
      auto* d = static_cast<unsigned char*>(p.dst[k]);
      for (size_t i = threadIdx.x; i < p.bytes[k]; i += blockDim.x) d[i] = s[i];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) store_release_sys(signal, kFlagUp);
}
// How long a gated kernel waits for its gate before it gives up (HostGates::check): a host thread that
// never opens it (a bug) or a tool that serializes the host with the GPU must not hang the GPU forever.
constexpr uint64_t kGateTimeoutNs = 20'000'000'000ull;
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Thread 0 of each block polls the gate (acquire); after the barrier each thread copies (or adds) its
// word(s) of src, read with volatile loads (the host wrote them while this kernel was already running:
// nothing may come from a cache). One word per thread where the grid allows: a thread's reads across
// PCIe are then not serialized behind its own earlier ones (each is a round trip of ~1 us).
// A gate still closed after kGateTimeoutNs: nothing is written and `timed_out` is set for the host.
// With PDL the kernel is on the GPU and polling before the kernels ahead of it end (polling reads only
// host memory that no kernel writes); it waits for them (pdl_wait) before it touches dst. It lets the next
// kernel launch before it polls (the one exception to pdl.cuh's "right after pdl_wait"; ordering still
// holds, since the next kernel's pdl_wait waits for this grid to complete): why, that kernel then is on the
// GPU with its weights on the way to L2 while the CPU pool works, instead of launching once the gate opens.
__global__ void gated_copy_kernel(const uint32_t* gate, uint32_t* timed_out, const void* src, void* dst, size_t bytes,
                                  bool add_f32) {
  __shared__ uint32_t state;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    uint32_t g;
    const uint64_t t0 = global_timer_ns();
    while ((g = load_acquire_sys(gate)) == 0) {
      __nanosleep(32);
      if (global_timer_ns() - t0 > kGateTimeoutNs) {
        store_release_sys(timed_out, kFlagUp);
        break;
      }
    }
    state = g;
  }
  __syncthreads();
  pdl_wait();
  if (state != kFlagUp) return;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  if (add_f32) {  // dst [bytes/4] f32 += src (the caller checked the alignment)
    const volatile float* s = static_cast<const volatile float*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = tid; i < bytes / 4; i += stride) d[i] += s[i];
  } else if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | bytes) & 3) == 0) {
    const volatile uint32_t* s = static_cast<const volatile uint32_t*>(src);
    auto* d = static_cast<uint32_t*>(dst);
    for (size_t i = tid; i < bytes / 4; i += stride) d[i] = s[i];
  } else {
    const volatile unsigned char* s = static_cast<const volatile unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for (size_t i = tid; i < bytes; i += stride) d[i] = s[i];
  }
}
bool mapped_io_from_env() {
  const char* e = std::getenv("STRATA_CUDA_MAPPED_IO");
  return e == nullptr || std::strcmp(e, "0") != 0;
}
bool is_pinned(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}
}  // namespace

// ---- HostGates ----
HostGates::HostGates(Device& dev, int n, const std::string& name) : n_(n) {
  STRATA_REQUIRE(n >= 1, "host gates: {} flags, need at least one", n);
  flags_ = dev.alloc_pinned(size_t(3) * size_t(n) * sizeof(uint32_t), name + ".flags");
  for (int i = 0; i < n; ++i) events_.push_back(sc::global().add_event(name + ".signal[" + std::to_string(i) + "]"));
  opened_.assign(size_t(n), 0);
  reset();
}

HostGates::~HostGates() {
  for (sc::EventId e : events_) sc::global().remove_event(e);
}

uint32_t* HostGates::signal_ptr(int i) const {
  STRATA_REQUIRE(i >= 0 && i < n_, "host gates: index {} of {}", i, n_);
  return flags_.as<uint32_t>() + i;
}
uint32_t* HostGates::gate_ptr(int i) const {
  STRATA_REQUIRE(i >= 0 && i < n_, "host gates: index {} of {}", i, n_);
  return flags_.as<uint32_t>() + n_ + i;
}

uint32_t* HostGates::timeout_ptr(int i) const {
  STRATA_REQUIRE(i >= 0 && i < n_, "host gates: index {} of {}", i, n_);
  return flags_.as<uint32_t>() + 2 * n_ + i;
}

void HostGates::check() const {
  for (int i = 0; i < n_; ++i)
    STRATA_REQUIRE(__atomic_load_n(timeout_ptr(i), __ATOMIC_ACQUIRE) == 0,
                   "host gates: the GPU gave up waiting for gate {} after {} s; that pass's results are wrong", i,
                   kGateTimeoutNs / 1'000'000'000ull);
}

void HostGates::reset() {
  for (int i = 0; i < 3 * n_; ++i) __atomic_store_n(flags_.as<uint32_t>() + i, 0u, __ATOMIC_RELAXED);
  std::fill(opened_.begin(), opened_.end(), uint8_t(0));
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

bool HostGates::signaled(int i) const { return __atomic_load_n(signal_ptr(i), __ATOMIC_ACQUIRE) == kFlagUp; }

void HostGates::wait_signal(int i, const Stream& s) {
  const uint32_t* f = signal_ptr(i);
  // Why spin: the signal comes within tens of microseconds (a layer's attention and routing); a sleep
  // would add the scheduler's wake-up to every layer of the pass.
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t k = 1; __atomic_load_n(f, __ATOMIC_ACQUIRE) != kFlagUp; ++k) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (k % 4096 != 0 || std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2)) continue;
    const cudaError_t st = cudaStreamQuery(s.handle());
    if (st == cudaSuccess) {
      STRATA_REQUIRE(__atomic_load_n(f, __ATOMIC_ACQUIRE) == kFlagUp,
                     "host gates: stream '{}' finished without raising signal {}", s.name(), i);
      break;
    }
    if (st != cudaErrorNotReady) CUDA_CHECK(st);
    std::this_thread::yield();  // a slow stream (a debugger, a sanitizer): let other threads run
  }
  if (sc::enabled()) sc::global().on_host_sync_event(events_[size_t(i)]);
}

void HostGates::open(int i) {
  uint32_t* g = gate_ptr(i);
  STRATA_REQUIRE(!opened_[size_t(i)], "host gates: gate {} opened twice", i);
  opened_[size_t(i)] = 1;
  __atomic_store_n(g, kFlagUp, __ATOMIC_RELEASE);  // after the host's writes of what the gated copy reads
}

void HostGates::abort_rest() {
  for (int i = 0; i < n_; ++i)
    if (!opened_[size_t(i)]) {
      opened_[size_t(i)] = 1;
      __atomic_store_n(gate_ptr(i), kGateAborted, __ATOMIC_RELEASE);
    }
}

// ---- Ticket ----
void Ticket::wait() const {
  STRATA_REQUIRE(event_ != nullptr, "waiting on an empty transfer ticket");
  event_->synchronize();
}

bool Ticket::done() const {
  STRATA_REQUIRE(event_ != nullptr, "querying an empty transfer ticket");
  return event_->query();
}

// ---- Transfer ----
Transfer::Transfer(Device& dev) : Transfer(dev, Options{}) {}

Transfer::Transfer(Device& dev, Options opt) : dev_(dev), opt_(opt), producer_event_("transfer.producer") {
  STRATA_REQUIRE(opt_.staging_bytes > 0 && opt_.staging_buffers > 0,
                 "transfer: staging needs at least one buffer of at least one byte");
  for (int i = 0; i < opt_.staging_buffers; ++i) {
    auto st = std::make_unique<Staging>();
    st->buf = dev_.alloc_pinned(opt_.staging_bytes, "transfer.staging[" + std::to_string(i) + "]");
    st->done = Event("transfer.staging[" + std::to_string(i) + "].done");
    staging_.push_back(std::move(st));
  }
  int unified = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, dev_.ordinal()));
  mapped_ = unified != 0 && mapped_io_from_env();
}

Transfer::~Transfer() {
  // Staging buffers and events must outlive the copies that use them.
  cudaStreamSynchronize(dev_.h2d().handle());
  cudaStreamSynchronize(dev_.d2h().handle());
}

void Transfer::begin(Stream& copy_stream, Stream& producer) {
  // Recorded now, on this thread: the copy is ordered after exactly what the producer has enqueued so
  // far. Stream 0 (legacy) is a producer like any other: never skipped (bug 2 of DEVELOPERS.md).
  producer_event_.record(producer);
  copy_stream.wait(producer_event_);
}

std::shared_ptr<Event> Transfer::acquire_event() {
  for (auto& e : events_)
    if (e.use_count() == 1) return e;  // no Ticket holds it any more
  events_.push_back(std::make_shared<Event>("transfer.done#" + std::to_string(events_.size())));
  return events_.back();
}

Ticket Transfer::finish(Stream& copy_stream, Consumers consumers) {
  std::shared_ptr<Event> done = acquire_event();
  done->record(copy_stream);
  for (Stream* c : consumers) {
    STRATA_REQUIRE(c != nullptr, "transfer: null consumer stream");
    c->wait(*done);
  }
  return Ticket(std::move(done));
}

Transfer::Staging& Transfer::next_staging() {
  Staging& st = *staging_[next_stage_];
  next_stage_ = (next_stage_ + 1) % staging_.size();
  // Never refill a pinned buffer whose previous copy may still be reading it.
  if (st.used) st.done.synchronize();
  return st;
}

Ticket Transfer::upload(const DevSpan& dst, const void* src, size_t bytes, Stream& producer,
                        Consumers consumers, Site site) {
  STRATA_REQUIRE(bytes <= dst.bytes, "transfer: upload of {} bytes into a {}-byte buffer", bytes, dst.bytes);
  STRATA_REQUIRE(src != nullptr || bytes == 0, "transfer: upload from a null host pointer");
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.h2d();
  begin(cs, producer);
  note(cs, dst.check_id, sc::Access::Write, site);
  const char* s = static_cast<const char*>(src);
  for (size_t off = 0; off < bytes;) {
    size_t n = std::min(opt_.staging_bytes, bytes - off);
    Staging& st = next_staging();
    note_host(st.buf.span().check_id, sc::Access::Write, site);
    std::memcpy(st.buf.data(), s + off, n);
    note(cs, st.buf.span().check_id, sc::Access::Read, site);
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.ptr) + off, st.buf.data(), n, cudaMemcpyHostToDevice,
                               cs.handle()));
    st.done.record(cs);
    st.used = true;
    off += n;
  }
  bytes_h2d_ += bytes;
  return finish(cs, consumers);
}

Ticket Transfer::upload(const DevSpan& dst, const HostSpan& src, Stream& producer, Consumers consumers,
                        Site site) {
  STRATA_REQUIRE(src.bytes <= dst.bytes, "transfer: upload of {} bytes into a {}-byte buffer", src.bytes,
                 dst.bytes);
  STRATA_REQUIRE(src.pinned, "transfer: direct upload needs pinned host memory (use the staged overload)");
  if (sc::enabled())
    STRATA_REQUIRE(src.bytes == 0 || is_pinned(src.ptr), "transfer: host span marked pinned is not");
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.h2d();
  begin(cs, producer);
  note(cs, src.check_id, sc::Access::Read, site);
  note(cs, dst.check_id, sc::Access::Write, site);
  CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, src.bytes, cudaMemcpyHostToDevice, cs.handle()));
  bytes_h2d_ += src.bytes;
  return finish(cs, consumers);
}

Ticket Transfer::download(const HostSpan& dst, const DevSpan& src, Stream& producer, Consumers consumers,
                          Site site) {
  return download({{dst, src}}, producer, consumers, site);
}

Ticket Transfer::download(std::initializer_list<DownloadPart> parts, Stream& producer, Consumers consumers,
                          Site site) {
  for (const DownloadPart& p : parts) {
    STRATA_REQUIRE(p.src.bytes <= p.dst.bytes, "transfer: download of {} bytes into a {}-byte host buffer",
                   p.src.bytes, p.dst.bytes);
    STRATA_REQUIRE(p.dst.pinned, "transfer: async download needs pinned host memory (use download_sync)");
  }
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.d2h();
  begin(cs, producer);
  for (const DownloadPart& p : parts) {
    note(cs, p.src.check_id, sc::Access::Read, site);
    note(cs, p.dst.check_id, sc::Access::Write, site);
    CUDA_CHECK(cudaMemcpyAsync(p.dst.ptr, p.src.ptr, p.src.bytes, cudaMemcpyDeviceToHost, cs.handle()));
    bytes_d2h_ += p.src.bytes;
  }
  return finish(cs, consumers);
}

namespace {
// The parts of a download through a kernel (`what`: for the errors): each fits its pinned destination, at
// most kMaxMappedParts of them.
MappedParts mapped_parts(std::initializer_list<Transfer::DownloadPart> parts, const char* what) {
  STRATA_REQUIRE(parts.size() <= size_t(kMaxMappedParts), "transfer: {} of {} parts (at most {})", what,
                 parts.size(), kMaxMappedParts);
  MappedParts mp{};
  for (const Transfer::DownloadPart& p : parts) {
    STRATA_REQUIRE(p.src.bytes <= p.dst.bytes, "transfer: download of {} bytes into a {}-byte host buffer",
                   p.src.bytes, p.dst.bytes);
    STRATA_REQUIRE(p.dst.pinned, "transfer: {} needs pinned host memory", what);
    mp.src[mp.n] = p.src.ptr;
    mp.dst[mp.n] = p.dst.ptr;
    mp.bytes[mp.n] = p.src.bytes;
    ++mp.n;
  }
  return mp;
}
size_t total_bytes(std::initializer_list<Transfer::DownloadPart> parts) {
  size_t total = 0;
  for (const Transfer::DownloadPart& p : parts) total += p.src.bytes;
  return total;
}
}  // namespace

Ticket Transfer::download_mapped(std::initializer_list<DownloadPart> parts, Stream& producer, Site site) {
  const size_t total = total_bytes(parts);
  if (!takes_mapped_route(mapped_, total) || parts.size() > size_t(kMaxMappedParts))
    return download(parts, producer, {}, site);
  const MappedParts mp = mapped_parts(parts, "a mapped download");
  std::lock_guard<std::mutex> lk(mu_);
  for (const DownloadPart& p : parts) {
    note(producer, p.src.check_id, sc::Access::Read, site);
    note(producer, p.dst.check_id, sc::Access::Write, site);
  }
  launch_mapped_copy(mp, total, producer.handle());
  bytes_d2h_ += total;
  return finish(producer, {});  // the ticket's event after the copy kernel, on the producer itself
}

Ticket Transfer::upload_mapped(const DevSpan& dst, const HostSpan& src, Stream& consumer, Site site) {
  if (!takes_mapped_route(mapped_, src.bytes)) return upload(dst, src, consumer, {&consumer}, site);
  STRATA_REQUIRE(src.bytes <= dst.bytes, "transfer: upload of {} bytes into a {}-byte buffer", src.bytes, dst.bytes);
  STRATA_REQUIRE(src.pinned, "transfer: a mapped upload needs pinned host memory");
  MappedParts mp{};
  mp.src[0] = src.ptr;
  mp.dst[0] = dst.ptr;
  mp.bytes[0] = src.bytes;
  mp.n = 1;
  std::lock_guard<std::mutex> lk(mu_);
  note(consumer, src.check_id, sc::Access::Read, site);
  note(consumer, dst.check_id, sc::Access::Write, site);
  launch_mapped_copy(mp, src.bytes, consumer.handle());
  bytes_h2d_ += src.bytes;
  return finish(consumer, {});  // the ticket's event after the copy kernel, on the consumer itself
}

void Transfer::download_signaled(std::initializer_list<DownloadPart> parts, Stream& producer, HostGates& gates, int i,
                                 bool enqueue, Site site) {
  const MappedParts mp = mapped_parts(parts, "a signaled download");
  const size_t total = total_bytes(parts);
  STRATA_REQUIRE(takes_mapped_route(mapped_, total),
                 "transfer: a signaled download of {} bytes needs the mapped route (on: {}, at most {} bytes)", total,
                 mapped_, kMappedMaxBytes);
  uint32_t* signal = gates.signal_ptr(i);
  std::lock_guard<std::mutex> lk(mu_);
  if (!enqueue) {
    for (const DownloadPart& p : parts) {
      note(producer, p.src.check_id, sc::Access::Read, site);
      note(producer, p.dst.check_id, sc::Access::Write, site);
    }
    if (sc::enabled()) sc::global().on_record(gates.events_[size_t(i)], producer.check_id());
    bytes_d2h_ += total;
    return;
  }
  pdl::launch(signaled_copy_kernel, dim3(1), dim3(512), 0, producer.handle(), mp, signal);
}

void Transfer::upload_gated(const DevSpan& dst, const HostSpan& src, Stream& consumer, HostGates& gates, int i,
                            bool enqueue, GatedWrite how, Site site) {
  STRATA_REQUIRE(src.bytes <= dst.bytes, "transfer: upload of {} bytes into a {}-byte buffer", src.bytes, dst.bytes);
  const bool add = how == GatedWrite::AddF32;
  STRATA_REQUIRE(!add || ((reinterpret_cast<uintptr_t>(src.ptr) | reinterpret_cast<uintptr_t>(dst.ptr) | src.bytes) & 3) == 0,
                 "transfer: a gated f32 add needs 4-byte aligned buffers and sizes ({} bytes)", src.bytes);
  STRATA_REQUIRE(src.pinned, "transfer: a gated upload needs pinned host memory");
  STRATA_REQUIRE(takes_mapped_route(mapped_, src.bytes),
                 "transfer: a gated upload of {} bytes needs the mapped route (on: {}, at most {} bytes)", src.bytes,
                 mapped_, kMappedMaxBytes);
  const uint32_t* gate = gates.gate_ptr(i);
  std::lock_guard<std::mutex> lk(mu_);
  if (!enqueue) {
    note(consumer, src.check_id, sc::Access::Read, site);
    if (add) note(consumer, dst.check_id, sc::Access::Read, site);
    note(consumer, dst.check_id, sc::Access::Write, site);
    bytes_h2d_ += src.bytes;
    return;
  }
  // A word per thread up to 64 blocks (256 KiB at most: 4 words); each block's thread 0 polls the gate.
  const unsigned blocks = unsigned(std::min<size_t>(64, std::max<size_t>(1, (src.bytes / 4 + 255) / 256)));
  pdl::launch(gated_copy_kernel, dim3(blocks), dim3(256), 0, consumer.handle(), gate, gates.timeout_ptr(i),
              static_cast<const void*>(src.ptr), dst.ptr, src.bytes, add);
}

void Transfer::download_sync(void* dst, const DevSpan& src, size_t bytes, Stream& producer, Site site) {
  STRATA_REQUIRE(bytes <= src.bytes, "transfer: download of {} bytes from a {}-byte buffer", bytes, src.bytes);
  STRATA_REQUIRE(dst != nullptr || bytes == 0, "transfer: download into a null host pointer");
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.d2h();
  begin(cs, producer);
  note(cs, src.check_id, sc::Access::Read, site);
  char* d = static_cast<char*>(dst);
  for (size_t off = 0; off < bytes;) {
    size_t n = std::min(opt_.staging_bytes, bytes - off);
    Staging& st = next_staging();
    note(cs, st.buf.span().check_id, sc::Access::Write, site);
    CUDA_CHECK(cudaMemcpyAsync(st.buf.data(), static_cast<const char*>(src.ptr) + off, n,
                               cudaMemcpyDeviceToHost, cs.handle()));
    st.done.record(cs);
    st.used = true;
    st.done.synchronize();
    note_host(st.buf.span().check_id, sc::Access::Read, site);
    std::memcpy(d + off, st.buf.data(), n);
    off += n;
  }
  bytes_d2h_ += bytes;
}

Ticket Transfer::copy(const DevSpan& dst, const DevSpan& src, Stream& producer, Consumers consumers, Site site) {
  STRATA_REQUIRE(src.bytes <= dst.bytes, "transfer: copy of {} bytes into a {}-byte buffer", src.bytes,
                 dst.bytes);
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.h2d();
  begin(cs, producer);
  note(cs, src.check_id, sc::Access::Read, site);
  note(cs, dst.check_id, sc::Access::Write, site);
  CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, src.bytes, cudaMemcpyDeviceToDevice, cs.handle()));
  bytes_d2d_ += src.bytes;
  return finish(cs, consumers);
}

Ticket Transfer::fill(const DevSpan& dst, unsigned char value, Stream& producer, Consumers consumers, Site site) {
  std::lock_guard<std::mutex> lk(mu_);
  Stream& cs = dev_.h2d();
  begin(cs, producer);
  note(cs, dst.check_id, sc::Access::Write, site);
  CUDA_CHECK(cudaMemsetAsync(dst.ptr, value, dst.bytes, cs.handle()));
  return finish(cs, consumers);
}

}  // namespace strata::cuda
