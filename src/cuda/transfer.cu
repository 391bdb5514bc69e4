// The one place in src/ that calls cudaMemcpy*/cudaMemset* (tests/test_cuda_contract.cpp enforces it).
#include "cuda/transfer.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "cuda/cuda_check.cuh"

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

Ticket Transfer::download_mapped(std::initializer_list<DownloadPart> parts, Stream& producer, Site site) {
  size_t total = 0;
  for (const DownloadPart& p : parts) total += p.src.bytes;
  if (!takes_mapped_route(mapped_, total) || parts.size() > size_t(kMaxMappedParts))
    return download(parts, producer, {}, site);
  MappedParts mp{};
  for (const DownloadPart& p : parts) {
    STRATA_REQUIRE(p.src.bytes <= p.dst.bytes, "transfer: download of {} bytes into a {}-byte host buffer",
                   p.src.bytes, p.dst.bytes);
    STRATA_REQUIRE(p.dst.pinned, "transfer: a mapped download needs pinned host memory");
    mp.src[mp.n] = p.src.ptr;
    mp.dst[mp.n] = p.dst.ptr;
    mp.bytes[mp.n] = p.src.bytes;
    ++mp.n;
  }
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
