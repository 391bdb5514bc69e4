// GPU Gated DeltaNet ops (src/cuda/gdn.cuh) against their CPU references (src/cpu/gdn.h) on random data
// at Qwen3-Next-80B-A3B sizes (Hk 16, Hv 32, D 128, conv K 4, C = 2*Hk*D + Hv*D = 8192) and at the tiny
// fixture model's (Hk 2, Hv 4, D 64). The stateful ops (conv, delta rule) run several consecutive calls
// of 64, 7, 1, 1, ... tokens on one state, as decode after a prefill does, and compare outputs and state
// after every call. Skipped where there is no GPU; run with the stream-order checker on (any report fails).
// Failures print max |gpu - cpu|, max |cpu| and their ratio.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cpu/gdn.h"
#include "cpu/thread_pool.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/gdn.cuh"
#include "cuda/transfer.h"

namespace {

using namespace strata::cuda;
namespace sc = strata::stream_check;
namespace gg = strata::cuda::gdn;

std::vector<float> randv(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Error of `got` against `ref`: max abs difference, max |ref|, their ratio (the "relative" error
// reported and bounded below), and where the worst element is.
struct Err {
  double max_abs = 0.0, ref_max = 0.0;
  size_t worst = 0;
  double got_w = 0.0, ref_w = 0.0;
  size_t size_mismatch = 0;
  double rel() const { return ref_max > 0.0 ? max_abs / ref_max : max_abs; }
  std::string str() const {
    std::ostringstream o;
    o << "max abs err " << max_abs << ", max |ref| " << ref_max << ", rel " << rel() << " (worst [" << worst
      << "]: gpu " << got_w << " cpu " << ref_w << ")";
    if (size_mismatch) o << " SIZE MISMATCH";
    return o.str();
  }
};

Err compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Err e;
  if (got.size() != ref.size()) {
    e.size_mismatch = 1;
    e.max_abs = INFINITY;
    return e;
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    e.ref_max = std::max(e.ref_max, std::fabs(double(ref[i])));
    if (!(d <= e.max_abs)) {  // also catches NaN
      e.max_abs = std::isnan(d) ? INFINITY : d;
      e.worst = i;
      e.got_w = got[i];
      e.ref_w = ref[i];
    }
  }
  return e;
}

class GdnGpu : public ::testing::Test {
 public:  // the run_* helpers below use the buffer helpers
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
    sc::set_enabled(true);
    sc::global().take_reports();
    dev = std::make_unique<Device>(0);
    xfer = std::make_unique<Transfer>(*dev);
  }
  void TearDown() override {
    if (dev) dev->synchronize();
    for (const auto& r : sc::global().take_reports()) ADD_FAILURE() << "stream-order checker: " << r.message;
    xfer.reset();
    dev.reset();
  }
  cudaStream_t stream() { return dev->compute().handle(); }
  // A device buffer of n floats (at least one), filled from h when given.
  DeviceBuffer alloc(size_t n, const char* name) { return dev->alloc(std::max<size_t>(n, 1) * sizeof(float), name); }
  void upload(const DeviceBuffer& b, const std::vector<float>& h) {
    ASSERT_LE(h.size() * sizeof(float), b.bytes());
    if (!h.empty()) xfer->upload(b.span(), h.data(), h.size() * sizeof(float), dev->compute(), {&dev->compute()});
  }
  DeviceBuffer up(const std::vector<float>& h, const char* name) {
    DeviceBuffer b = alloc(h.size(), name);
    upload(b, h);
    return b;
  }
  std::vector<float> down(const DeviceBuffer& b, size_t n) {
    std::vector<float> h(n);
    if (n) xfer->download_sync(h.data(), b.span(), n * sizeof(float), dev->compute());
    return h;
  }

  std::unique_ptr<Device> dev;
  std::unique_ptr<Transfer> xfer;
};

// Token counts of consecutive calls on one sequence: a prompt of 64, a chunk of 7, then decode steps
// (2 < K-1 exercises the conv state shift).
const std::vector<int64_t> kCalls = {64, 7, 1, 2, 1, 1};

// ---- conv1d + SiLU ----------------------------------------------------------------------------------------

void run_conv(GdnGpu& f, int64_t C, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t max_tok = *std::max_element(kCalls.begin(), kCalls.end());
  const auto w = randv(size_t(C * K), rng);
  std::vector<float> st_cpu(size_t((K - 1) * C), 0.0f);  // sequence start: zeros
  auto d_w = f.up(w, "conv w");
  auto d_st = f.up(st_cpu, "conv state");
  auto d_x = f.alloc(size_t(max_tok * C), "conv x");
  auto d_y = f.alloc(size_t(max_tok * C), "conv y");
  int call = 0;
  for (int64_t n : kCalls) {
    const auto x = randv(size_t(n * C), rng, -2.0f, 2.0f);
    std::vector<float> y_cpu(size_t(n * C));
    strata::gdn_conv1d_silu_ref(x.data(), n, C, K, st_cpu.data(), w.data(), y_cpu.data());
    f.upload(d_x, x);
    note_launch(f.dev->compute(), {d_x.span(), d_w.span(), d_st.span()}, {d_y.span(), d_st.span()});
    gg::conv1d_silu(d_x.as<float>(), n, C, K, d_st.as<float>(), d_w.as<float>(), d_y.as<float>(), f.stream());
    const Err ey = compare(f.down(d_y, size_t(n * C)), y_cpu);
    const Err es = compare(f.down(d_st, st_cpu.size()), st_cpu);
    EXPECT_LT(ey.rel(), 1e-5) << "conv y, C " << C << " K " << K << ", call " << call << " (" << n
                              << " tokens): " << ey.str();
    EXPECT_EQ(es.max_abs, 0.0) << "conv state (must be the exact last K-1 inputs), C " << C << ", call " << call
                               << " (" << n << " tokens): " << es.str();
    ++call;
  }
}

TEST_F(GdnGpu, Conv1dSiluCarriesStateAcrossCalls) {
  run_conv(*this, 2 * 16 * 128 + 32 * 128, 4, 1);  // Qwen3-Next-80B-A3B
  run_conv(*this, 2 * 2 * 64 + 4 * 64, 4, 2);      // tiny fixture model
  run_conv(*this, 300, 2, 3);                      // K 2, C not a multiple of the block
}

// ---- gates ----------------------------------------------------------------------------------------------------

TEST_F(GdnGpu, GatesMatchReference) {
  std::mt19937 rng(4);
  for (auto [Hk, Hv] : std::vector<std::pair<int64_t, int64_t>>{{16, 32}, {2, 4}, {3, 3}})
    for (int64_t n : {int64_t(64), int64_t(1)}) {
      auto ba = randv(size_t(n * 2 * Hv), rng, -6.0f, 6.0f);
      ba[size_t(Hv / Hk)] = 30.0f;  // an alpha logit past softplus' linear threshold (20)
      std::vector<float> a(static_cast<size_t>(Hv)), dt = randv(size_t(Hv), rng, -1.0f, 1.0f);
      for (auto& x : a) x = -std::exp(std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng));
      std::vector<float> g_cpu(size_t(n * Hv)), b_cpu(size_t(n * Hv));
      strata::gdn_gates_ref(ba.data(), n, Hk, Hv, a.data(), dt.data(), g_cpu.data(), b_cpu.data());
      auto d_ba = up(ba, "ba"), d_a = up(a, "ssm_a"), d_dt = up(dt, "dt_bias");
      auto d_g = alloc(g_cpu.size(), "g"), d_b = alloc(b_cpu.size(), "beta");
      note_launch(dev->compute(), {d_ba.span(), d_a.span(), d_dt.span()}, {d_g.span(), d_b.span()});
      gg::gates(d_ba.as<float>(), n, Hk, Hv, d_a.as<float>(), d_dt.as<float>(), d_g.as<float>(), d_b.as<float>(),
                stream());
      const Err eg = compare(down(d_g, g_cpu.size()), g_cpu), eb = compare(down(d_b, b_cpu.size()), b_cpu);
      EXPECT_LT(eg.rel(), 1e-5) << "g, Hk " << Hk << " Hv " << Hv << " n " << n << ": " << eg.str();
      EXPECT_LT(eb.rel(), 1e-5) << "beta, Hk " << Hk << " Hv " << Hv << " n " << n << ": " << eb.str();
    }
}

