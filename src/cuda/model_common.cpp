#include "cuda/model_common.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "common/env_switch.h"
#include "common/error.h"
#include "cpu/half.h"
#include "cuda/gemm_context.h"
#include "cuda/pdl_trace.h"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "quant/dequant.h"
#include "quant/q4_0_x8.h"
#include "quant/q6_k_x8.h"

namespace strata::cuda {

bool int8_activations(bool exact, bool pool_pass, int64_t n, bool have_q8_buffers) {
  return !exact && !pool_pass && n < kGemmMinTokens && have_q8_buffers && q8::enabled();
}

bool int8_output(bool exact, int64_t n, bool have_q8_buffers) {
  return int8_activations(exact, /*pool_pass=*/false, n, have_q8_buffers);
}

DevSpan head(const DeviceBuffer& b, size_t bytes) {
  DevSpan s = b.span();
  STRATA_REQUIRE(bytes <= s.bytes, "cuda: {} bytes asked of the {}-byte buffer {}", bytes, s.bytes, b.name());
  s.bytes = bytes;
  return s;
}
HostSpan head(const PinnedBuffer& b, size_t bytes) {
  HostSpan s = b.span();
  STRATA_REQUIRE(bytes <= s.bytes, "cuda: {} bytes asked of a {}-byte pinned buffer", bytes, s.bytes);
  s.bytes = bytes;
  return s;
}
DevSpan slice(const DeviceBuffer& b, size_t offset, size_t bytes) {
  STRATA_REQUIRE(offset <= b.bytes() && bytes <= b.bytes() - offset, "cuda: bytes [{}, +{}) of the {}-byte buffer {}",
                 offset, bytes, b.bytes(), b.name());
  DevSpan s = b.span();
  s.ptr = static_cast<char*>(s.ptr) + offset;
  s.bytes = bytes;
  return s;
}
HostSpan slice(const PinnedBuffer& b, size_t offset, size_t bytes) {
  STRATA_REQUIRE(offset <= b.bytes() && bytes <= b.bytes() - offset, "cuda: bytes [{}, +{}) of a {}-byte pinned buffer",
                 offset, bytes, b.bytes());
  HostSpan s = b.span();
  s.ptr = static_cast<char*>(s.ptr) + offset;
  s.bytes = bytes;
  return s;
}

void RepackLog::add(GgmlType from, GgmlType to, size_t fb, size_t gb) {
  ++n;
  file_bytes += double(fb);
  gpu_bytes += double(gb);
  const std::string t = std::string(type_name(from)) + "->" + std::string(type_name(to));
  if (types.find(t) == std::string::npos) types += (types.empty() ? "" : ", ") + t;
}

namespace {
// STRATA_CUDA_Q4_0_X8_DENSE: 1 keeps Q4_0 dense matrices that only products read (q|k|v, wo, output; not
// token_embd, which get_rows reads) regrouped as Q4_0_X8 (quant/q4_0_x8.h), 0 as the file's Q4_0. The same
// values, bytes and sums, as for the experts (expert_cache.cpp STRATA_CUDA_Q4_0_X8); why: the int8 decode
// products read Q4_0_X8's codes with aligned 16-byte loads in place, where Q4_0's 18-byte blocks make them
// stage rows in shared memory or take 2-byte loads.
DigitSetting g_dense_x8("STRATA_CUDA_Q4_0_X8_DENSE", "Q4_0 dense products as q4_0x8", 0, 1, 1);
// STRATA_CUDA_Q6_K_X8_DENSE: 1 keeps Q6_K dense matrices that only products read, with rows of whole
// 2048-value groups (the output of llama.cpp's Q4_0 / Q4_K_M / IQ4_XS files, a Q4_K_M file's attn_v), as
// Q6_K_X8 (quant/q6_k_x8.h), 0 as the file's Q6_K. The same values, bytes and sums; why: Q6_K's 210-byte
// blocks make the int8 decode products stage their rows in shared memory (the output at 66-70% of the read
// roofline, sessions 38-41), Q6_K_X8's bodies are read in place with 16-byte loads.
DigitSetting g_dense_q6x8("STRATA_CUDA_Q6_K_X8_DENSE", "Q6_K dense products as q6_kx8", 0, 1, 1);
// STRATA_CUDA_QK_STACK: 1 stacks q and k into one product where v's type differs from theirs (model_common.h
// qk_stack), 0 keeps the three products. On by default since session 38 ran it on an H100: its test with the
// stream checker, and tg64 on a 48-layer Q4_K_M file 509.4 against 499.8 tok/s, 3 of 3 alternating rounds
// (bench/results/2026-12-05-gpu-session38-h100.md).
DigitSetting g_qk_stack("STRATA_CUDA_QK_STACK", "q|k stacked apart from v", 0, 1, 1);
}  // namespace

void set_q4_0_dense_x8(bool on) { g_dense_x8.set(on ? 1 : 0); }
bool q4_0_dense_x8() { return g_dense_x8.get() == 1; }
void set_q6_k_dense_x8(bool on) { g_dense_q6x8.set(on ? 1 : 0); }
bool q6_k_dense_x8() { return g_dense_q6x8.get() == 1; }
void set_qk_stack(bool on) { g_qk_stack.set(on ? 1 : 0); }
bool qk_stack() { return g_qk_stack.get() == 1; }

GgmlType device_type(GgmlType file_type, bool exact) { return exact ? GgmlType::F32 : quant::storage_type(file_type); }

GgmlType product_type(GgmlType file_type, int64_t cols, bool exact) {
  if (!exact && file_type == GgmlType::Q4_0 && cols % kQ4_0X8Values == 0 && q4_0_dense_x8()) return GgmlType::Q4_0_X8;
  if (!exact && file_type == GgmlType::Q6_K && cols % kQ6_KX8Values == 0 && q6_k_dense_x8()) return GgmlType::Q6_K_X8;
  return device_type(file_type, exact);
}

HostMatrix host_matrix(const Weight& w, const std::string& name, bool exact, RepackLog& log, Use use) {
  HostMatrix m;
  m.cols = w.ne[0];
  m.rows = w.ne[1] * w.ne[2] * w.ne[3];
  const int64_t n_values = m.rows * m.cols;
  const size_t file_bytes = row_bytes(w.type, m.cols) * size_t(m.rows);
  m.type = use == Use::products ? product_type(w.type, m.cols, exact) : device_type(w.type, exact);
  if (m.type == GgmlType::Q4_0_X8 || m.type == GgmlType::Q6_K_X8) {  // the same bytes regrouped (product_type
    m.owned.resize(file_bytes);  // checked the columns); not a repack that `log` reports (no kernel or byte lost)
    if (m.type == GgmlType::Q4_0_X8) repack_q4_0_x8(w.data, m.owned.data(), n_values);
    else repack_q6_k_x8(w.data, m.owned.data(), n_values);
    m.data = m.owned.data();
    m.bytes = m.owned.size();
    return m;
  }
  if (m.type == w.type) {
    m.data = w.data;
    m.bytes = file_bytes;
    return m;
  }
  // Repack: dequantize on the CPU (bit-exact with ggml), store as f32 (exact) or f16.
  STRATA_REQUIRE(can_dequantize(w.type), "cuda: {} is {}, which can be neither run nor repacked on the GPU",
                 name, type_name(w.type));
  std::vector<float> f(static_cast<size_t>(n_values));
  dequantize_row(w.type, w.data, f.data(), n_values);
  if (m.type == GgmlType::F32) {
    m.owned.resize(f.size() * 4);
    std::memcpy(m.owned.data(), f.data(), m.owned.size());
  } else if (m.type == GgmlType::F16) {
    m.owned.resize(f.size() * 2);
    auto* hb = reinterpret_cast<uint16_t*>(m.owned.data());
    for (size_t i = 0; i < f.size(); ++i) hb[i] = cpu::float_to_half(f[i]);
  } else {
    fail("cuda: no repack of {} from {} to {}", name, type_name(w.type), type_name(m.type));
  }
  m.data = m.owned.data();
  m.bytes = m.owned.size();
  log.add(w.type, m.type, file_bytes, m.bytes);
  return m;
}

DevWeight upload_matrix(Device& dev, Transfer& xfer, const Weight& w, const std::string& name, bool exact,
                        RepackLog& log, Use use) {
  return upload_stacked(dev, xfer, {&w}, name, exact, log, use);
}

DevWeight upload_stacked(Device& dev, Transfer& xfer, std::initializer_list<const Weight*> ws,
                         const std::string& name, bool exact, RepackLog& log, Use use) {
  DevWeight d;
  std::vector<HostMatrix> parts;
  size_t bytes = 0;
  for (const Weight* w : ws) {
    parts.push_back(host_matrix(*w, name, exact, log, use));
    const HostMatrix& m = parts.back();
    STRATA_REQUIRE(parts.size() == 1 || (m.type == d.type && m.cols == d.cols),
                   "cuda: {}: stacked matrices of different types or widths", name);
    d.type = m.type;
    d.cols = m.cols;
    d.rows += m.rows;
    bytes += m.bytes;
  }
  d.buf = dev.alloc(bytes, name);
  Stream& cs = dev.compute();
  size_t off = 0;
  for (const HostMatrix& m : parts) {  // staged uploads: the host bytes may go once this returns
    xfer.upload(slice(d.buf, off, m.bytes), m.data, m.bytes, cs, {&cs});
    off += m.bytes;
  }
  return d;
}

DevWeight upload_f32(Device& dev, Transfer& xfer, const Weight& w, const std::string& name) {
  STRATA_REQUIRE(w.type == GgmlType::F32, "cuda: {} is {}, expected F32", name, type_name(w.type));
  return upload_f32_values(dev, xfer, w.f32(), w.ne[0], name);
}

DevWeight upload_f32_values(Device& dev, Transfer& xfer, const float* values, int64_t n, const std::string& name) {
  DevWeight d;
  d.type = GgmlType::F32;
  d.cols = n;
  d.rows = 1;
  const size_t bytes = size_t(n) * 4;
  d.buf = dev.alloc(bytes, name);
  Stream& cs = dev.compute();
  xfer.upload(d.buf.span(), values, bytes, cs, {&cs});
  return d;
}

}  // namespace strata::cuda

