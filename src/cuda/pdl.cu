#include "cuda/pdl.cuh"
#include "cuda/pdl_scope.h"
#include "cuda/pdl_trace.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::cuda::pdl {
namespace {
thread_local bool t_plain = false;
}  // namespace

bool plain_launches() { return t_plain; }

int carveout_from_env(const char* name) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return -1;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return *end == '\0' && v >= 0 && v <= 100 ? int(v) : -1;  // anything else ("off", ...): the driver's choice
}

int carveout() {
  static const int value = carveout_from_env("STRATA_CUDA_CARVEOUT");
  return value;
}

void prefer_carveout(const void* kernel) {
  const int c = carveout();
  if (c >= 0) set_kernel_attribute_once(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, c);
}

namespace {
constexpr const char* kLateKernels[] = {"qkv", "wo", "gate_up", "down"};  // launch_late's names
constexpr size_t kLateCount = sizeof(kLateKernels) / sizeof(kLateKernels[0]);
}  // namespace

bool launch_late(const char* name) {
  // STRATA_CUDA_PDL_LATE parsed once into one flag per kernel of kLateKernels.
  static const std::array<bool, kLateCount> late = [] {
    std::array<bool, kLateCount> f{};
    const char* e = std::getenv("STRATA_CUDA_PDL_LATE");
    const std::string list = e != nullptr ? e : kLateDefault;
    size_t at = 0;
    while (at <= list.size()) {
      const size_t comma = std::min(list.find(',', at), list.size());
      std::string item = list.substr(at, comma - at);
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      const auto* hit = std::find(std::begin(kLateKernels), std::end(kLateKernels), item);
      if (hit != std::end(kLateKernels))
        f[size_t(hit - std::begin(kLateKernels))] = true;
      else if (!item.empty() && item != "none")
        std::fprintf(stderr, "strata: STRATA_CUDA_PDL_LATE: unknown kernel '%s' ignored (known: qkv, wo, gate_up, "
                     "down, none)\n", item.c_str());
      at = comma + 1;
    }
    return f;
  }();
  for (size_t i = 0; i < kLateCount; ++i)
    if (std::strcmp(name, kLateKernels[i]) == 0) return late[i];
  return false;
}

PlainLaunches::PlainLaunches(bool on) : prev_(t_plain) {
  if (on) t_plain = true;
}
PlainLaunches::~PlainLaunches() { t_plain = prev_; }

}  // namespace strata::cuda::pdl

namespace strata::cuda::pdl_trace {
namespace {
using Dumper = std::pair<const char*, void (*)(std::FILE*, const char*, const ReadDevice&)>;
std::mutex& dumpers_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<Dumper>& dumpers() {
  static std::vector<Dumper> d;
  return d;
}
}  // namespace

// Called at static initialization by every translation unit of a traced build (cuda/pdl.cuh).
void register_dumper(const char* tu, void (*fn)(std::FILE*, const char*, const ReadDevice&)) {
  const std::lock_guard<std::mutex> lock(dumpers_mu());
  dumpers().push_back({tu, fn});
}

void dump_all(const ReadDevice& read) {
  const std::lock_guard<std::mutex> lock(dumpers_mu());
  const char* path = std::getenv("STRATA_PDL_TRACE_FILE");
  if (dumpers().empty() || path == nullptr) return;
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "strata: STRATA_PDL_TRACE_FILE %s: cannot open\n", path);
    return;
  }
  for (const auto& [tu, fn] : dumpers()) fn(f, tu, read);
  std::fclose(f);
}

}  // namespace strata::cuda::pdl_trace
