#pragma once
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M super-blocks in the integer form of the 16-row
// prefill kernels (q4k_gemm.h): every value is d * sc[s] * (u - 64) with u a byte (the grid magnitude with
// its sign, plus 64: 21..107 for IQ2, 2..126 for IQ3; IQ1's 8 g +- 1 plus 64: 55..73), one integer scale
// per 16 values and one float d a block. ggml's factors become integers: IQ2 d * (0.5 + ls) / 4 =
// (d / 8) * (2 ls + 1); IQ3_XXS d * (0.5 + ls) / 2 = (d / 4) * (2 ls + 1); IQ3_S d * (1 + 2 ls); IQ1
// d * (2 s + 1) * (g +- 1/8) = (d / 8) * (2 s + 1) * (8 g +- 1). The divisions by powers of two are exact.
#include <cstdint>

#include "quant/types.h"

namespace strata::q {

struct IqBlockInts {
  uint8_t u[256];  // value + 64
  int32_t sc[16];  // [value / 16]
  float d;
};

// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.
bool iq_gemm_type(GgmlType t);
// One super-block (blk: its bytes as ggml lays them out) of type t (iq_gemm_type(t)).
void iq_decode_ints(GgmlType t, const uint8_t* blk, IqBlockInts& out);

}  // namespace strata::q
