#include "cuda/pdl.cuh"
#include "cuda/pdl_scope.h"
#include "cuda/pdl_trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::cuda::pdl {
namespace {
thread_local bool t_plain = false;
}  // namespace

bool plain_launches() { return t_plain; }

int carveout() {
  static const int value = [] {
    const char* e = std::getenv("STRATA_CUDA_CARVEOUT");
    if (e == nullptr || *e == '\0' || std::string(e) == "off") return -1;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    return *end == '\0' && v >= 0 && v <= 100 ? int(v) : -1;  // anything else: the driver's choice
  }();
  return value;
}

void prefer_carveout(const void* kernel) {
  const int c = carveout();
  if (c >= 0) set_kernel_attribute_once(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, c);
}

bool launch_late(const char* name) {
  static const std::vector<std::string> late = [] {
    const char* e = std::getenv("STRATA_CUDA_PDL_LATE");
    const std::string list = e != nullptr ? e : kLateDefault;
    std::vector<std::string> v;
    size_t at = 0;
    while (at <= list.size()) {
      const size_t comma = std::min(list.find(',', at), list.size());
      std::string name = list.substr(at, comma - at);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      if (!name.empty()) {
        if (name != "none" && name != "qkv" && name != "wo" && name != "gate_up" && name != "down")
          std::fprintf(stderr, "strata: STRATA_CUDA_PDL_LATE: unknown kernel '%s' ignored (known: qkv, wo, gate_up, "
                       "down, none)\n", name.c_str());
        v.push_back(name);
      }
      at = comma + 1;
    }
    return v;
  }();
  return std::find(late.begin(), late.end(), std::string(name)) != late.end();
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