// ---- split q|k|v + L2 norm ------------------------------------------------------------------------------------

TEST_F(GdnGpu, SplitQkvMatchesCpu) {
  std::mt19937 rng(5);
  const float eps = 1e-6f;
  for (auto [Hk, Hv, D] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 32, 128}, {2, 4, 64}, {1, 2, 40}})
    for (int64_t n : {int64_t(64), int64_t(7), int64_t(1)}) {
      const int64_t C = 2 * Hk * D + Hv * D;
      auto conv = randv(size_t(n * C), rng);
      std::fill(conv.begin(), conv.begin() + D, 0.0f);  // a zero q row: divided by eps, stays 0
      std::vector<float> q(size_t(n * Hk * D)), k(q.size()), v(size_t(n * Hv * D));
      strata::gdn_split_qkv(conv.data(), n, Hk, Hv, D, eps, q.data(), k.data(), v.data());
      auto d_conv = up(conv, "conv out");
      auto d_q = alloc(q.size(), "q"), d_k = alloc(k.size(), "k"), d_v = alloc(v.size(), "v");
      note_launch(dev->compute(), {d_conv.span()}, {d_q.span(), d_k.span(), d_v.span()});
      gg::split_qkv(d_conv.as<float>(), n, Hk, Hv, D, eps, d_q.as<float>(), d_k.as<float>(), d_v.as<float>(),
                    stream());
      const Err eq = compare(down(d_q, q.size()), q), ek = compare(down(d_k, k.size()), k),
                ev = compare(down(d_v, v.size()), v);
      const std::string at = "Hk " + std::to_string(Hk) + " Hv " + std::to_string(Hv) + " D " + std::to_string(D) +
                             " n " + std::to_string(n) + ": ";
      EXPECT_LT(eq.rel(), 1e-6) << "q, " << at << eq.str();
      EXPECT_LT(ek.rel(), 1e-6) << "k, " << at << ek.str();
      EXPECT_EQ(ev.max_abs, 0.0) << "v (a copy), " << at << ev.str();
    }
}

