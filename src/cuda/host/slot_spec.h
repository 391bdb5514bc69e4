#pragma once
// --expert-cache N|N%|auto -> a number of expert slots. Pure host arithmetic (strata_core, tested on
// the CPU); the CUDA backend measures the memory and calls it.
#include <cstdint>
#include <string>

namespace strata::cuda {

// "N": N slots; "N%": N percent of `total` (rounded down, 0..100); "auto": avail_bytes / slot_bytes
// (0 when avail_bytes <= 0). Always capped at total. Throws strata::Error for anything else.
//   total = n_layer * n_expert; slot_bytes > 0: bytes of one slot.
int expert_slots_from_spec(const std::string& spec, int total, int64_t slot_bytes, int64_t avail_bytes);

}  // namespace strata::cuda
