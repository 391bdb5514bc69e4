#pragma once
// Happens-before checker for GPU streams (issue 8). Pure C++: no CUDA here, so CI (no GPU) unit-tests it
// with simulated streams and events, and the CUDA layer (src/cuda/device.*, transfer.*) feeds it the real
// calls. This header is included from .cu files, so it stays C++17.
//
// Model (vector clocks, one component per "agent"; an agent is a stream or the host):
//  - every op on an agent has the epoch (agent, C_agent[agent]);
//  - whenever an agent's clock is copied elsewhere (event record, host sync, implicit legacy-stream sync,
//    host enqueue), the agent's own component is bumped afterwards, so later ops are not covered;
//  - enqueueing anything on a stream orders it after everything the host has seen. All host threads share
//    one host agent: threads hand work to each other through their own synchronization (the CPU pool
//    reads activations after the main thread waited on their download), which this checker does not
//    see; per-thread host clocks would report those correct hand-offs. Host-vs-host races are TSan's job;
//  - the legacy default stream (stream "0") orders against every *blocking* stream both ways; streams made
//    with cudaStreamNonBlocking do not (that is bug 1 of DEVELOPERS.md);
//  - an access to a registered buffer must be ordered after its last conflicting access (write after
//    anything, read after the last write); otherwise a Report names both call sites.
//
// Cost when off: every hook in the CUDA layer is guarded by stream_check::enabled(), one load of a bool.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata::stream_check {

// A call site. Functions take `Site site = Site::here()`; the default argument captures the caller's
// file:line (GCC, Clang and nvcc's front end all expand __builtin_FILE/__builtin_LINE at the call site).
struct Site {
  const char* file = "?";
  int line = 0;
  static constexpr Site here(const char* f = __builtin_FILE(), int l = __builtin_LINE()) { return Site{f, l}; }
};
std::string to_string(const Site& s);

using AgentId = uint32_t;   // a stream or the host
using EventId = uint32_t;
using BufferId = uint32_t;  // 0 = not registered (accesses to it are not checked)
inline constexpr BufferId kNoBuffer = 0;

enum class Access : uint8_t { Read, Write };

struct Report {
  std::string buffer;      // registered name of the buffer
  Access now_access;       // the access that raced
  std::string now_agent;   // agent name of the racing access
  Site now;                // its call site
  Access before_access;    // the earlier access it is not ordered after
  std::string before_agent;
  Site before;
  std::string message;     // one readable line with all of the above
};

enum class StreamKind : uint8_t {
  Legacy,       // the legacy default stream (handle 0 / cudaStreamLegacy)
  Blocking,     // cudaStreamCreate / cudaStreamDefault: implicitly ordered with Legacy
  NonBlocking,  // cudaStreamNonBlocking: never implicitly ordered with Legacy
};

class Checker {
 public:
  Checker();
  ~Checker();
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;

  // ---- objects ----
  AgentId add_stream(std::string name, StreamKind kind);
  void remove_stream(AgentId s);   // its id is never reused
  EventId add_event(std::string name);
  void remove_event(EventId e);
  BufferId add_buffer(std::string name);
  void remove_buffer(BufferId b);

  // ---- stream-side calls (each is also an enqueue from the calling host thread) ----
  // A kernel launch or copy that reads and/or writes buffers (kNoBuffer entries are skipped).
  void on_stream_access(AgentId s, BufferId b, Access a, Site site);
  void on_launch(AgentId s, const std::vector<BufferId>& reads, const std::vector<BufferId>& writes,
                 Site site);
  void on_record(EventId e, AgentId s);         // cudaEventRecord(e, s)
  void on_wait(AgentId s, EventId e);           // cudaStreamWaitEvent(s, e)
  // ---- host-side calls ----
  void on_host_sync_stream(AgentId s);          // cudaStreamSynchronize(s) returned
  void on_host_sync_event(EventId e);           // cudaEventSynchronize(e) returned / query said done
  void on_host_sync_device();                   // cudaDeviceSynchronize() returned
  void on_host_access(BufferId b, Access a, Site site);  // the CPU reads/writes a registered host buffer

  // ---- results ----
  size_t report_count() const;
  std::vector<Report> take_reports();
  // When true (STRATA_STREAM_CHECK=fatal) the first report prints and aborts the process.
  void set_fatal(bool fatal) { fatal_ = fatal; }
  // When true (default) each report is printed to stderr when it is found.
  void set_print(bool print) { print_ = print; }

 private:
  struct Epoch {
    AgentId agent = 0;
    uint64_t time = 0;
    Site site;
    Access access = Access::Read;
  };
  using Clock = std::vector<uint64_t>;
  struct AgentState {
    std::string name;
    bool is_stream = false;
    StreamKind kind = StreamKind::NonBlocking;
    bool alive = true;
    Clock clock;
  };
  struct BufferState {
    std::string name;
    bool has_write = false;
    Epoch last_write;
    std::vector<Epoch> reads;  // reads since the last write, at most one per agent (the latest)
  };

  AgentId new_agent(std::string name, bool is_stream, StreamKind kind);
  AgentId host_agent() const { return host_; }
  static void join(Clock& into, const Clock& from);
  static uint64_t at(const Clock& c, AgentId a) { return a < c.size() ? c[a] : 0; }
  void bump(AgentId a);
  void enqueue(AgentId s);  // host -> stream ordering, implicit legacy-stream ordering
  void access(AgentId a, BufferId b, Access acc, Site site);
  void report(const BufferState& buf, AgentId now_agent, Access now, Site now_site, const Epoch& before);

  mutable std::mutex mu_;
  std::vector<AgentState> agents_;
  AgentId host_ = 0;  // the host: agent 0, created by the constructor
  std::vector<std::unique_ptr<Clock>> events_;        // null = removed
  std::vector<std::string> event_names_;
  std::unordered_map<BufferId, BufferState> buffers_;
  BufferId next_buffer_ = 1;
  std::vector<Report> reports_;
  bool fatal_ = false;
  bool print_ = true;
};

// ---- the process-wide checker that the CUDA layer feeds ----
namespace detail {
extern std::atomic<bool> g_enabled;
inline thread_local int t_paused = 0;  // PauseNotes scopes alive on this thread
}
// True when STRATA_STREAM_CHECK is set to anything but "" or "0" (read once at start-up; unset means on
// in Debug builds, off otherwise; ctest sets it to 1), or after set_enabled(true), and no PauseNotes is
// alive on the calling thread. One relaxed load (and a thread-local read when on).
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed) && detail::t_paused == 0; }
void set_enabled(bool on);

// While alive, the calling thread feeds the checker nothing. For work enqueued ahead of the point where
// it is ordered: a pass captured whole whose pieces are released one by one by the host (HostGates in
// cuda/transfer.h). Its notes must then be given, with the launches turned off, at the point of the
// host's program where each piece is released; the capture's notes in enqueue order would be wrong.
class PauseNotes {
 public:
  PauseNotes() { ++detail::t_paused; }
  ~PauseNotes() { --detail::t_paused; }
  PauseNotes(const PauseNotes&) = delete;
  PauseNotes& operator=(const PauseNotes&) = delete;
};
Checker& global();

}  // namespace strata::stream_check
