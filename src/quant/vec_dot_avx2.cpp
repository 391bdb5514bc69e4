// AVX2 + FMA + F16C kernels (this file is compiled with those flags; picked at run time).
#define STRATA_VNNI 0
#include "quant/vec_dot_x86.inc"

namespace strata::q {
VecDotFn vec_dot_avx2(GgmlType type) { return x86_kernel(type); }
VecDot4Fn vec_dot4_avx2(GgmlType type) { return x86_kernel4(type); }
VecDot2Fn vec_dot2_avx2(GgmlType type) { return x86_kernel2(type); }
}  // namespace strata::q
