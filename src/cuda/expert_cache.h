#pragma once
// The GPU expert cache (issue 7): n_slots device slots, each holding one expert (gate, up, down) of one
// layer; the residency table int32 [n_layer][n_expert] -> slot or -1 on the host (strata::moe::Residency) and on
// the device; the pinned host copy of every expert that slots are filled from; adaptation.
//
// Ordering, by construction (every copy goes through cuda/transfer.h):
//  * The device table is written only by Transfer::upload with producer = compute stream and consumer =
//    compute stream: it lands after every kernel that read the old table and before every kernel that
//    reads the new one.
//  * Replacing expert A (slot s) by B is two-phase. begin_step() k: evict A (host + device table: no
//    kernel enqueued after this reads slot s), then upload B into s with producer = compute, so the copy
//    starts only after every kernel enqueued before it (the only ones that may read A from s) finished.
//    A later begin_step(), once that copy's ticket is done: admit B (table[B] = s), the compute stream waits
//    on the copy's event, and the table is uploaded again.
//  * The host table changes only in begin_step(), on the forward thread, so within one forward pass the
//    host (CPU pool: which experts to run on the CPU) and the device (which experts to run from slots)
//    see the same table.
// Adaptation planning (strata::moe::Residency::plan over decayed scores) runs on a helper thread, on copies of
// the residency and the scores taken under mu_ in end_step(); begin_step() only picks up a finished plan
// and drops any swap the table has made stale since (in already resident, out no longer in its slot).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/transfer.h"
#include "moe/expert_usage.h"
#include "moe/residency.h"
#include "quant/types.h"

namespace strata::cuda {

// One expert tensor of one layer as the model file holds it: [n_expert][rows][cols] in `type`.
struct ExpertTensor {
  GgmlType type{};
  const void* data = nullptr;  // host (mapped file)
};
struct LayerExperts {
  ExpertTensor gate, up;  // [n_expert][n_ff][n_embd]
  ExpertTensor down;      // [n_expert][n_embd][n_ff]
};

// Whether caches built from now on keep Q4_0 experts (rows of whole 256-value groups) as Q4_0_X8
// (quant/q4_0_x8.h; the same values and sums, aligned loads for the decode kernels). Default: the
// environment's STRATA_CUDA_Q4_0_X8 (0 or 1), else on. set (tests, benchmarks) wins.
void set_q4_0_experts_x8(bool on);
bool q4_0_experts_x8();
// Whether models loaded from now on keep Q6_K expert down matrices padded as Q6_K_P (quant/q6_k_p.h; the same
// values and sums, every block 16-byte aligned for moe_down's loads, 1.067x the bytes). Default: the
// environment's STRATA_CUDA_Q6_K_P_DOWN (0 or 1), else on. set (tests) wins.
void set_q6_k_down_padded(bool on);
bool q6_k_down_padded();

struct ExpertCacheConfig {
  int n_slots = 0;        // slots on the GPU (capped at n_layer * n_expert)
  bool exact = false;     // slots hold f32 (dequantized on the CPU): the exact mode
  int adapt_every = 0;    // forward passes between adaptation plans; 0 = adaptation off
  int max_swaps = 0;      // per plan; 0 = max(1, n_slots / 16)
  double decay = 0.5;     // scores *= decay after each plan
  int n_stage = 0;        // staging slots (after the n_slots) for experts streamed into one pass (stage())
};

class ExpertCache {
 public:
  struct Stats {
    int64_t hits = 0, misses = 0;  // expert selections served from a slot / by the CPU pool
    int64_t swaps = 0;             // admissions by adaptation
    int64_t streamed = 0;          // non-resident experts copied into a staging slot for one pass
    uint64_t bytes_uploaded = 0;   // host -> slots, including the first fill
    uint64_t bytes_streamed = 0;   // of them, the staging copies (each the layer's expert_bytes)
    int slots_used = 0, n_slots = 0;
    double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
  };

  // Bytes of one slot for these layers (the largest layer; slots are uniform), in exact or GPU storage
  // types. For sizing --expert-cache auto before constructing.
  static int64_t slot_bytes_for(int64_t n_embd, int64_t n_ff, const std::vector<LayerExperts>& layers,
                                bool exact);

  // Builds the pinned host copy of every expert in slot layout (repacking types without a GPU kernel,
  // or to f32 when exact), allocates the slots and the device table, places experts (from `profile` when
  // given, else evenly), uploads them and the table. Throws strata::Error when memory is short (says
  // how much was asked).
  ExpertCache(Device& dev, Transfer& xfer, int64_t n_embd, int64_t n_ff, int n_expert,
              std::vector<LayerExperts> layers, const ExpertCacheConfig& cfg,
              const strata::moe::ExpertUsage* profile);
  ~ExpertCache();  // stops the helper thread and waits for the copies in flight
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Forward thread, before the first kernel of a forward pass: commits finished uploads and starts the
  // swaps of a ready adaptation plan (see above). Cheap when there is nothing to do.
  void begin_step();
  // The host learned a layer's routing (ids: n expert ids, n = tokens * k): hit/miss statistics and the
  // adaptation scores. Call once per layer per forward pass.
  void record(int layer, const int32_t* ids, int64_t n);
  // Forward thread, after the last kernel of a forward pass: counts the step, wakes the planner every
  // adapt_every steps.
  void end_step();

  const strata::moe::Residency& residency() const { return res_; }

