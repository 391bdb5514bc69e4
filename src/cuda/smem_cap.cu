// Shared-memory limits and the blocks-per-SM cap (contract: smem_cap.cuh).
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cuda/cuda_check.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda {
namespace {

// `kern`'s static shared memory and its dynamic limit on the current device, looked up once per (kernel,
// device): the launches of a CPU-pool pass of 9-31 tokens ask for them every layer.
struct KernelSmem {
  int64_t static_bytes = 0, limit = 0;
};
KernelSmem kernel_smem(const void* kern) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, KernelSmem> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kern, dev);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes fa{};
  CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
  const KernelSmem ks{int64_t(fa.sharedSizeBytes), int64_t(optin) - int64_t(fa.sharedSizeBytes)};
  known.emplace(key, ks);
  return ks;
}

}  // namespace

// Why each kernel's own static size: a common bound undercounted the routed gate_up's (~14 KiB), and
// cudaFuncSetAttribute rejects a limit that passes the opt-in with it (session 22's first build of the
// blocks-per-SM cap failed so).
int64_t dynamic_limit(const void* kern) { return kernel_smem(kern).limit; }

void allow_dynamic_bytes(const void* kern, int64_t bytes) {
  const KernelSmem ks = kernel_smem(kern);
  if (bytes + ks.static_bytes <= 48 * 1024) return;
  set_kernel_attribute_once(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ks.limit));
}

int sm_count() {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

int spreading_cap(int64_t blocks, int per_sm) {
  if (per_sm <= 0) return 0;
  const int64_t sms = sm_count();
  return blocks <= int64_t(per_sm) * sms ? per_sm : 0;
}

size_t smem_for_cap(const void* kern, size_t base, int cap, int threads) {
  if (cap <= 0) return base;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t, int, int>, size_t> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kern, dev, base, cap, threads);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0, reserve = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&reserve, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  const KernelSmem ks = kernel_smem(kern);
  // cap + 1 blocks must not fit: each block then takes more than per_sm / (cap + 1), its reserve included.
  const int64_t bytes = (int64_t(per_sm) / (cap + 1) + 1 - reserve - ks.static_bytes + 127) / 128 * 128;
  size_t got = base;
  if (bytes > int64_t(base) && bytes <= ks.limit) {
    allow_dynamic_bytes(kern, bytes);
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, threads, size_t(bytes)));
    if (blocks == cap) got = size_t(bytes);
  }
  known.emplace(key, got);
  return got;
}

}  // namespace strata::cuda
