#include <cstdio>
#include <cstdlib>

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

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace strata::cuda