// ---- gated delta rule -------------------------------------------------------------------------------------------

struct DeltaCase {
  int64_t Hk, Hv, D;
  float g_lo, g_hi;     // log-decay range
  bool random_state;    // else zeros (sequence start)
};

// Consecutive calls (kCalls) on one state; after each, the outputs and the state against the double
// reference, bounded by `tol` relative to the largest reference value.
void run_delta(GdnGpu& f, const DeltaCase& c, uint32_t seed, double tol) {
  std::mt19937 rng(seed);
  strata::ThreadPool pool(1);
  const int64_t Hk = c.Hk, Hv = c.Hv, D = c.D;
  const int64_t max_tok = *std::max_element(kCalls.begin(), kCalls.end());
  const float q_scale = 1.0f / std::sqrt(float(D));
  std::vector<float> st_cpu = c.random_state ? randv(size_t(Hv * D * D), rng, -0.5f, 0.5f)
                                             : std::vector<float>(size_t(Hv * D * D), 0.0f);
  auto d_st = f.up(st_cpu, "delta state");
  auto d_q = f.alloc(size_t(max_tok * Hk * D), "q"), d_k = f.alloc(size_t(max_tok * Hk * D), "k");
  auto d_v = f.alloc(size_t(max_tok * Hv * D), "v"), d_o = f.alloc(size_t(max_tok * Hv * D), "out");
  auto d_g = f.alloc(size_t(max_tok * Hv), "g"), d_b = f.alloc(size_t(max_tok * Hv), "beta");
  int call = 0;
  int64_t pos = 0;
  for (int64_t n : kCalls) {
    auto q = randv(size_t(n * Hk * D), rng), k = randv(size_t(n * Hk * D), rng);
    const auto v = randv(size_t(n * Hv * D), rng);
    const auto g = randv(size_t(n * Hv), rng, c.g_lo, c.g_hi), beta = randv(size_t(n * Hv), rng, 0.0f, 1.0f);
    strata::l2_norm_rows(q.data(), n * Hk, D, 1e-6f);
    strata::l2_norm_rows(k.data(), n * Hk, D, 1e-6f);
    std::vector<float> o_cpu(size_t(n * Hv * D));
    strata::gdn_delta_rule_recurrent_ref({n, Hk, Hv, D}, q.data(), k.data(), v.data(), g.data(), beta.data(),
                                         q_scale, st_cpu.data(), o_cpu.data(), pool);
    f.upload(d_q, q);
    f.upload(d_k, k);
    f.upload(d_v, v);
    f.upload(d_g, g);
    f.upload(d_b, beta);
    note_launch(f.dev->compute(), {d_q.span(), d_k.span(), d_v.span(), d_g.span(), d_b.span(), d_st.span()},
                {d_st.span(), d_o.span()});
    gg::delta_rule(n, Hk, Hv, D, d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), d_g.as<float>(),
                   d_b.as<float>(), q_scale, d_st.as<float>(), d_o.as<float>(), f.stream());
    pos += n;
    const Err eo = compare(f.down(d_o, o_cpu.size()), o_cpu);
    const Err es = compare(f.down(d_st, st_cpu.size()), st_cpu);
    const std::string at = "Hk " + std::to_string(Hk) + " Hv " + std::to_string(Hv) + " D " + std::to_string(D) +
                           " g in [" + std::to_string(c.g_lo) + ", " + std::to_string(c.g_hi) + "], call " +
                           std::to_string(call) + " (" + std::to_string(n) + " tokens, " + std::to_string(pos) +
                           " so far): ";
    EXPECT_LT(eo.rel(), tol) << "delta rule out, " << at << eo.str();
    EXPECT_LT(es.rel(), tol) << "delta rule state, " << at << es.str();
    if (call == 0 || ::testing::Test::HasFailure())
      std::printf("[ gdn ] delta rule %s out %s | state %s\n", at.c_str(), eo.str().c_str(), es.str().c_str());
    ++call;
  }
}

