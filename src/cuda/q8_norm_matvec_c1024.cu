// q8::norm_matvec's kernels for rows of 1024 values, every format (q8_norm_matvec_impl.cuh says why a file each).
#include "cuda/q8_norm_matvec_impl.cuh"

namespace strata::cuda::q8::norm_detail {
STRATA_NORM_MATVEC_PER(, 4)
}  // namespace strata::cuda::q8::norm_detail
