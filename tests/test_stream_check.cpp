// The happens-before checker on simulated streams and events (no GPU): known orderings pass, known races
// are reported with both call sites, and the two real bugs of DEVELOPERS.md are caught while their
// fixes pass.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "cuda/host/stream_check.h"

namespace sc = strata::stream_check;
using sc::Access;
using sc::StreamKind;

namespace {

struct Fixture : ::testing::Test {
  sc::Checker chk;
  void SetUp() override { chk.set_print(false); }
  sc::Site site(int line) { return sc::Site{"sim.cu", line}; }
  void write(sc::AgentId s, sc::BufferId b, int line) { chk.on_stream_access(s, b, Access::Write, site(line)); }
  void read(sc::AgentId s, sc::BufferId b, int line) { chk.on_stream_access(s, b, Access::Read, site(line)); }
};

using StreamCheck = Fixture;

TEST_F(StreamCheck, SameStreamIsOrdered) {
  auto s = chk.add_stream("compute", StreamKind::NonBlocking);
  auto b = chk.add_buffer("x");
  write(s, b, 1);
  read(s, b, 2);
  write(s, b, 3);
  read(s, b, 4);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, ReadOnOtherStreamWithoutEventRaces) {
  auto a = chk.add_stream("copy", StreamKind::NonBlocking);
  auto b = chk.add_stream("compute", StreamKind::NonBlocking);
  auto buf = chk.add_buffer("table");
  write(a, buf, 10);
  read(b, buf, 20);
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "table");
  EXPECT_EQ(r[0].now_access, Access::Read);
  EXPECT_EQ(r[0].before_access, Access::Write);
  EXPECT_EQ(r[0].now.line, 20);
  EXPECT_EQ(r[0].before.line, 10);
  EXPECT_EQ(r[0].now_agent, "compute");
  EXPECT_EQ(r[0].before_agent, "copy");
  // Both call sites are in the message.
  EXPECT_NE(r[0].message.find("sim.cu:20"), std::string::npos) << r[0].message;
  EXPECT_NE(r[0].message.find("sim.cu:10"), std::string::npos) << r[0].message;
}

TEST_F(StreamCheck, EventRecordAndWaitOrders) {
  auto a = chk.add_stream("copy", StreamKind::NonBlocking);
  auto b = chk.add_stream("compute", StreamKind::NonBlocking);
  auto e = chk.add_event("done");
  auto buf = chk.add_buffer("table");
  write(a, buf, 1);
  chk.on_record(e, a);
  chk.on_wait(b, e);
  read(b, buf, 2);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, EventRecordedBeforeTheWriteDoesNotOrderIt) {
  auto a = chk.add_stream("copy", StreamKind::NonBlocking);
  auto b = chk.add_stream("compute", StreamKind::NonBlocking);
  auto e = chk.add_event("too early");
  auto buf = chk.add_buffer("table");
  chk.on_record(e, a);
  write(a, buf, 1);
  chk.on_wait(b, e);
  read(b, buf, 2);
  EXPECT_EQ(chk.report_count(), 1u);
}

TEST_F(StreamCheck, NeverRecordedEventGivesNoOrder) {
  auto a = chk.add_stream("copy", StreamKind::NonBlocking);
  auto b = chk.add_stream("compute", StreamKind::NonBlocking);
  auto e = chk.add_event("never recorded");
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  chk.on_wait(b, e);
  read(b, buf, 2);
  EXPECT_EQ(chk.report_count(), 1u);
}

TEST_F(StreamCheck, WaitIsTransitive) {
  // a writes -> event -> b waits, records -> c waits: c is after a's write.
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto c = chk.add_stream("c", StreamKind::NonBlocking);
  auto e1 = chk.add_event("e1"), e2 = chk.add_event("e2");
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  chk.on_record(e1, a);
  chk.on_wait(b, e1);
  chk.on_record(e2, b);
  chk.on_wait(c, e2);
  read(c, buf, 2);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, WriteAfterUnorderedReadRaces) {
  // A slot that a kernel may still read is overwritten by an upload on the copy stream (WAR).
  auto compute = chk.add_stream("compute", StreamKind::NonBlocking);
  auto copy = chk.add_stream("copy", StreamKind::NonBlocking);
  auto slot = chk.add_buffer("slot 3");
  read(compute, slot, 5);
  write(copy, slot, 6);
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].now_access, Access::Write);
  EXPECT_EQ(r[0].before_access, Access::Read);
  EXPECT_EQ(r[0].before.line, 5);
  // Fixed: the copy stream waits for the compute stream's reads first.
  auto e = chk.add_event("reads done");
  auto slot4 = chk.add_buffer("slot 4");
  read(compute, slot4, 7);
  chk.on_record(e, compute);
  chk.on_wait(copy, e);
  write(copy, slot4, 8);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, WriteWriteRaces) {
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  write(b, buf, 2);
  EXPECT_EQ(chk.report_count(), 1u);
}