TEST_F(GdnGpu, DeltaRuleQwen3NextSizesDecodeAfterPrefill) {
  run_delta(*this, {16, 32, 128, -2.0f, 0.0f, false}, 10, 1e-4);
  run_delta(*this, {16, 32, 128, -0.02f, 0.0f, false}, 11, 1e-4);  // slow decay: the state accumulates
  run_delta(*this, {16, 32, 128, -1.0f, 0.0f, true}, 12, 1e-4);    // a state carried in from before
}

TEST_F(GdnGpu, DeltaRuleOtherHeadSizes) {
  run_delta(*this, {2, 4, 64, -1.0f, 0.0f, true}, 20, 1e-4);   // tiny fixture model
  run_delta(*this, {1, 3, 80, -1.0f, 0.0f, true}, 21, 1e-4);   // D not a multiple of 32 or of a block's rows
  run_delta(*this, {1, 1, 256, -1.0f, 0.0f, true}, 22, 1e-4);  // the largest head supported
  run_delta(*this, {2, 2, 32, -1.0f, 0.0f, true}, 23, 1e-4);
  run_delta(*this, {1, 2, 17, -1.0f, 0.0f, true}, 24, 1e-4);
}

// ---- gated RMSNorm ---------------------------------------------------------------------------------------------

TEST_F(GdnGpu, GatedRmsNormMatchesReferenceAlsoInPlace) {
  std::mt19937 rng(30);
  for (auto [rows, D] : std::vector<std::pair<int64_t, int64_t>>{{64 * 32, 128}, {32, 128}, {5, 200}}) {
    const auto x = randv(size_t(rows * D), rng, -3.0f, 3.0f), z = randv(size_t(rows * D), rng, -4.0f, 4.0f);
    const auto w = randv(size_t(D), rng, 0.5f, 1.5f);
    const float eps = 1e-6f;
    std::vector<float> y_cpu(x.size());
    strata::gated_rms_norm_ref(x.data(), z.data(), w.data(), rows, D, eps, y_cpu.data());
    auto d_x = up(x, "x"), d_z = up(z, "z"), d_w = up(w, "w");
    auto d_y = alloc(x.size(), "y");
    note_launch(dev->compute(), {d_x.span(), d_z.span(), d_w.span()}, {d_y.span()});
    gg::gated_rms_norm(d_x.as<float>(), d_z.as<float>(), d_w.as<float>(), rows, D, eps, d_y.as<float>(), stream());
    const Err e = compare(down(d_y, x.size()), y_cpu);
    EXPECT_LT(e.rel(), 1e-5) << "gated rms norm rows " << rows << " D " << D << ": " << e.str();
    note_launch(dev->compute(), {d_x.span(), d_z.span(), d_w.span()}, {d_x.span()});
    gg::gated_rms_norm(d_x.as<float>(), d_z.as<float>(), d_w.as<float>(), rows, D, eps, d_x.as<float>(), stream());
    const Err ei = compare(down(d_x, x.size()), y_cpu);
    EXPECT_LT(ei.rel(), 1e-5) << "gated rms norm in place, rows " << rows << " D " << D << ": " << ei.str();
  }
}

