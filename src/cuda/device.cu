#include "cuda/device.h"

#include <utility>

#include "common/error.h"
#include "cuda/cuda_check.cuh"

namespace strata::cuda {

namespace sc = strata::stream_check;

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// ---- Stream ----
void Stream::wait(const Event& e) const {
  CUDA_CHECK(cudaStreamWaitEvent(handle_, e.handle(), 0));
  if (sc::enabled()) sc::global().on_wait(check_id_, e.check_id());
}

void Stream::synchronize() const {
  CUDA_CHECK(cudaStreamSynchronize(handle_));
  if (sc::enabled()) sc::global().on_host_sync_stream(check_id_);
}

Stream::~Stream() {
  if (owned_ && handle_ != nullptr) cudaStreamDestroy(handle_);  // no check: may run at teardown
  sc::global().remove_stream(check_id_);
}

// ---- Event ----
Event::Event(std::string name) {
  CUDA_CHECK(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming));
  // Registered even when checking is off: cheap, and a later set_enabled(true) then sees it.
  check_id_ = sc::global().add_event(std::move(name));
  checked_ = true;
}

void Event::release() {
  if (handle_ != nullptr) cudaEventDestroy(handle_);
  if (checked_) sc::global().remove_event(check_id_);
  handle_ = nullptr;
  checked_ = false;
}

Event::~Event() { release(); }

Event::Event(Event&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), check_id_(o.check_id_),
      checked_(std::exchange(o.checked_, false)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    release();
    handle_ = std::exchange(o.handle_, nullptr);
    check_id_ = o.check_id_;
    checked_ = std::exchange(o.checked_, false);
  }
  return *this;
}

void Event::record(const Stream& s) {
  CUDA_CHECK(cudaEventRecord(handle_, s.handle()));
  if (sc::enabled()) sc::global().on_record(check_id_, s.check_id());
}

void Event::synchronize() const {
  CUDA_CHECK(cudaEventSynchronize(handle_));
  if (sc::enabled()) sc::global().on_host_sync_event(check_id_);
}

bool Event::query() const {
  cudaError_t err = cudaEventQuery(handle_);
  if (err == cudaErrorNotReady) return false;
  CUDA_CHECK(err);
  if (sc::enabled()) sc::global().on_host_sync_event(check_id_);
  return true;
}

// ---- Region ----
Region::Region(void* ptr, size_t bytes, std::string name)
    : ptr_(ptr), bytes_(bytes), check_id_(sc::global().add_buffer(std::move(name))) {}

Region::~Region() {
  if (check_id_ != sc::kNoBuffer) sc::global().remove_buffer(check_id_);
}

Region::Region(Region&& o) noexcept
    : ptr_(o.ptr_), bytes_(o.bytes_), check_id_(std::exchange(o.check_id_, sc::kNoBuffer)) {}

Region& Region::operator=(Region&& o) noexcept {
  if (this != &o) {
    if (check_id_ != sc::kNoBuffer) sc::global().remove_buffer(check_id_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    check_id_ = std::exchange(o.check_id_, sc::kNoBuffer);
  }
  return *this;
}

// ---- DeviceBuffer ----
void DeviceBuffer::release() {
  if (ptr_ != nullptr) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    cudaFree(ptr_);  // implicitly synchronizes the device: no kernel can still use it
    cudaSetDevice(prev);
  }
  if (check_id_ != sc::kNoBuffer) sc::global().remove_buffer(check_id_);
  ptr_ = nullptr;
  bytes_ = 0;
  check_id_ = sc::kNoBuffer;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_),
      name_(std::move(o.name_)), check_id_(std::exchange(o.check_id_, sc::kNoBuffer)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
    name_ = std::move(o.name_);
    check_id_ = std::exchange(o.check_id_, sc::kNoBuffer);
  }
  return *this;
}

Region DeviceBuffer::region(size_t offset, size_t bytes, std::string name) const {
  STRATA_REQUIRE(offset <= bytes_ && bytes <= bytes_ - offset,
                 "region [{}, +{}) is outside buffer '{}' of {} bytes", offset, bytes, name_, bytes_);
  return Region(static_cast<char*>(ptr_) + offset, bytes, std::move(name));
}

// ---- PinnedBuffer ----
void PinnedBuffer::release() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  if (check_id_ != sc::kNoBuffer) sc::global().remove_buffer(check_id_);
  ptr_ = nullptr;
  bytes_ = 0;
  check_id_ = sc::kNoBuffer;
}

PinnedBuffer::~PinnedBuffer() { release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), name_(std::move(o.name_)),
      check_id_(std::exchange(o.check_id_, sc::kNoBuffer)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    name_ = std::move(o.name_);
    check_id_ = std::exchange(o.check_id_, sc::kNoBuffer);
  }
  return *this;
}

