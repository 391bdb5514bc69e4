// q8::norm_matvec's kernels for rows of 4096 values, every format (q8_norm_matvec_impl.cuh says why a file each).
#include "cuda/q8_norm_matvec_impl.cuh"

namespace strata::cuda::q8::norm_detail {
STRATA_NORM_MATVEC_PER(, 16)
}  // namespace strata::cuda::q8::norm_detail