// ---- gated attention and shared-expert gate ------------------------------------------------------------------

TEST_F(GdnGpu, SplitQGateAndSigmoidGates) {
  std::mt19937 rng(40);
  const int64_t n = 7, H = 16, D = 256, E = 2048;  // Qwen3-Next: 16 query heads of 256, n_embd 2048
  const auto qg = randv(size_t(n * H * 2 * D), rng);
  std::vector<float> q(size_t(n * H * D)), gate(q.size());
  strata::split_q_gate(qg.data(), n, H, D, q.data(), gate.data());
  auto d_qg = up(qg, "qg");
  auto d_q = alloc(q.size(), "q"), d_gate = alloc(q.size(), "gate");
  note_launch(dev->compute(), {d_qg.span()}, {d_q.span(), d_gate.span()});
  gg::split_q_gate(d_qg.as<float>(), n, H, D, d_q.as<float>(), d_gate.as<float>(), stream());
  const Err eq = compare(down(d_q, q.size()), q), eg = compare(down(d_gate, gate.size()), gate);
  EXPECT_EQ(eq.max_abs, 0.0) << "split_q_gate q: " << eq.str();
  EXPECT_EQ(eg.max_abs, 0.0) << "split_q_gate gate: " << eg.str();

  // attention output *= sigmoid(gate)
  auto att = randv(q.size(), rng, -3.0f, 3.0f);
  auto d_att = up(att, "att");
  strata::mul_sigmoid(att.data(), gate.data(), int64_t(att.size()));
  note_launch(dev->compute(), {d_att.span(), d_gate.span()}, {d_att.span()});
  gg::mul_sigmoid(d_att.as<float>(), d_gate.as<float>(), int64_t(att.size()), stream());
  const Err em = compare(down(d_att, att.size()), att);
  EXPECT_LT(em.rel(), 1e-6) << "mul_sigmoid: " << em.str();

  // y[t] += sigmoid(logit[t]) * shexp[t]
  auto y = randv(size_t(n * E), rng), x = randv(size_t(n * E), rng), logit = randv(size_t(n), rng, -5.0f, 5.0f);
  auto d_y = up(y, "y"), d_xs = up(x, "shexp out"), d_l = up(logit, "logit");
  strata::add_sigmoid_scaled(y.data(), x.data(), logit.data(), n, E);
  note_launch(dev->compute(), {d_y.span(), d_xs.span(), d_l.span()}, {d_y.span()});
  gg::add_sigmoid_scaled(d_y.as<float>(), d_xs.as<float>(), d_l.as<float>(), n, E, stream());
  const Err ea = compare(down(d_y, y.size()), y);
  EXPECT_LT(ea.rel(), 1e-6) << "add_sigmoid_scaled: " << ea.str();
}