TEST_F(StreamCheck, ConcurrentReadsAreFine) {
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto c = chk.add_stream("c", StreamKind::NonBlocking);
  auto e = chk.add_event("written");
  auto buf = chk.add_buffer("weights");
  write(a, buf, 1);
  chk.on_record(e, a);
  chk.on_wait(b, e);
  chk.on_wait(c, e);
  read(b, buf, 2);
  read(c, buf, 3);
  EXPECT_EQ(chk.report_count(), 0u);
  // ...but a write must then be after both readers; waiting on only one of them races.
  auto eb = chk.add_event("b done");
  chk.on_record(eb, b);
  chk.on_wait(a, eb);
  write(a, buf, 4);
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].before.line, 3);
}

TEST_F(StreamCheck, HostSyncOrdersLaterLaunches) {
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  chk.on_host_sync_stream(a);
  read(b, buf, 2);  // enqueued after the host saw a finish
  EXPECT_EQ(chk.report_count(), 0u);
  auto buf2 = chk.add_buffer("y");
  write(a, buf2, 3);
  chk.on_host_sync_device();
  read(b, buf2, 4);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, HostSyncOnEventOrdersLaterLaunches) {
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto e = chk.add_event("e");
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  chk.on_record(e, a);
  chk.on_host_sync_event(e);
  read(b, buf, 2);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, HostThreadsShareOneClock) {
  // Documented choice (stream_check.h): a sync on one host thread orders launches from any thread,
  // because host threads hand work over through synchronization the checker does not see.
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  std::thread([&] { chk.on_host_sync_stream(a); }).join();
  read(b, buf, 2);
  std::thread([&] { chk.on_host_access(buf, Access::Read, site(3)); }).join();
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, StagingBufferReuseNeedsTheCopyEvent) {
  // A pinned staging buffer: the host fills it, the copy stream reads it. Refilling it before the
  // copy's event completed is a race; after cudaEventSynchronize it is not.
  auto copy = chk.add_stream("copy", StreamKind::NonBlocking);
  auto e = chk.add_event("copy done");
  auto staging = chk.add_buffer("pinned staging 0");
  chk.on_host_access(staging, Access::Write, site(1));
  chk.on_stream_access(copy, staging, Access::Read, site(2));
  chk.on_record(e, copy);
  chk.on_host_access(staging, Access::Write, site(3));  // reuse too early
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].now.line, 3);
  EXPECT_EQ(r[0].before.line, 2);
  chk.on_stream_access(copy, staging, Access::Read, site(4));
  chk.on_record(e, copy);
  chk.on_host_sync_event(e);
  chk.on_host_access(staging, Access::Write, site(5));
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, LegacyStreamOrdersWithBlockingStreams) {
  auto legacy = chk.add_stream("legacy", StreamKind::Legacy);
  auto blk = chk.add_stream("blocking", StreamKind::Blocking);
  auto buf = chk.add_buffer("x");
  write(legacy, buf, 1);
  read(blk, buf, 2);  // blocking stream waits for prior legacy work
  write(blk, buf, 3);
  read(legacy, buf, 4);  // legacy waits for prior blocking-stream work
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(StreamCheck, RemovedBufferIsNotChecked) {
  auto a = chk.add_stream("a", StreamKind::NonBlocking);
  auto b = chk.add_stream("b", StreamKind::NonBlocking);
  auto buf = chk.add_buffer("x");
  write(a, buf, 1);
  chk.remove_buffer(buf);
  read(b, buf, 2);
  read(b, sc::kNoBuffer, 3);
  EXPECT_EQ(chk.report_count(), 0u);
}

// ---- bug 1 of DEVELOPERS.md: residency table uploaded with a plain pageable cudaMemcpy (legacy
// stream; returns before the DMA lands, so the host is not ordered after it), then read by a kernel
// on a cudaStreamNonBlocking stream.
struct Bug1 : Fixture {
  sc::AgentId legacy = 0, reader = 0, copy = 0;
  sc::BufferId table = 0;
  void SetUp() override {
    Fixture::SetUp();
    legacy = chk.add_stream("legacy stream 0", StreamKind::Legacy);
    reader = chk.add_stream("compute (non-blocking)", StreamKind::NonBlocking);
    copy = chk.add_stream("copy (non-blocking)", StreamKind::NonBlocking);
    table = chk.add_buffer("residency table");
  }
  void pageable_memcpy_h2d(int line) { write(legacy, table, line); }  // no host join: DMA may be pending
};

TEST_F(Bug1, PlainPageableCopyThenNonBlockingReaderIsCaught) {
  pageable_memcpy_h2d(100);
  read(reader, table, 101);
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].buffer, "residency table");
  EXPECT_EQ(r[0].before.line, 100);
  EXPECT_EQ(r[0].now.line, 101);
}

