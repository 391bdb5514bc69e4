#pragma once
// What the CPU can do (cpuid + xgetbv) and which kernel level the process uses.
// The level is the best the CPU and OS support, unless the environment variable STRATA_CPU
// (scalar | avx2 | avx512) forces a lower one (tests and benchmarks compare the paths this way).
#include <string_view>

namespace strata {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512vbmi = false;
};

enum class CpuLevel { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const CpuFeatures& cpu_features();  // detected once

// The best level the hardware supports: Avx512 needs F/BW/VL/DQ/VNNI (our AVX-512 kernels use
// VNNI dot products), Avx2 needs AVX2+FMA+F16C+BMI2.
CpuLevel cpu_max_level();

// The level in use: cpu_max_level(), or STRATA_CPU if set (read once; a level the CPU lacks or an
// unknown name is a strata::Error).
CpuLevel cpu_level();

// Runs of this process may switch level explicitly (tests); throws if the CPU lacks it.
void set_cpu_level(CpuLevel level);

std::string_view cpu_level_name(CpuLevel level);

}  // namespace strata
