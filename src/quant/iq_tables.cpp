// IQ-format lattice grids and sign tables: format DATA taken verbatim from ggml (ggml/src/ggml-common.h,
// llama.cpp commit 80fb11a, MIT license) so that dequantization is bit-exact with the GGUF ecosystem.
// The large initializers live in quant/iq_grid_data.h, shared with the GPU's copies.
#include "quant/iq_tables.h"

#include "quant/iq_grid_data.h"

namespace strata::iq {

alignas(64) const uint8_t kIq2SignMask[8] = {
    1, 2, 4, 8, 16, 32, 64, 128,
};

alignas(64) const uint8_t kIq2Signs[128] = STRATA_IQ_INIT_IQ2_SIGNS;

alignas(64) const uint64_t kIq2xxsGrid[256] = STRATA_IQ_INIT_IQ2XXS_GRID;

alignas(64) const uint64_t kIq2xsGrid[512] = STRATA_IQ_INIT_IQ2XS_GRID;

alignas(64) const uint64_t kIq2sGrid[1024] = STRATA_IQ_INIT_IQ2S_GRID;

alignas(64) const uint32_t kIq3xxsGrid[256] = STRATA_IQ_INIT_IQ3XXS_GRID;

alignas(64) const uint32_t kIq3sGrid[512] = STRATA_IQ_INIT_IQ3S_GRID;

alignas(64) const int8_t kIq4nlValues[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

alignas(64) const uint64_t kIq1sGrid[2048] = STRATA_IQ_INIT_IQ1S_GRID;

}  // namespace strata::iq
