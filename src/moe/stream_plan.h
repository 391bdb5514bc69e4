#pragma once
// Decode-time streaming of non-resident experts (docs/expert_cache.md): in a decode-sized pass the
// experts a layer's routing picked that are not resident either run on the CPU pool (which reads their
// weights from host memory) or are copied into GPU staging slots over PCIe and run there. Both paths run
// at the same time, so the layer waits for the slower one; the split that balances them is the one that
// minimises max(copies, CPU work). Pure host code: the CUDA model measures the costs, this decides.
#include <cstdint>
#include <string>
#include <vector>

namespace strata::moe {

// A share in [0, 1] written as a plain decimal ("0.375", ".5", "1"): true and *share set, or false for
// anything else (spaces, signs, "nan", "inf", out of range). The share options' one parser.
bool parse_unit_share(const std::string& text, double* share);

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

// Prefill-time streaming (passes of >= 32 tokens): the candidates are the non-resident experts with at
// least STRATA_CUDA_STREAM_MIN_TOKENS pairs, busiest first, up to the staging slots. fixed (the default):
// all of them. auto: the first k of them, k balancing the copies against the CPU pool's pairs (below);
// like decode's auto it depends on timings, so a pass's logits may differ in the last bits from run to run.
struct PrefillStreamMode {
  enum Kind { Fixed, Auto } kind = Fixed;
  // "fixed" or "auto"; anything else is a strata::Error naming `what`.
  static PrefillStreamMode parse(const std::string& text, const std::string& what);
  std::string str() const { return kind == Auto ? "auto" : "fixed"; }
};

// Running costs of a prefill pass's non-resident experts, microseconds: one expert's copy (measured at
// load) and one (token, expert) pair on the CPU pool (averaged over the prefill passes' pool timings:
// 0 until the first, when auto streams every candidate, as fixed does).
class PrefillStreamCosts {
 public:
  explicit PrefillStreamCosts(double copy_us = 0);
  double copy_us() const { return copy_us_; }
  double pair_us() const { return pair_us_; }
  // One timing of the CPU pool: `us` for `pairs` pairs (ignored when pairs <= 0 or the time is not finite);
  // the same exponential average as DecodeStreamCosts::note_cpu.
  void note_cpu(double us, int64_t pairs);

 private:
  double copy_us_ = 0, pair_us_ = 0;
};

// How many of the candidates to copy: pairs[i] is candidate i's pair count (busiest first), other_pairs
// the CPU pool's pairs of the experts that are not candidates (they run there in any case). The k in
// [0, pairs.size()] that minimises max(k * copy_us, pair_us * (other_pairs + pairs[k] + ... )), the larger
// k on ties (the GPU's products are the more accurate). Without both costs measured: all candidates.
int prefill_stream_count(const std::vector<int32_t>& pairs, int64_t other_pairs, const PrefillStreamCosts& costs);

}  // namespace strata::moe
