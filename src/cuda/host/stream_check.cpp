#include "cuda/host/stream_check.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace strata::stream_check {

std::string to_string(const Site& s) { return fmt::format("{}:{}", s.file ? s.file : "?", s.line); }

namespace {
const char* access_name(Access a) { return a == Access::Read ? "read" : "write"; }

// Unset: on in Debug builds (CMake defines STRATA_STREAM_CHECK_DEFAULT_ON), off otherwise.
// "0" or "": off. Anything else: on ("fatal": on, and the first report aborts).
bool env_enabled() {
  const char* v = std::getenv("STRATA_STREAM_CHECK");
#ifdef STRATA_STREAM_CHECK_DEFAULT_ON
  if (v == nullptr) return true;
#endif
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}
bool env_fatal() {
  const char* v = std::getenv("STRATA_STREAM_CHECK");
  return v != nullptr && std::strcmp(v, "fatal") == 0;
}
}  // namespace

namespace detail {
std::atomic<bool> g_enabled{env_enabled()};
}

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

Checker& global() {
  static Checker* c = [] {
    auto* k = new Checker();  // never destroyed: CUDA objects may be torn down during static exit
    k->set_fatal(env_fatal());
    return k;
  }();
  return *c;
}

Checker::Checker() { host_ = new_agent("host", false, StreamKind::NonBlocking); }
Checker::~Checker() = default;

AgentId Checker::new_agent(std::string name, bool is_stream, StreamKind kind) {
  AgentId id = static_cast<AgentId>(agents_.size());
  AgentState a;
  a.name = std::move(name);
  a.is_stream = is_stream;
  a.kind = kind;
  a.clock.assign(id + 1, 0);
  a.clock[id] = 1;  // own time starts at 1 so that nobody's zero entry covers our first op
  agents_.push_back(std::move(a));
  return id;
}

void Checker::join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] > into[i]) into[i] = from[i];
}

void Checker::bump(AgentId a) {
  Clock& c = agents_[a].clock;
  if (c.size() <= a) c.resize(a + 1, 0);
  ++c[a];
}

AgentId Checker::add_stream(std::string name, StreamKind kind) {
  std::lock_guard<std::mutex> lk(mu_);
  return new_agent(std::move(name), true, kind);
}

void Checker::remove_stream(AgentId s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (s < agents_.size()) agents_[s].alive = false;
}

EventId Checker::add_event(std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::make_unique<Clock>());
  event_names_.push_back(std::move(name));
  return static_cast<EventId>(events_.size() - 1);
}

void Checker::remove_event(EventId e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (e < events_.size()) events_[e].reset();
}

BufferId Checker::add_buffer(std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  BufferId id = next_buffer_++;
  buffers_[id].name = std::move(name);
  return id;
}

void Checker::remove_buffer(BufferId b) {
  std::lock_guard<std::mutex> lk(mu_);
  buffers_.erase(b);
}

// Host -> stream: whatever the host has seen precedes the new op. Legacy stream: ordered
// with every blocking stream both ways; non-blocking streams are not touched.
void Checker::enqueue(AgentId s) {
  AgentId h = host_agent();
  join(agents_[s].clock, agents_[h].clock);
  bump(h);
  StreamKind kind = agents_[s].kind;
  if (kind == StreamKind::NonBlocking) return;
  for (AgentId o = 0; o < agents_.size(); ++o) {
    if (o == s || !agents_[o].alive || !agents_[o].is_stream) continue;
    bool other_counts = kind == StreamKind::Legacy ? agents_[o].kind == StreamKind::Blocking
                                                   : agents_[o].kind == StreamKind::Legacy;
    if (!other_counts) continue;
    join(agents_[s].clock, agents_[o].clock);
    bump(o);
  }
}

