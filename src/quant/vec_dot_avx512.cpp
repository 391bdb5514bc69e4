#include "quant/vec_dot.h"
namespace strata::q {
VecDotFn vec_dot_avx512(GgmlType) { return nullptr; }
}
