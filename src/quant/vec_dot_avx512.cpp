// AVX-512 (F/BW/VL/VNNI) kernels: the x86 kernels with VNNI multiply-accumulates (vpdpbusd/vpdpwssd).
#define STRATA_VNNI 1
#include "quant/vec_dot_x86.inc"

namespace strata::q {
VecDotFn vec_dot_avx512(GgmlType type) { return x86_kernel(type); }
VecDot4Fn vec_dot4_avx512(GgmlType type) { return x86_kernel4(type); }
VecDot2Fn vec_dot2_avx512(GgmlType type) { return x86_kernel2(type); }
}  // namespace strata::q