  // Streaming (prefill): the pass copies a non-resident expert into staging slot j (< n_stage()) and
  // runs it from there with a table row of its own. The copy comes from the pinned host copy, with
  // producer = consumer = the compute stream: it starts after every kernel enqueued before it (the
  // earlier readers of slot j) and every kernel enqueued after it sees the expert. Returns the slot index
  // for the row (n_slots + j). Forward thread only.
  int n_stage() const { return n_stage_; }
  int32_t stage(int layer, int expert, int j);
  // Microseconds to copy one expert into a staging slot as stage() does (0 without staging slots): the
  // copies of up to 8 experts of layer 0, timed after one unmeasured round, waiting for the compute
  // stream. For the decode streaming split (moe/stream_plan.h). Forward thread, between passes.
  double time_stage_copy();
  // For the checker, next to a launch that reads experts through `row_buf` (a pass's own row, whose
  // host copy is `row`: [n_expert] slot or -1): notes reads of row_buf and of every slot it names.
  void note_row_reads(const Stream& s, const DevSpan& row_buf, const int32_t* row, Site site = Site::here()) const;
  moe::ExpertLayerView layer_view(int layer) const;
  const int32_t* device_layer_row(int layer) const;  // [n_expert] of the device table
  DevSpan table_span() const { return table_.span(); }
  // The whole slot allocation (for kernel pointers). For the stream-order checker every slot is its own
  // buffer (a Region): note a kernel's slot reads with note_expert_reads, or slot_span(s) for one slot.
  DevSpan slots_span() const { return slots_.span(); }
  DevSpan slot_span(int32_t slot) const;  // slot in [0, n_slots + n_stage)
  // For the checker, next to a launch on `s` that reads layer `layer`'s experts through the device table
  // (moe_gate_up / moe_down): notes reads of the table and of every slot the layer's row points to now.
  // The table is changed only in begin_step(), so this is what the kernel may read.
  void note_expert_reads(const Stream& s, int layer, Site site = Site::here()) const;
  int64_t slot_bytes() const { return slot_bytes_; }
  size_t device_bytes() const { return slots_.bytes() + table_.bytes(); }
  size_t host_bytes() const { return host_.bytes(); }
  // Host (pinned) copy of expert e of layer l in slot layout (tests; direct reads).
  const uint8_t* host_expert(int layer, int expert) const;
  // A view of layer `layer` whose non-resident pairs are read from the pinned host copy at `share`
  // (moe/direct_rule.h; over PCIe: the caller checks the device can, see Transfer::mapped). The host copy
  // never changes after construction, so reading it needs no ordering. With fetch and enough staging
  // slots for n tokens of k pairs (n * direct_count(k, share)), the view names the first of them as its
  // staging (stage, stage_per_token; moe_direct_fetch fills them on the compute stream, like any kernel:
  // ordered against the other kernels and, through the transfer module, against streaming's copies into
  // the same slots); else the kernels read the host copy themselves.
  moe::ExpertLayerView direct_view(int layer, int share, int64_t n, int k, bool fetch) const;
  // For the checker, next to a launch on `s` that writes (moe_direct_fetch) or reads (the expert kernels)
  // the first `count` staging slots.
  void note_stage_access(const Stream& s, int count, bool write, Site site = Site::here()) const;

  Stats stats() const;
  void reset_stats();

  // Tests: plan and start swaps now (as if adapt_every were reached), and wait until every started swap
  // is admitted (running begin_step until then).
  void adapt_now();
  void drain();

 private:
  struct Pending {
    strata::moe::Swap swap;
    Ticket copy;
  };
  void upload_table();
  // The pinned host copy of one expert, as the source of a direct (DMA) upload into a slot: the layer's
  // expert_bytes (a slot's tail past them is never read). host_slot_span: the whole slot_bytes.
  HostSpan host_expert_span(int layer, int expert) const;
  HostSpan host_slot_span(int layer, int expert) const;
  void start_swaps(const std::vector<strata::moe::Swap>& plan);
  void planner_loop();

  Device& dev_;
  Transfer& xfer_;
  int64_t n_embd_, n_ff_;
  int n_expert_;
  std::vector<LayerExperts> layers_;
  ExpertCacheConfig cfg_;
  std::vector<moe::ExpertLayerView> views_;  // [n_layer] (slots pointer filled in)
  int64_t slot_bytes_ = 0;
  int n_stage_ = 0;
  PinnedBuffer host_;    // [n_layer][n_expert][slot_bytes]
  DeviceBuffer slots_;   // [n_slots + n_stage][slot_bytes]
  DeviceBuffer table_;   // int32 [n_layer][n_expert]
  std::vector<Region> slot_regions_;  // [n_slots + n_stage]: each slot is its own checked buffer
  strata::moe::Residency res_;
  std::vector<Pending> pending_;

  // adaptation
  strata::moe::UsageScores scores_;
  std::mutex mu_;  // guards scores_ snapshot hand-off, plan_, flags
  std::condition_variable cv_;
  std::vector<double> snapshot_;
  strata::moe::Residency res_snapshot_;  // the table the planner plans against (copied with snapshot_)
  std::vector<strata::moe::Swap> plan_;
  bool plan_ready_ = false, want_plan_ = false, stop_ = false;
  std::thread planner_;
  int64_t steps_ = 0;
  Stats stats_;
};

}  // namespace strata::cuda