namespace strata::cuda {

Model::DeviceBandwidth measure_device_bandwidth(Device& dev, Transfer& xfer) {
  Model::DeviceBandwidth r;
  Stream& cs = dev.compute();
  // Seconds per call of `one`: the best of 3 rounds of 4 calls, each round from an idle stream.
  const auto per_call = [&](const std::function<Ticket()>& one) {
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      cs.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      Ticket last;
      for (int i = 0; i < 4; ++i) last = one();
      last.wait();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 4;
      if (round == 0 || sec < best) best = sec;
    }
    return best;
  };
  try {
    const size_t bytes = size_t(256) << 20;
    DeviceBuffer a = dev.alloc(bytes, "bandwidth probe a"), b = dev.alloc(bytes, "bandwidth probe b");
    const double sec = per_call([&] { return xfer.copy(b.span(), a.span(), cs, {&cs}); });
    if (sec > 0) r.device_gbs = 2.0 * double(bytes) / sec / 1e9;
  } catch (const Error&) {
    r.device_gbs = 0;  // no room on the GPU for the probe: not measured
  }
  try {
    const size_t bytes = size_t(64) << 20;
    PinnedBuffer h = dev.alloc_pinned(bytes, "bandwidth probe host");
    DeviceBuffer d = dev.alloc(bytes, "bandwidth probe device");
    h.note_host_access(stream_check::Access::Write);
    std::memset(h.data(), 0, bytes);
    const double sec = per_call([&] { return xfer.upload(d.span(), h.span(), cs, {&cs}); });
    if (sec > 0) r.h2d_gbs = double(bytes) / sec / 1e9;
  } catch (const Error&) {
    r.h2d_gbs = 0;
  }
  cs.synchronize();
  return r;
}

void dump_pdl_trace(Device& dev, Transfer& xfer) noexcept {
  try {
    pdl_trace::dump_all([&](void* dst, const void* src, size_t bytes) {
      xfer.download_sync(dst, DevSpan{const_cast<void*>(src), bytes}, bytes, dev.compute());
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: the PDL trace was not written: %s\n", e.what());
  }
}

}  // namespace strata::cuda