// ---- the GDN core of one layer, prefill then decode -------------------------------------------------------------

// conv1d+SiLU -> split_qkv -> gates -> delta rule -> gated RMSNorm on the GPU, against the CPU ops the
// forward pass runs (cpu/gdn.h), over a prompt of 64 and decode steps on one sequence's state.
TEST_F(GdnGpu, GdnCorePrefillThenDecodeMatchesCpu) {
  std::mt19937 rng(50);
  strata::ThreadPool pool(2);
  const int64_t Hk = 16, Hv = 32, D = 128, C = 2 * Hk * D + Hv * D, max_tok = 64;
  const int K = 4;
  const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(D));
  const auto w = randv(size_t(C * K), rng, -0.5f, 0.5f), norm_w = randv(size_t(D), rng, 0.5f, 1.5f);
  const auto dt = randv(size_t(Hv), rng, -1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(Hv));
  for (auto& x : a) x = -std::exp(std::uniform_real_distribution<float>(-2.0f, 1.0f)(rng));
  std::vector<float> conv_st(size_t((K - 1) * C), 0.0f), st(size_t(Hv * D * D), 0.0f);
  auto d_w = up(w, "conv w"), d_nw = up(norm_w, "ssm_norm"), d_dt = up(dt, "dt_bias"), d_a = up(a, "ssm_a");
  auto d_cst = up(conv_st, "conv state"), d_st = up(st, "delta state");
  auto d_qkv = alloc(size_t(max_tok * C), "qkv"), d_conv = alloc(size_t(max_tok * C), "conv");
  auto d_z = alloc(size_t(max_tok * Hv * D), "z"), d_ba = alloc(size_t(max_tok * 2 * Hv), "ba");
  auto d_q = alloc(size_t(max_tok * Hk * D), "q"), d_k = alloc(size_t(max_tok * Hk * D), "k");
  auto d_v = alloc(size_t(max_tok * Hv * D), "v"), d_o = alloc(size_t(max_tok * Hv * D), "out");
  auto d_g = alloc(size_t(max_tok * Hv), "g"), d_b = alloc(size_t(max_tok * Hv), "beta");
  int call = 0;
  for (int64_t n : {int64_t(64), int64_t(1), int64_t(1), int64_t(1)}) {
    const auto qkv = randv(size_t(n * C), rng, -2.0f, 2.0f), z = randv(size_t(n * Hv * D), rng, -2.0f, 2.0f);
    const auto ba = randv(size_t(n * 2 * Hv), rng, -3.0f, 3.0f);
    // CPU: the forward pass's ops
    std::vector<float> conv(size_t(n * C)), q(size_t(n * Hk * D)), k(q.size()), v(size_t(n * Hv * D));
    std::vector<float> g(size_t(n * Hv)), beta(g.size()), o(v.size());
    strata::gdn_gates(ba.data(), n, Hk, Hv, a.data(), dt.data(), g.data(), beta.data());
    strata::gdn_conv1d_silu(qkv.data(), n, C, K, conv_st.data(), w.data(), conv.data());
    strata::gdn_split_qkv(conv.data(), n, Hk, Hv, D, eps, q.data(), k.data(), v.data());
    strata::gdn_delta_rule_recurrent({n, Hk, Hv, D}, q.data(), k.data(), v.data(), g.data(), beta.data(), q_scale,
                                     st.data(), o.data(), pool);
    strata::gated_rms_norm(o.data(), z.data(), norm_w.data(), n * Hv, D, eps, o.data());
    // GPU
    upload(d_qkv, qkv);
    upload(d_z, z);
    upload(d_ba, ba);
    auto& cs = dev->compute();
    note_launch(cs, {d_ba.span(), d_a.span(), d_dt.span()}, {d_g.span(), d_b.span()});
    gg::gates(d_ba.as<float>(), n, Hk, Hv, d_a.as<float>(), d_dt.as<float>(), d_g.as<float>(), d_b.as<float>(),
              stream());
    note_launch(cs, {d_qkv.span(), d_w.span(), d_cst.span()}, {d_conv.span(), d_cst.span()});
    gg::conv1d_silu(d_qkv.as<float>(), n, C, K, d_cst.as<float>(), d_w.as<float>(), d_conv.as<float>(), stream());
    note_launch(cs, {d_conv.span()}, {d_q.span(), d_k.span(), d_v.span()});
    gg::split_qkv(d_conv.as<float>(), n, Hk, Hv, D, eps, d_q.as<float>(), d_k.as<float>(), d_v.as<float>(),
                  stream());
    note_launch(cs, {d_q.span(), d_k.span(), d_v.span(), d_g.span(), d_b.span(), d_st.span()},
                {d_st.span(), d_o.span()});
    gg::delta_rule(n, Hk, Hv, D, d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), d_g.as<float>(),
                   d_b.as<float>(), q_scale, d_st.as<float>(), d_o.as<float>(), stream());
    note_launch(cs, {d_o.span(), d_z.span(), d_nw.span()}, {d_o.span()});
    gg::gated_rms_norm(d_o.as<float>(), d_z.as<float>(), d_nw.as<float>(), n * Hv, D, eps, d_o.as<float>(),
                       stream());
    const Err eo = compare(down(d_o, o.size()), o), es = compare(down(d_st, st.size()), st),
              ec = compare(down(d_cst, conv_st.size()), conv_st);
    EXPECT_LT(eo.rel(), 1e-4) << "GDN core output, call " << call << " (" << n << " tokens): " << eo.str();
    EXPECT_LT(es.rel(), 1e-4) << "GDN delta state, call " << call << ": " << es.str();
    EXPECT_EQ(ec.max_abs, 0.0) << "GDN conv state, call " << call << ": " << ec.str();
    std::printf("[ gdn ] core call %d (%lld tokens): out %s | state %s\n", call, static_cast<long long>(n),
                eo.str().c_str(), es.str().c_str());
    ++call;
  }
}

