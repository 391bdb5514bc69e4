#pragma once
// The start of every benchmark in bench/cuda (header only: each .cu there is one executable): integer
// flags "--name N", the check for a CUDA device, and a random routing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "cuda/cuda_check.cuh"

namespace strata::bench {

struct IntFlag {
  const char* name;  // e.g. "--reps"
  int* value;        // in: the default; out: the value given
  int min;           // smaller values are raised to this
};

// Parses argv (only the flags given, each with an integer value) and checks for a device. Returns 0 to
// go on; 2 after printing the usage (an unknown flag, a missing or non-integer value); 1 when there is no
// CUDA device. `program` names the benchmark in the messages.
inline int start(const char* program, int argc, char** argv, std::initializer_list<IntFlag> flags) {
  auto usage = [&] {
    std::fprintf(stderr, "usage: %s", program);
    for (const IntFlag& f : flags) std::fprintf(stderr, " [%s N (default %d)]", f.name, *f.value);
    std::fprintf(stderr, "\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const IntFlag* hit = nullptr;
    for (const IntFlag& f : flags)
      if (std::strcmp(argv[i], f.name) == 0) hit = &f;
    if (hit == nullptr || i + 1 >= argc) return usage();
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0' || v > 1000000000L || v < -1000000000L) return usage();
    *hit->value = v < hit->min ? hit->min : int(v);
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "%s: no CUDA device\n", program);
    return 1;
  }
  return 0;
}

// ids [rows][k]: k distinct experts of n_expert a row, from a linear congruential generator seeded with
// `seed` (the same routing every run).
inline std::vector<int32_t> random_routing(int64_t rows, int k, int n_expert, uint32_t seed) {
  std::vector<int32_t> ids(size_t(rows) * size_t(k));
  uint32_t rs = seed;
  for (int64_t t = 0; t < rows; ++t)
    for (int j = 0; j < k; ++j) {
      int e;
      bool dup;
      do {
        rs = rs * 1664525u + 1013904223u;
        e = int(rs >> 8) % n_expert;
        dup = false;
        for (int i = 0; i < j; ++i) dup |= ids[size_t(t * k + i)] == e;
      } while (dup);
      ids[size_t(t * k + j)] = e;
    }
  return ids;
}

}  // namespace strata::bench
