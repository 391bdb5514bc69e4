#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <tuple>

#include <cublas_v2.h>

#include "cuda/cuda_check.cuh"

namespace strata::cuda {

void cuda_fail(cudaError_t err, const char* stmt, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  std::fprintf(stderr, "strata: CUDA error on device %d: %s (%s)\n  in %s\n  at %s:%d\n", dev,
               cudaGetErrorString(err), cudaGetErrorName(err), stmt, file, line);
  std::fflush(stderr);
  std::abort();
}

void cublas_fail(int status, const char* stmt, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  const auto st = static_cast<cublasStatus_t>(status);
  std::fprintf(stderr, "strata: cuBLAS error on device %d: %s (%s, %d)\n  in %s\n  at %s:%d\n", dev,
               cublasGetStatusString(st), cublasGetStatusName(st), status, stmt, file, line);
  std::fflush(stderr);
  std::abort();
}

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void set_kernel_attribute_once(const void* kernel, cudaFuncAttribute attr, int value) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;  // (kernel, attribute, device)
  const std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({kernel, int(attr), dev}).second) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, attr, value));
}

}  // namespace strata::cuda
