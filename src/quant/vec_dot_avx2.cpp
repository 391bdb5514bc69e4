// AVX2 kernels (placeholder table filled below).
#include "quant/vec_dot.h"
namespace strata::q {
VecDotFn vec_dot_avx2(GgmlType) { return nullptr; }
}
