#pragma once
// One object per GPU that owns its streams, events and memory (issue 7). The only place in strata that
// creates streams (the static contract test in tests/test_cuda_contract.cpp enforces it). Copies that
// cross streams go through src/cuda/transfer.h, never through raw cudaMemcpy*.
//
// Free of CUDA headers, so host code (engine, CLI) can hold a Device: CUDA's handle types are pointers
// to opaque structs, declared here the same way cuda_runtime.h declares them.
//
// Every operation that orders or touches memory also feeds the stream-order checker
// (cuda/host/stream_check.h) when STRATA_STREAM_CHECK is on; off, each hook is one branch.
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "cuda/host/stream_check.h"

struct CUstream_st;
struct CUevent_st;

namespace strata::cuda {

using StreamHandle = CUstream_st*;  // == cudaStream_t
using EventHandle = CUevent_st*;    // == cudaEvent_t
using stream_check::Site;

class Device;
class Event;

// Number of CUDA devices (0 when there is no driver or no GPU).
int device_count();

// A stream owned by a Device (or the legacy default stream). Lives as long as its Device.
class Stream {
 public:
  StreamHandle handle() const { return handle_; }
  const std::string& name() const { return name_; }
  stream_check::AgentId check_id() const { return check_id_; }
  bool is_legacy() const { return legacy_; }
  int device() const { return device_; }

  void wait(const Event& e) const;  // cudaStreamWaitEvent: later work on this stream runs after e
  void synchronize() const;         // host waits for all work enqueued so far

  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

 private:
  friend class Device;
  Stream() = default;
  StreamHandle handle_ = nullptr;
  std::string name_;
  stream_check::AgentId check_id_ = 0;
  bool legacy_ = false;
  bool owned_ = false;
  int device_ = 0;
};

// A CUDA event (timing disabled) with a checker identity. Move-only.
class Event {
 public:
  explicit Event(std::string name = "event");
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& s);  // captures all work enqueued on s so far
  void synchronize() const;      // host waits until the captured work is done
  bool query() const;            // true when done (and then the host is ordered after it)
  EventHandle handle() const { return handle_; }
  stream_check::EventId check_id() const { return check_id_; }

 private:
  void release();
  EventHandle handle_ = nullptr;
  stream_check::EventId check_id_ = 0;
  bool checked_ = false;
};

// A view of device memory that the checker knows as one buffer (check_id 0 = unchecked).
struct DevSpan {
  void* ptr = nullptr;
  size_t bytes = 0;
  stream_check::BufferId check_id = stream_check::kNoBuffer;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// A view of host memory; pinned = page-locked (cudaHostAlloc), which async copies may read directly.
struct HostSpan {
  void* ptr = nullptr;
  size_t bytes = 0;
  stream_check::BufferId check_id = stream_check::kNoBuffer;
  bool pinned = false;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// Registers [ptr, ptr+bytes) of a larger allocation (an expert slot, a KV block) as its own checked
// buffer; unregisters on destruction. Do not also access the parent allocation as a whole.
class Region {
 public:
  Region() = default;
  Region(void* ptr, size_t bytes, std::string name);
  ~Region();
  Region(Region&& o) noexcept;
  Region& operator=(Region&& o) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  DevSpan span() const { return {ptr_, bytes_, check_id_}; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  stream_check::BufferId check_id_ = stream_check::kNoBuffer;
};

// Device memory (cudaMalloc), registered with the checker. Move-only; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  DevSpan span() const { return {ptr_, bytes_, check_id_}; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  // A sub-range checked on its own (see Region).
  Region region(size_t offset, size_t bytes, std::string name) const;

 private:
  friend class Device;
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  std::string name_;
  stream_check::BufferId check_id_ = stream_check::kNoBuffer;
};

// Page-locked host memory (cudaHostAlloc), registered with the checker. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  HostSpan span() const { return {ptr_, bytes_, check_id_, true}; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  // Tell the checker the CPU is about to read/write this memory (e.g. refilling a host KV block):
  // reported if a copy that uses it may still be in flight.
  void note_host_access(stream_check::Access a, Site site = Site::here()) const;

 private:
  friend class Device;
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  stream_check::BufferId check_id_ = stream_check::kNoBuffer;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  size_t total_bytes = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};

// One GPU. Creates (and alone creates) its streams:
//  compute: every kernel of the forward pass; h2d / d2h: the transfer module's copy streams.
// All three are cudaStreamNonBlocking, so the legacy default stream never orders them implicitly;
// legacy() stands for stream 0 where a caller must name it (e.g. as a transfer's producer).
class Device {
 public:
  explicit Device(int ordinal = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  int ordinal() const { return info_.ordinal; }
  size_t free_bytes() const;
  void make_current() const;  // cudaSetDevice(ordinal)

  Stream& compute() { return *compute_; }
  Stream& h2d() { return *h2d_; }
  Stream& d2h() { return *d2h_; }
  Stream& legacy() { return *legacy_; }
  // A further stream (e.g. a helper thread's); owned by the Device. `blocking` = ordered with stream 0.
  Stream& add_stream(std::string name, bool blocking = false, int priority = 0);

  // Throws strata::Error when the memory is not there (says how much was asked and is free).
  DeviceBuffer alloc(size_t bytes, std::string name);
  PinnedBuffer alloc_pinned(size_t bytes, std::string name);

  void synchronize();  // cudaDeviceSynchronize

 private:
  std::unique_ptr<Stream> make_stream(std::string name, bool blocking, int priority);
  DeviceInfo info_;
  std::unique_ptr<Stream> legacy_, compute_, h2d_, d2h_;
  std::vector<std::unique_ptr<Stream>> extra_;
};

// A kernel launch's accesses, for the checker (call it next to the launch, same stream):
//   note_launch(dev.compute(), {table.span()}, {out.span()});
void note_launch(const Stream& s, std::initializer_list<DevSpan> reads, std::initializer_list<DevSpan> writes,
                 Site site = Site::here());

}  // namespace strata::cuda
