#include "cuda/pdl.cuh"
#include "cuda/pdl_scope.h"

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace strata::cuda::pdl {
namespace {
thread_local bool t_plain = false;
}  // namespace

bool plain_launches() { return t_plain; }

int carveout() {
  static const int value = [] {
    const char* e = std::getenv("STRATA_CUDA_CARVEOUT");
    if (e == nullptr || *e == '\0') return 100;
    if (std::string(e) == "off") return -1;
    const int v = std::atoi(e);
    return v >= 0 && v <= 100 ? v : 100;
  }();
  return value;
}

void prefer_carveout(const void* kernel) {
  const int c = carveout();
  if (c < 0) return;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({kernel, dev}).second) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, c));
}

PlainLaunches::PlainLaunches(bool on) : prev_(t_plain) {
  if (on) t_plain = true;
}
PlainLaunches::~PlainLaunches() { t_plain = prev_; }

}  // namespace strata::cuda::pdl
