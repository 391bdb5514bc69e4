#pragma once
// CUDA_CHECK: every CUDA runtime call goes through it. A failure is not recoverable for the context,
// so the handler prints the device, the statement, file:line and the error, then aborts.
#include <cuda_runtime.h>

namespace strata::cuda {
[[noreturn]] void cuda_fail(cudaError_t err, const char* stmt, const char* file, int line);
// The same for a cuBLAS call (status: a cublasStatus_t; int here so this header needs no cuBLAS header).
[[noreturn]] void cublas_fail(int status, const char* stmt, const char* file, int line);
// True when at least one CUDA device can be used (tests skip otherwise).
bool device_available();
// cudaFuncSetAttribute(kernel, attr, value) on the current device, once per (kernel, attr, device): later
// calls only look the triple up (why: the attribute call costs host time on every launch otherwise). A
// caller passes the same value for the same kernel and attribute every time.
void set_kernel_attribute_once(const void* kernel, cudaFuncAttribute attr, int value);
}  // namespace strata::cuda

#define CUDA_CHECK(stmt)                                                   \
  do {                                                                     \
    cudaError_t strata_err_ = (stmt);                                      \
    if (strata_err_ != cudaSuccess)                                        \
      ::strata::cuda::cuda_fail(strata_err_, #stmt, __FILE__, __LINE__);   \
  } while (0)

// After a kernel launch: catches launch-configuration errors at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Every cuBLAS call goes through it (include <cublas_v2.h> first).
#define CUBLAS_CHECK(stmt)                                                             \
  do {                                                                                 \
    const int strata_st_ = static_cast<int>(stmt);                                     \
    if (strata_st_ != 0 /* CUBLAS_STATUS_SUCCESS */)                                   \
      ::strata::cuda::cublas_fail(strata_st_, #stmt, __FILE__, __LINE__);              \
  } while (0)