TEST_F(Bug1, FixSynchronizeLegacyStreamPasses) {
  pageable_memcpy_h2d(100);
  chk.on_host_sync_stream(legacy);  // cudaStreamSynchronize(nullptr)
  read(reader, table, 101);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(Bug1, FixBlockingReaderPasses) {
  auto blk = chk.add_stream("compute (blocking)", StreamKind::Blocking);
  pageable_memcpy_h2d(100);
  read(blk, table, 101);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST_F(Bug1, FixTransferModulePatternPasses) {
  // What src/cuda/transfer does: event on the producer (the reader, whose earlier reads must finish),
  // copy stream waits, copies, records; the consumer waits on the copy's event.
  auto ep = chk.add_event("producer"), ec = chk.add_event("copy done");
  read(reader, table, 99);  // an earlier step read the old table
  chk.on_record(ep, reader);
  chk.on_wait(copy, ep);
  write(copy, table, 100);
  chk.on_record(ec, copy);
  chk.on_wait(reader, ec);
  read(reader, table, 101);
  EXPECT_EQ(chk.report_count(), 0u);
}

// ---- bug 2 of DEVELOPERS.md: a copy stream from a pool skipped waiting on its producer because the
// producer's stream handle was 0 (the default stream), so an offload copied a buffer before the kernel
// that fills it had run.
TEST_F(StreamCheck, Bug2CopySkippedWaitOnDefaultStreamProducerIsCaught) {
  auto legacy = chk.add_stream("legacy stream 0", StreamKind::Legacy);
  auto copy = chk.add_stream("copy pool #1", StreamKind::NonBlocking);
  auto kv = chk.add_buffer("kv block 7");
  write(legacy, kv, 200);  // kernel fills the KV block on stream 0
  // if (producer != nullptr) { record; wait; }  -- skipped, since producer == 0
  read(copy, kv, 201);  // offload copy D2H
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].before.line, 200);
  EXPECT_EQ(r[0].now.line, 201);
  EXPECT_EQ(r[0].before_agent, "legacy stream 0");
}

TEST_F(StreamCheck, Bug2FixWaitingOnDefaultStreamProducerPasses) {
  auto legacy = chk.add_stream("legacy stream 0", StreamKind::Legacy);
  auto copy = chk.add_stream("copy pool #1", StreamKind::NonBlocking);
  auto e = chk.add_event("producer");
  auto kv = chk.add_buffer("kv block 7");
  write(legacy, kv, 200);
  chk.on_record(e, legacy);  // recorded on stream 0 too, never skipped
  chk.on_wait(copy, e);
  read(copy, kv, 201);
  EXPECT_EQ(chk.report_count(), 0u);
}

TEST(StreamCheckGlobal, SiteHereCapturesTheCaller) {
  auto s = sc::Site::here();
  int line = __LINE__ - 1;
  EXPECT_EQ(s.line, line);
  EXPECT_NE(std::string(s.file).find("test_stream_check.cpp"), std::string::npos);
}

TEST(StreamCheckGlobal, EnabledUnderCtest) {
  // tests/CMakeLists.txt runs every test with STRATA_STREAM_CHECK=1; set_enabled overrides it.
  bool was = sc::enabled();
  sc::set_enabled(true);
  EXPECT_TRUE(sc::enabled());
  sc::set_enabled(false);
  EXPECT_FALSE(sc::enabled());
  sc::set_enabled(was);
}

// PauseNotes (a gated pass's capture): quiet on the thread that holds it, nested, and only there.
TEST(StreamCheckGlobal, PauseNotesQuietsOnlyTheCallingThread) {
  const bool was = sc::enabled();
  sc::set_enabled(true);
  {
    const sc::PauseNotes outer;
    EXPECT_FALSE(sc::enabled());
    {
      const sc::PauseNotes inner;
      EXPECT_FALSE(sc::enabled());
    }
    EXPECT_FALSE(sc::enabled());
    bool other = false;
    std::thread([&] { other = sc::enabled(); }).join();
    EXPECT_TRUE(other);
  }
  EXPECT_TRUE(sc::enabled());
  sc::set_enabled(was);
}