void Checker::report(const BufferState& buf, AgentId now_agent, Access now, Site now_site,
                     const Epoch& before) {
  Report r;
  r.buffer = buf.name;
  r.now_access = now;
  r.now_agent = agents_[now_agent].name;
  r.now = now_site;
  r.before_access = before.access;
  r.before_agent = agents_[before.agent].name;
  r.before = before.site;
  r.message = fmt::format(
      "stream-order race on '{}': {} on {} at {} is not ordered after the {} on {} at {}", r.buffer,
      access_name(now), r.now_agent, to_string(now_site), access_name(before.access), r.before_agent,
      to_string(before.site));
  if (print_ || fatal_) {
    std::fprintf(stderr, "strata: STRATA_STREAM_CHECK: %s\n", r.message.c_str());
    std::fflush(stderr);
  }
  if (fatal_) std::abort();
  reports_.push_back(std::move(r));
}

void Checker::access(AgentId a, BufferId b, Access acc, Site site) {
  if (b == kNoBuffer) return;
  auto it = buffers_.find(b);
  if (it == buffers_.end()) return;  // removed or never registered: not checked
  BufferState& buf = it->second;
  const Clock& c = agents_[a].clock;
  auto ordered = [&](const Epoch& e) { return at(c, e.agent) >= e.time; };
  Epoch now{a, at(c, a), site, acc};
  if (acc == Access::Write) {
    if (buf.has_write && !ordered(buf.last_write)) {
      report(buf, a, acc, site, buf.last_write);
    } else {
      for (const Epoch& r : buf.reads)
        if (!ordered(r)) {
          report(buf, a, acc, site, r);
          break;
        }
    }
    buf.has_write = true;
    buf.last_write = now;
    buf.reads.clear();
  } else {
    if (buf.has_write && !ordered(buf.last_write)) report(buf, a, acc, site, buf.last_write);
    for (Epoch& r : buf.reads)
      if (r.agent == a) {
        r = now;
        return;
      }
    buf.reads.push_back(now);
  }
}

void Checker::on_stream_access(AgentId s, BufferId b, Access a, Site site) {
  std::lock_guard<std::mutex> lk(mu_);
  enqueue(s);
  access(s, b, a, site);
}

void Checker::on_launch(AgentId s, const std::vector<BufferId>& reads, const std::vector<BufferId>& writes,
                        Site site) {
  std::lock_guard<std::mutex> lk(mu_);
  enqueue(s);
  for (BufferId b : reads) access(s, b, Access::Read, site);
  for (BufferId b : writes) access(s, b, Access::Write, site);
}

void Checker::on_record(EventId e, AgentId s) {
  std::lock_guard<std::mutex> lk(mu_);
  enqueue(s);
  if (e >= events_.size() || !events_[e]) return;
  *events_[e] = agents_[s].clock;
  bump(s);
}

void Checker::on_wait(AgentId s, EventId e) {
  std::lock_guard<std::mutex> lk(mu_);
  enqueue(s);
  if (e >= events_.size() || !events_[e]) return;
  join(agents_[s].clock, *events_[e]);  // a never-recorded event has an empty clock: no ordering
}

void Checker::on_host_sync_stream(AgentId s) {
  std::lock_guard<std::mutex> lk(mu_);
  AgentId h = host_agent();
  join(agents_[h].clock, agents_[s].clock);
  bump(s);
}

void Checker::on_host_sync_event(EventId e) {
  std::lock_guard<std::mutex> lk(mu_);
  AgentId h = host_agent();
  if (e >= events_.size() || !events_[e]) return;
  join(agents_[h].clock, *events_[e]);
}

void Checker::on_host_sync_device() {
  std::lock_guard<std::mutex> lk(mu_);
  AgentId h = host_agent();
  for (AgentId o = 0; o < agents_.size(); ++o) {
    if (!agents_[o].is_stream || !agents_[o].alive) continue;
    join(agents_[h].clock, agents_[o].clock);
    bump(o);
  }
}

void Checker::on_host_access(BufferId b, Access a, Site site) {
  std::lock_guard<std::mutex> lk(mu_);
  access(host_agent(), b, a, site);
}

size_t Checker::report_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reports_.size();
}

std::vector<Report> Checker::take_reports() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Report> out;
  out.swap(reports_);
  return out;
}

}  // namespace strata::stream_check
