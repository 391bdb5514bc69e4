#pragma once
// Decode-time streaming of non-resident experts (docs/expert_cache.md): in a decode-sized pass the
// experts a layer's routing picked that are not resident either run on the CPU pool (which reads their
// weights from host memory) or are copied into GPU staging slots over PCIe and run there. Both paths run
// at the same time, so the layer waits for the slower one; the split that balances them is the one that
// minimises max(copies, CPU work). Pure host code: the CUDA model measures the costs, this decides.
#include <string>

namespace strata::moe {

// What a decode pass does with its misses: off (all on the CPU pool), a fixed share of them copied, or
// auto (balanced by the measured costs).
struct DecodeStreamMode {
  enum Kind { Off, Share, Auto } kind = Auto;
  double share = 0;  // Share: fraction of a layer's misses copied, in (0, 1]
  // "auto", "off", or a fraction in [0, 1] ("0" is off); anything else is a strata::Error naming `what`.
  static DecodeStreamMode parse(const std::string& text, const std::string& what);
  std::string str() const;
};

// Running costs of one non-resident expert in a decode pass, microseconds.
class DecodeStreamCosts {
 public:
  // copy_us: one expert host -> GPU staging slot (measured at load); the CPU estimate starts equal to it
  // (a half split) until the pool has been timed.
  explicit DecodeStreamCosts(double copy_us = 0);
  double copy_us() const { return copy_us_; }
  double cpu_us() const { return cpu_us_; }
  // One timing of the CPU pool: `us` for `experts` distinct experts (ignored when experts <= 0 or the
  // time is not finite). Exponential average (weight 1/8 for the new one): noise from one layer does not
  // swing the split, a lasting change (another load on the host's memory) moves it within tens of layers.
  void note_cpu(double us, int experts);

 private:
  double copy_us_ = 0, cpu_us_ = 0;
};

// How many of `misses` experts (each needed by a decode pass, busiest first) to copy to the GPU; the rest
// run on the CPU pool. Auto: the k in [0, misses] that minimises max(k * copy_us, (misses - k) * cpu_us),
// the smaller k on ties (a copy also costs PCIe and a staging slot). Share: round(share * misses).
// Never more than max_slots.
int decode_stream_count(int misses, const DecodeStreamMode& mode, const DecodeStreamCosts& costs, int max_slots);

}  // namespace strata::moe
