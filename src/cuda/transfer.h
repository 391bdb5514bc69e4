#pragma once
// The transfer module (issue 8): every copy or fill of memory that another stream reads goes through
// here — residency-table uploads, expert uploads into slots, activations to/from the CPU pool, KV
// offload/restore. Each call, on the calling thread, at call time:
//   1. records an event on the producer stream (also when it is the legacy stream 0: never skipped),
//   2. makes the copy stream wait on it,
//   3. enqueues the copy on the copy stream (pageable host memory is staged through pinned buffers that
//      are not refilled before the copy that read them has completed),
//   4. records the copy's completion event and makes every consumer stream wait on it,
//   5. returns a Ticket with that event, for the host (CPU pool, KV restore) to wait on.
// The producer is the stream whose work so far must precede the copy: the one that wrote the source, or
// the one whose kernels may still read the destination's old contents (slot overwrite).
//
// Thread-safe (one mutex): the adaptation helper thread and the forward pass may both call it.
// No CUDA headers here.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/device.h"

namespace strata::cuda {

// Completion of one transfer. Copyable (shares the event); the event returns to the pool when the last
// Ticket for it is gone.
class Ticket {
 public:
  Ticket() = default;
  void wait() const;  // host blocks until the transfer is done; the host is then ordered after it
  bool done() const;  // non-blocking; true = done (and ordered, as wait())
  bool valid() const { return event_ != nullptr; }
  const Event& event() const { return *event_; }

 private:
  friend class Transfer;
  explicit Ticket(std::shared_ptr<Event> e) : event_(std::move(e)) {}
  std::shared_ptr<Event> event_;
};

using Consumers = std::initializer_list<Stream*>;

// Hand-offs between the host and work already enqueued on a stream, through flags in pinned memory that
// kernels read and write in place: for a pass enqueued whole (one CUDA graph) before the host does its
// part of it (the CPU pool of a decode pass, docs/gpu.md "Gated passes"). Index i has
//   a signal, raised by the stream (Transfer::download_signaled) and awaited by the host (wait_signal);
//   a gate, opened by the host (open) and awaited by a kernel on the stream (Transfer::upload_gated).
// Why: the host then makes no CUDA call between a layer's CPU work and the next, and the GPU starts the
// next layer as soon as the gate opens, without waiting for launches.
// For the checker a signal is an event: recorded on the stream where the signaling copy is noted, synced
// by wait_signal. A gate needs no identity: the work it releases is noted after open() (PauseNotes).
class HostGates {
 public:
  HostGates(Device& dev, int n, const std::string& name);
  ~HostGates();
  HostGates(const HostGates&) = delete;
  HostGates& operator=(const HostGates&) = delete;
  int size() const { return n_; }

  // Lowers every signal and closes every gate. Only while no kernel that uses them can still run (the
  // stream drained since its last use).
  void reset();
  // Returns once signal i is raised; the host is then ordered after the stream's work before it. While
  // it waits it spins; after ~2 ms it also asks the stream: a CUDA error there ends as CUDA_CHECK does,
  // and a stream that went idle without raising the signal is a strata::Error.
  void wait_signal(int i, const Stream& s);
  bool signaled(int i) const;
  // Opens gate i: the gated kernel goes on and copies. Call after the host's last write of its source.
  void open(int i);
  // Opens every gate not yet opened with "abort": their kernels skip the copy. For a pass that threw
  // half-way: the stream then runs to its end, and the caller synchronizes it before reset().
  void abort_rest();
  // After the stream drained: a strata::Error if a gated kernel gave up waiting for its gate (20 s: a
  // host that never opened it, or a tool that serializes the host with the GPU). Its copy was skipped.
  void check() const;

