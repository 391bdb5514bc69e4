#include "cuda/model_common.h"

#include <vector>

#include "common/error.h"
#include "cpu/half.h"
#include "cuda/quant_kernels.cuh"
#include "quant/dequant.h"

namespace strata::cuda {

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

DevWeight upload_matrix(Device& dev, Transfer& xfer, const Weight& w, const std::string& name, bool exact,
                        RepackLog& log) {
  DevWeight d;
  d.cols = w.ne[0];
  d.rows = w.ne[1] * w.ne[2] * w.ne[3];
  const int64_t n_values = d.rows * d.cols;
  const size_t file_bytes = row_bytes(w.type, d.cols) * size_t(d.rows);
  d.type = exact ? GgmlType::F32 : quant::storage_type(w.type);
  Stream& cs = dev.compute();
  if (d.type == w.type) {
    d.buf = dev.alloc(file_bytes, name);
    xfer.upload(d.buf.span(), w.data, file_bytes, cs, {&cs});
    return d;
  }
  // Repack: dequantize on the CPU (bit-exact with ggml), store as f32 (exact) or f16.
  STRATA_REQUIRE(can_dequantize(w.type), "cuda: {} is {}, which can be neither run nor repacked on the GPU",
                 name, type_name(w.type));
  std::vector<float> f(static_cast<size_t>(n_values));
  dequantize_row(w.type, w.data, f.data(), n_values);
  if (d.type == GgmlType::F32) {
    d.buf = dev.alloc(f.size() * 4, name);
    xfer.upload(d.buf.span(), f.data(), f.size() * 4, cs, {&cs});
  } else if (d.type == GgmlType::F16) {
    std::vector<uint16_t> hb(f.size());
    for (size_t i = 0; i < f.size(); ++i) hb[i] = cpu::float_to_half(f[i]);
    d.buf = dev.alloc(hb.size() * 2, name);
    xfer.upload(d.buf.span(), hb.data(), hb.size() * 2, cs, {&cs});
  } else {
    fail("cuda: no repack of {} from {} to {}", name, type_name(w.type), type_name(d.type));
  }
  log.add(w.type, d.type, file_bytes, d.buf.bytes());
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
