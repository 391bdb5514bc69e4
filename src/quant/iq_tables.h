#pragma once
// IQ-format grids and sign tables (data from ggml, see iq_tables.cpp). Each grid entry packs the 8 (or 4)
// values of one lattice point, one byte per value, little-endian (byte j = value j): unsigned magnitudes
// for IQ2/IQ3 (signs come separately), int8 -1/0/+1 for IQ1.
#include <cstdint>

namespace strata::iq {

extern const uint8_t kIq2SignMask[8];  // ggml: kmask_iq2xs
extern const uint8_t kIq2Signs[128];  // ggml: ksigns_iq2xs
extern const uint64_t kIq2xxsGrid[256];  // ggml: iq2xxs_grid
extern const uint64_t kIq2xsGrid[512];  // ggml: iq2xs_grid
extern const uint64_t kIq2sGrid[1024];  // ggml: iq2s_grid
extern const uint32_t kIq3xxsGrid[256];  // ggml: iq3xxs_grid
extern const uint32_t kIq3sGrid[512];  // ggml: iq3s_grid
extern const int8_t kIq4nlValues[16];  // ggml: kvalues_iq4nl
extern const uint64_t kIq1sGrid[2048];  // ggml: iq1s_grid

inline constexpr float kIq1Delta = 0.125f;  // ggml IQ1S_DELTA / IQ1M_DELTA

}  // namespace strata::iq
