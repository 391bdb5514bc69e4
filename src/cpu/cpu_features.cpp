#include "cpu/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace strata {
namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
  if (!ymm_os) return f;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = b & (1u << 5);
  f.bmi2 = b & (1u << 8);
  if (zmm_os) {
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vbmi = c & (1u << 1);
    f.avx512vnni = c & (1u << 11);
  }
  return f;
}

CpuLevel parse_env() {
  const char* s = std::getenv("STRATA_CPU");
  const CpuLevel max = cpu_max_level();
  if (!s || !*s) return max;
  std::string v(s);
  CpuLevel want;
  if (v == "scalar") want = CpuLevel::Scalar;
  else if (v == "avx2") want = CpuLevel::Avx2;
  else if (v == "avx512") want = CpuLevel::Avx512;
  else fail("STRATA_CPU={}: expected scalar, avx2 or avx512", v);
  STRATA_REQUIRE(want <= max, "STRATA_CPU={}: this CPU supports at most {}", v, cpu_level_name(max));
  return want;
}

std::atomic<int> g_level{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

CpuLevel cpu_max_level() {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c && f.bmi2;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni) return CpuLevel::Avx512;
  if (avx2) return CpuLevel::Avx2;
  return CpuLevel::Scalar;
}

CpuLevel cpu_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    l = static_cast<int>(parse_env());
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<CpuLevel>(l);
}

void set_cpu_level(CpuLevel level) {
  STRATA_REQUIRE(level <= cpu_max_level(), "CPU level {} is not supported here (max {})",
                 cpu_level_name(level), cpu_level_name(cpu_max_level()));
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

std::string_view cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::Scalar: return "scalar";
    case CpuLevel::Avx2: return "avx2";
    case CpuLevel::Avx512: return "avx512";
  }
  return "?";
}

}  // namespace strata