// ---- bad shapes: a clear strata::Error before anything is launched (no GPU needed) ----------------------------

TEST(GdnGpuShapes, BadShapesAreErrors) {
  float* p = reinterpret_cast<float*>(uintptr_t(256));  // never dereferenced: the checks come first
  EXPECT_THROW(gg::delta_rule(1, 2, 3, 128, p, p, p, p, p, 1.0f, p, p, nullptr), strata::Error);  // Hv % Hk
  EXPECT_THROW(gg::delta_rule(1, 1, 1, 257, p, p, p, p, p, 1.0f, p, p, nullptr), strata::Error);  // D > 256
  EXPECT_THROW(gg::delta_rule(-1, 1, 1, 64, p, p, p, p, p, 1.0f, p, p, nullptr), strata::Error);
  EXPECT_THROW(gg::conv1d_silu(p, 4, 8, 4, p, p, p, nullptr), strata::Error);  // y aliases x
  EXPECT_THROW(gg::conv1d_silu(p, 4, 8, 0, p, p, p + 64, nullptr), strata::Error);  // K 0
  EXPECT_THROW(gg::gates(p, 1, 0, 4, p, p, p, p, nullptr), strata::Error);
  EXPECT_THROW(gg::split_qkv(p, 1, 2, 5, 64, 1e-6f, p, p, p, nullptr), strata::Error);
  EXPECT_THROW(gg::gated_rms_norm(p, p, p, 4, 0, 1e-6f, p, nullptr), strata::Error);
  // Zero tokens: nothing to do, no launch, no error.
  EXPECT_NO_THROW(gg::delta_rule(0, 16, 32, 128, p, p, p, p, p, 1.0f, p, p, nullptr));
  EXPECT_NO_THROW(gg::conv1d_silu(p, 0, 8, 4, p, p, p + 64, nullptr));
}

}  // namespace