 private:
  friend class Transfer;
  uint32_t* signal_ptr(int i) const;  // pinned; the device reads/writes the same address (unified addressing)
  uint32_t* gate_ptr(int i) const;
  uint32_t* timeout_ptr(int i) const;
  int n_;
  PinnedBuffer flags_;  // [3][n] uint32: signals, gates (0 = down / closed), gated kernels that gave up
  std::vector<stream_check::EventId> events_;  // [n] the signals, for the checker
  std::vector<uint8_t> opened_;                // [n] host: gate i opened since reset()
};

class Transfer {
 public:
  struct Options {
    size_t staging_bytes = size_t(4) << 20;  // per pinned staging buffer
    int staging_buffers = 4;                  // ring size
  };
  explicit Transfer(Device& dev);
  Transfer(Device& dev, Options opt);
  ~Transfer();  // waits for its copy streams
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // Host -> device from any host memory (pageable or not): always staged, so `src` may be reused as soon
  // as this returns. For the residency table and other small shared tables.
  Ticket upload(const DevSpan& dst, const void* src, size_t bytes, Stream& producer, Consumers consumers,
                Site site = Site::here());
  // Host -> device from pinned memory, read directly by the DMA (expert uploads into slots, KV restore).
  // The host must not rewrite `src` before the ticket is done (the checker reports it if it does).
  Ticket upload(const DevSpan& dst, const HostSpan& src, Stream& producer, Consumers consumers,
                Site site = Site::here());
  // Device -> pinned host (activations to the CPU pool, KV offload). Read `dst` after ticket.wait().
  Ticket download(const HostSpan& dst, const DevSpan& src, Stream& producer, Consumers consumers = {},
                  Site site = Site::here());
  // Several device -> pinned host copies after one producer point, with one completion (one event
  // record, one wait, n copies, one record: a CPU-pool layer's ids, weights and activations).
  struct DownloadPart {
    HostSpan dst;
    DevSpan src;
  };
  Ticket download(std::initializer_list<DownloadPart> parts, Stream& producer, Consumers consumers = {},
                  Site site = Site::here());
  // Same-stream transfers of small data through pinned host memory, which the GPU reads and writes in place
  // (unified addressing): a copy kernel on the stream that produced the data (download) or consumes it
  // (upload), no copy stream. Why: a CPU-pool layer sends its routing down and its partial sum up, a few
  // KB each, on the critical path of every layer; through the copy streams each is five API calls and
  // two cross-stream hops (H200 box, 25% resident decode: ~2 ms a token of host time outside the pool).
  // Ordered by construction, like the copies above:
  //   download_mapped: the kernel follows everything enqueued on `producer`; the ticket's event follows the
  //     kernel; the host reads `dst` after ticket.wait().
  //   upload_mapped: the kernel is enqueued on `consumer` after the host's writes to `src` (program order)
  //     and before the consumer's later work; the host must not rewrite `src` before the ticket is done.
  // Where mapped() is false (no unified addressing, or STRATA_CUDA_MAPPED_IO=0), or the parts hold more than
  // kMappedMaxBytes in all (a prefill's activations: there the DMA engines are faster than a kernel's
  // loads and stores across PCIe), both take the copy-stream route above (download / upload with
  // consumers = {&consumer}); takes_mapped_route says which.
  static constexpr size_t kMappedMaxBytes = size_t(256) << 10;
  static bool takes_mapped_route(bool mapped, size_t total_bytes) { return mapped && total_bytes <= kMappedMaxBytes; }
  Ticket download_mapped(std::initializer_list<DownloadPart> parts, Stream& producer, Site site = Site::here());
  Ticket upload_mapped(const DevSpan& dst, const HostSpan& src, Stream& consumer, Site site = Site::here());
  bool mapped() const { return mapped_; }

  // The mapped route's copies for a pass enqueued before the host does its part (HostGates). Each copy
  // takes two calls: enqueue = true enqueues its kernel (inside the capture of the pass, under
  // PauseNotes; nothing counted); enqueue = false accounts for it where the host releases it (before the
  // pass's first wait, or right after the gate before it opened): the checker's notes and the byte
  // totals, once per run of the pass.
  //   download_signaled: one block on `producer` copies the parts into pinned host memory, then raises
  //     signal i of `gates`. The host reads the parts after gates.wait_signal(i).
  //   upload_gated: a kernel on `consumer` waits until gate i of `gates` is open, then copies src (pinned)
  //     into dst, or with GatedWrite::AddF32 adds it (f32) to what dst holds: the CPU pool's partial sum
  //     into the residual stream, without a kernel more on the layer's critical path. Nothing for a gate
  //     aborted. The host writes src, then opens the gate; it rewrites src only after a signal raised
  //     later on `consumer`.
  // Both need mapped() and at most kMappedMaxBytes (a strata::Error otherwise): there is no copy-stream
  // fallback for work that waits for the host inside a graph.
  void download_signaled(std::initializer_list<DownloadPart> parts, Stream& producer, HostGates& gates, int i,
                         bool enqueue, Site site = Site::here());
  enum class GatedWrite { Copy, AddF32 };
  void upload_gated(const DevSpan& dst, const HostSpan& src, Stream& consumer, HostGates& gates, int i,
                    bool enqueue, GatedWrite how = GatedWrite::Copy, Site site = Site::here());

  // Device -> any host memory, staged; returns when the data is in `dst`.
  void download_sync(void* dst, const DevSpan& src, size_t bytes, Stream& producer, Site site = Site::here());
  // Device -> device (KV compaction, slot moves).
  Ticket copy(const DevSpan& dst, const DevSpan& src, Stream& producer, Consumers consumers,
              Site site = Site::here());
  // Sets every byte of dst to `value`.
  Ticket fill(const DevSpan& dst, unsigned char value, Stream& producer, Consumers consumers,
              Site site = Site::here());

  Device& device() { return dev_; }
  // Totals since construction, for `strata run/bench` statistics.
  size_t bytes_h2d() const { return bytes_h2d_; }
  size_t bytes_d2h() const { return bytes_d2h_; }
  size_t bytes_d2d() const { return bytes_d2d_; }

 private:
  struct Staging {
    PinnedBuffer buf;
    Event done;        // recorded after the copy that last used buf
    bool used = false;
  };
  void begin(Stream& copy_stream, Stream& producer);  // steps 1-2
  Ticket finish(Stream& copy_stream, Consumers consumers);  // step 4
  std::shared_ptr<Event> acquire_event();
  Staging& next_staging();  // waits until the next ring buffer's previous copy is done

  Device& dev_;
  Options opt_;
  std::mutex mu_;
  Event producer_event_;
  std::vector<std::shared_ptr<Event>> events_;  // pool for tickets
  std::vector<std::unique_ptr<Staging>> staging_;
  size_t next_stage_ = 0;
  size_t bytes_h2d_ = 0, bytes_d2h_ = 0, bytes_d2d_ = 0;
  bool mapped_ = false;  // the mapped route is taken (see download_mapped)
};

}  // namespace strata::cuda
