#include "model/decode_traffic.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.h"

namespace strata {
namespace {

// N of a "blk.N." tensor name, or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t i = 4;
  long v = 0;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && v < 1000000) v = v * 10 + (name[i++] - '0');
  return i < name.size() && name[i] == '.' ? int(v) : -1;
}

}  // namespace

DecodeTraffic decode_traffic(const gguf::File& f, const HParams& hp, int run_layers) {
  DecodeTraffic t;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  for (const gguf::TensorInfo& ti : f.tensors()) {
    const int il = layer_of(ti.name);
    if (il >= run_layers) {
      t.skipped += ti.nbytes;
      continue;
    }
    if (ti.name == "token_embd.weight") {
      const uint64_t rows = std::max<uint64_t>(ti.n_rows(), 1);
      t.embedding += ti.nbytes / rows;
      if (tied) t.dense += ti.nbytes;  // the output product reads the whole matrix
      continue;
    }
    if (ti.name.find("_exps") != std::string::npos) {
      STRATA_REQUIRE(hp.n_expert >= 1 && hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert,
                     "{}: routed-expert tensor {} with {} experts ({} used)", f.path(), ti.name, hp.n_expert,
                     hp.n_expert_used);
      t.routed += ti.nbytes / uint64_t(hp.n_expert) * uint64_t(hp.n_expert_used);
      continue;
    }
    t.dense += ti.nbytes;
  }
  return t;
}

double roofline_tok_s(double bytes_a, double gbs_a, double bytes_b, double gbs_b) {
  double sec = 0;
  for (const auto& [bytes, gbs] : {std::pair{bytes_a, gbs_a}, std::pair{bytes_b, gbs_b}}) {
    if (bytes <= 0) continue;
    if (!(gbs > 0)) return 0;
    sec = std::max(sec, bytes / (gbs * 1e9));
  }
  return sec > 0 ? 1.0 / sec : 0;
}

}  // namespace strata