void PinnedBuffer::note_host_access(sc::Access a, Site site) const {
  if (sc::enabled()) sc::global().on_host_access(check_id_, a, site);
}

// ---- Device ----
Device::Device(int ordinal) {
  int n = device_count();
  STRATA_REQUIRE(ordinal >= 0 && ordinal < n, "GPU {} requested but {} CUDA device(s) found", ordinal, n);
  info_.ordinal = ordinal;
  CUDA_CHECK(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  info_.name = prop.name;
  info_.total_bytes = prop.totalGlobalMem;
  info_.sm_count = prop.multiProcessorCount;
  info_.cc_major = prop.major;
  info_.cc_minor = prop.minor;

  legacy_.reset(new Stream());
  legacy_->handle_ = cudaStreamLegacy;  // explicit: independent of --default-stream per-thread
  legacy_->name_ = "gpu" + std::to_string(ordinal) + ".legacy(stream 0)";
  legacy_->legacy_ = true;
  legacy_->device_ = ordinal;
  legacy_->check_id_ = sc::global().add_stream(legacy_->name_, sc::StreamKind::Legacy);

  int lo = 0, hi = 0;  // numerically lower = higher priority
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  // Why: decode kernels should not queue behind nothing-urgent copies' completion work.
  compute_ = make_stream("compute", false, hi);
  h2d_ = make_stream("h2d", false, lo);
  d2h_ = make_stream("d2h", false, lo);
}

Device::~Device() {
  cudaSetDevice(info_.ordinal);
  cudaDeviceSynchronize();
  extra_.clear();
  compute_.reset();
  h2d_.reset();
  d2h_.reset();
  legacy_.reset();
}

std::unique_ptr<Stream> Device::make_stream(std::string name, bool blocking, int priority) {
  std::unique_ptr<Stream> s(new Stream());
  CUDA_CHECK(cudaSetDevice(info_.ordinal));
  CUDA_CHECK(cudaStreamCreateWithPriority(&s->handle_, blocking ? cudaStreamDefault : cudaStreamNonBlocking,
                                          priority));
  s->name_ = "gpu" + std::to_string(info_.ordinal) + "." + name;
  s->owned_ = true;
  s->device_ = info_.ordinal;
  s->check_id_ =
      sc::global().add_stream(s->name_, blocking ? sc::StreamKind::Blocking : sc::StreamKind::NonBlocking);
  return s;
}

Stream& Device::add_stream(std::string name, bool blocking, int priority) {
  extra_.push_back(make_stream(std::move(name), blocking, priority));
  return *extra_.back();
}

size_t Device::free_bytes() const {
  make_current();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

void Device::make_current() const { CUDA_CHECK(cudaSetDevice(info_.ordinal)); }

DeviceBuffer Device::alloc(size_t bytes, std::string name) {
  make_current();
  DeviceBuffer b;
  cudaError_t err = cudaMalloc(&b.ptr_, bytes == 0 ? 1 : bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free allocation error
    fail("GPU {}: cannot allocate {} bytes for '{}' ({} bytes free of {})", info_.ordinal, bytes, name,
         free_bytes(), info_.total_bytes);
  }
  CUDA_CHECK(err);
  b.bytes_ = bytes;
  b.device_ = info_.ordinal;
  b.name_ = std::move(name);
  b.check_id_ = sc::global().add_buffer(b.name_);
  return b;
}

PinnedBuffer Device::alloc_pinned(size_t bytes, std::string name) {
  PinnedBuffer b;
  cudaError_t err = cudaHostAlloc(&b.ptr_, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    fail("cannot allocate {} bytes of pinned host memory for '{}'", bytes, name);
  }
  CUDA_CHECK(err);
  b.bytes_ = bytes;
  b.name_ = std::move(name);
  b.check_id_ = sc::global().add_buffer(b.name_);
  return b;
}

void Device::synchronize() {
  make_current();
  CUDA_CHECK(cudaDeviceSynchronize());
  if (sc::enabled()) sc::global().on_host_sync_device();
}

void note_launch(const Stream& s, std::initializer_list<DevSpan> reads, std::initializer_list<DevSpan> writes,
                 Site site) {
  if (!sc::enabled()) return;
  std::vector<sc::BufferId> r, w;
  r.reserve(reads.size());
  w.reserve(writes.size());
  for (const DevSpan& d : reads) r.push_back(d.check_id);
  for (const DevSpan& d : writes) w.push_back(d.check_id);
  sc::global().on_launch(s.check_id(), r, w, site);
}

}  // namespace strata::cuda
