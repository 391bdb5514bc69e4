// q8::norm_matvec (contract: q8_kernels.cuh): the decode rmsnorm, its Q8 quantization and a dense matvec in
// one kernel. CPU reference: q8ref::rmsnorm_quantize then q8ref::matvec (the same values);
// tests/cuda/test_q8_kernels.cu compares it bit for bit with rmsnorm_quantize + matvec on the GPU.
// The kernels: q8_norm_matvec_impl.cuh, instantiated per row length in q8_norm_matvec_c*.cu.
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/q8_norm_matvec_impl.cuh"

namespace strata::cuda::q8 {

using namespace norm_detail;

bool norm_matvec_supported(int64_t cols, int64_t n) {
  return n == 1 && (cols == 256 || cols == 1024 || cols == 2048 || cols == 4096);
}

namespace {
EnvSwitch g_norm_early, g_norm_lanes;
DigitSetting g_norm_rows("STRATA_CUDA_QKV_ROWS", "norm_matvec rows a lane group", 0, kMaxRows, 0);
DigitSetting g_norm_per_sm("STRATA_CUDA_QKV_PER_SM", "norm_matvec blocks per SM", 0, 8, 2);
}  // namespace

void set_norm_matvec_rows(int rows) { g_norm_rows.set(rows); }

int norm_matvec_rows() { return g_norm_rows.get(); }

void set_norm_matvec_per_sm(int cap) { g_norm_per_sm.set(cap); }

// Why 3 rows and 2 blocks an SM by default: the 30B-A3B geometry's q|k|v (5120 x 2048) is 320 blocks at 2
// rows, launched while moe_down still runs, and session 22's block records put the launch's latest block
// on an SM of 3 (3 to an SM 4.32 us, 2 to an SM 3.62). At 3 rows it is 214 blocks, at most 2 to an SM.
// H200, 48-layer 30B-A3B geometry at Q4_K fully resident, alternating in one call (session 23): 3 rows
// capped at 2 595.5 / 595.2 tok/s against 582.2 / 580.0 / 580.3 for 2 rows uncapped; 5 rows capped at 1
// (128 blocks) 584.9 / 594.2, uncapped 550.6 / 550.0; 4 rows capped at 2 588.7 / 583.9; 2 rows capped
// at 3 571.5.
int norm_matvec_per_sm() { return g_norm_per_sm.get(); }

void set_norm_matvec_early(bool on) { g_norm_early.set(on); }

bool norm_matvec_early() {
  return g_norm_early.get([] { return env_on_unless_zero("STRATA_CUDA_NORM_EARLY"); });
}

void set_norm_matvec_lanes(bool on) { g_norm_lanes.set(on); }

bool norm_matvec_lanes() {
  return g_norm_lanes.get([] { return env_on_unless_zero("STRATA_CUDA_NORM_LANES"); });
}

bool norm_matvec_takes(GgmlType t) { return supported(t) && !q8ref::low_bit(t); }

bool norm_matvec_enabled() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_NORM_MATVEC");
  return on;
}

void norm_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
                 const float* nw, float eps, int64_t n, float* xn, int8_t* xq, float2* xds, float* y,
                 bool accumulate, cudaStream_t stream) {
  STRATA_REQUIRE(norm_matvec_supported(cols, n), "q8 norm_matvec: {} columns x {} rows is not supported", cols, n);
  STRATA_REQUIRE(norm_matvec_takes(type), "q8 norm_matvec: {} is not one of its types (norm_matvec_takes)",
                 type_name(type));
  q8ref::check_matvec_shape(type, cols, row_bytes, "q8 norm_matvec");
  STRATA_REQUIRE(rows >= 0, "q8 norm_matvec: {} rows", rows);
  const q8d::Align al = q8mv::checked_alignment(type, w, row_bytes, xq, "q8 norm_matvec");
  if (rows == 0) return rmsnorm_quantize(x, nw, n, cols, eps, xn, xq, xds, stream);  // (no blocks to do it)
  const auto* wb = static_cast<const uint8_t*>(w);
  auto go = [&](auto per) {  // the row's values per thread: registers
    return dispatch_per<decltype(per)::value>(type, al, wb, rows, row_bytes, x, nw, eps, xn, xq, xds, y, accumulate,
                                              stream);
  };
  const bool ran = cols == 256    ? go(std::integral_constant<int, 1>{})
                   : cols == 1024 ? go(std::integral_constant<int, 4>{})
                   : cols == 2048 ? go(std::integral_constant<int, 8>{})
                                  : go(std::integral_constant<int, 16>{});
  STRATA_REQUIRE(ran, "q8 norm_matvec: no kernel for {} rows at {}-byte alignment", type_name(type), al.bytes);
}

}  // namespace strata::cuda::q8
