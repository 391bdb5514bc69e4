#include "cuda/pdl.cuh"
#include "cuda/pdl_scope.h"

namespace strata::cuda::pdl {
namespace {
thread_local bool t_plain = false;
}  // namespace

bool plain_launches() { return t_plain; }

PlainLaunches::PlainLaunches(bool on) : prev_(t_plain) {
  if (on) t_plain = true;
}
PlainLaunches::~PlainLaunches() { t_plain = prev_; }

}  // namespace strata::cuda::pdl