// A gated pass as the CUDA layer feeds it (cuda/transfer.h HostGates): the stream's pieces are noted
// where the host releases them, a signal is an event recorded after the signaled copy and synced by the
// host's wait. In order: no report. Reading the download before its signal, or rewriting the gated
// upload's source before a later signal: reported.
TEST_F(StreamCheck, GatedPassInReleaseOrder) {
  auto cs = chk.add_stream("compute", StreamKind::NonBlocking);
  auto xn = chk.add_buffer("xn_h"), part = chk.add_buffer("partial_h"), x = chk.add_buffer("x");
  std::vector<sc::EventId> sig;
  for (int i = 0; i < 3; ++i) sig.push_back(chk.add_event("signal" + std::to_string(i)));
  auto release = [&](int k) {  // piece k: (k > 0) the gated add of layer k-1; (k < 3) layer k down + signal
    if (k > 0) {
      read(cs, part, 10 + k);
      write(cs, x, 20 + k);
    }
    if (k < 3) {
      write(cs, x, 30 + k);
      write(cs, xn, 40 + k);
      chk.on_record(sig[size_t(k)], cs);
    }
  };
  for (int bad = 0; bad < 3; ++bad) {
    release(0);
    for (int k = 0; k < 3; ++k) {
      if (bad == 1 && k == 1) chk.on_host_access(xn, Access::Read, site(50));  // before the signal
      chk.on_host_sync_event(sig[size_t(k)]);
      chk.on_host_access(xn, Access::Read, site(51));
      chk.on_host_access(part, Access::Write, site(52));
      release(k + 1);
      if (bad == 2 && k == 1) chk.on_host_access(part, Access::Write, site(53));  // the gated copy may still read it
    }
    const auto r = chk.take_reports();
    if (bad == 0) {
      EXPECT_TRUE(r.empty());
    } else {
      ASSERT_EQ(r.size(), 1u) << "case " << bad;
      EXPECT_EQ(r[0].buffer, bad == 1 ? "xn_h" : "partial_h");
      EXPECT_EQ(r[0].now.line, bad == 1 ? 50 : 53);
    }
  }
}

}  // namespace

namespace {
TEST(StreamCheckDeathTest, FatalModeAbortsOnTheFirstRace) {
  EXPECT_DEATH(
      {
        sc::Checker chk;
        chk.set_fatal(true);
        auto a = chk.add_stream("a", StreamKind::NonBlocking);
        auto b = chk.add_stream("b", StreamKind::NonBlocking);
        auto buf = chk.add_buffer("x");
        chk.on_stream_access(a, buf, Access::Write, sc::Site{"f.cu", 1});
        chk.on_stream_access(b, buf, Access::Read, sc::Site{"f.cu", 2});
      },
      "stream-order race on 'x'.*f.cu:2.*f.cu:1");
}

TEST(StreamCheckThreads, ManyThreadsAndStreamsStayConsistent) {
  // Each thread owns a stream and a buffer and orders itself correctly; nothing may be reported, and
  // the shared buffer read by all after one writer's event must not race either.
  sc::Checker chk;
  chk.set_print(false);
  auto w = chk.add_stream("writer", StreamKind::NonBlocking);
  auto shared = chk.add_buffer("shared");
  auto e = chk.add_event("written");
  chk.on_stream_access(w, shared, Access::Write, sc::Site{"t", 0});
  chk.on_record(e, w);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&chk, e, shared, t] {
      auto s = chk.add_stream("s" + std::to_string(t), StreamKind::NonBlocking);
      auto own = chk.add_buffer("own" + std::to_string(t));
      chk.on_wait(s, e);
      for (int i = 0; i < 200; ++i) {
        chk.on_stream_access(s, own, Access::Write, sc::Site{"t", i});
        chk.on_stream_access(s, shared, Access::Read, sc::Site{"t", i});
        chk.on_host_sync_stream(s);
        chk.on_host_access(own, Access::Read, sc::Site{"t", i});
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(chk.report_count(), 0u);
  // A buffer written on a stream nobody waited for: a read from another thread's stream is reported.
  auto w2 = chk.add_stream("writer 2", StreamKind::NonBlocking);
  auto other = chk.add_buffer("other");
  chk.on_stream_access(w2, other, Access::Write, sc::Site{"t", 0});
  std::thread([&chk, other] {
    auto s = chk.add_stream("rogue", StreamKind::NonBlocking);
    chk.on_stream_access(s, other, Access::Read, sc::Site{"rogue", 1});
  }).join();
  auto r = chk.take_reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].now_agent, "rogue");
}
}  // namespace
