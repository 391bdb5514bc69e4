#pragma once
// Device copies of the IQ grids and sign table (ggml data, MIT), for the IQ decoders in
// dequant_device.cuh: static __device__ const arrays (one copy per CUDA file that uses them: no copy
// call is needed to fill them), initialized from the same macros as the CPU's quant/iq_tables.cpp
// (quant/iq_grid_data.h), so the two are one source. tests/cuda/test_dequant_device_host.cu still checks
// every value.
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/iq_grid_data.h"

namespace strata::cuda::dq {

static __device__ const uint8_t kDevIq2Signs[128] = STRATA_IQ_INIT_IQ2_SIGNS;

static __device__ const uint64_t kDevIq2xxsGrid[256] = STRATA_IQ_INIT_IQ2XXS_GRID;

static __device__ const uint64_t kDevIq2xsGrid[512] = STRATA_IQ_INIT_IQ2XS_GRID;

static __device__ const uint64_t kDevIq2sGrid[1024] = STRATA_IQ_INIT_IQ2S_GRID;

static __device__ const uint32_t kDevIq3xxsGrid[256] = STRATA_IQ_INIT_IQ3XXS_GRID;

static __device__ const uint32_t kDevIq3sGrid[512] = STRATA_IQ_INIT_IQ3S_GRID;

static __device__ const uint64_t kDevIq1sGrid[2048] = STRATA_IQ_INIT_IQ1S_GRID;

}  // namespace strata::cuda::dq
