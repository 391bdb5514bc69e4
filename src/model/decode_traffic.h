#pragma once
// The weight bytes one decoded token reads, from a GGUF file's tensors: the numerator of a decode
// roofline (bytes per token / measured memory bandwidth = the tok/s no implementation can beat on that
// memory). `strata bench` prints it next to tg.
#include <cstdint>

#include "gguf/gguf.h"
#include "model/hparams.h"

namespace strata {

struct DecodeTraffic {
  uint64_t dense = 0;      // read whole by every token: attention/GDN, norms, routers, shared experts, output
  uint64_t routed = 0;     // routed experts: k_used / n_expert of each `*_exps` tensor (uniform routing)
  uint64_t embedding = 0;  // one row of token_embd (its whole matrix counts in dense when the output is tied)
  uint64_t skipped = 0;    // tensors of layers the forward does not run (qwen3next's MTP blocks): not counted
  uint64_t total() const { return dense + routed + embedding; }
};

// run_layers: the layers a decode step runs (Model::routed_layers()); tensors of "blk.N." with
// N >= run_layers are skipped. A routed-expert tensor needs hp.n_expert >= 1 and k_used <= n_expert.
DecodeTraffic decode_traffic(const gguf::File& f, const HParams& hp, int run_layers);

// Decode roofline of a split between two memories read at the same time: bytes_a at gbs_a and bytes_b at
// gbs_b (GB/s, 1e9); tok/s = 1 / max(bytes_a / gbs_a, bytes_b / gbs_b). A memory with 0 bytes does not
// count; 0 when nothing is read or a needed bandwidth is not positive.
double roofline_tok_s(double bytes_a, double gbs_a, double bytes_b = 0, double gbs_b = 0);

}  // namespace strata
