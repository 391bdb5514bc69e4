#pragma once
// The engine: one model, one thread pool, one workspace, and the two ways to run it.
//   prefill(seq, tokens)      many tokens of one sequence, in chunks of n_batch (prompt processing)
//   decode(seqs, tokens)      one token for each of several sequences in one forward pass
//                             (continuous batching: the server puts every active sequence in it)
// Sequences are created by the engine (sized for n_ctx) and owned by the caller; the engine keeps
// nothing about them between calls. Every input is validated here: token ids, context overflow,
// empty input; errors are strata::Error with a message that says what was wrong.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cpu/thread_pool.h"
#include "engine/sampling.h"
#include "model/model.h"

namespace strata {

struct EngineOptions {
  int32_t n_ctx = 4096;       // tokens per sequence (KV cache allocated up front)
  int32_t n_batch = 512;      // tokens per forward pass (prefill chunk; max sequences per decode)
  int n_threads = 0;          // 0: one per hardware thread
  MatmulMode mode = MatmulMode::Fast;
  KvType kv_type = KvType::F32;
  cpu::AttnMath attn = cpu::AttnMath::GgmlF16;  // llama.cpp's flash-attention arithmetic (cpu/ops.h)
  moe::ExpertUsage* usage = nullptr;  // optional expert-usage counter fed by every forward pass
  // decode_logits / prefill_logits (and decode_sample's CPU picks) read the logits where the model's pass
  // left them when it offers that (Model::logits_in_place): no copy of [rows][n_vocab] floats on the host
  // after each pass. The engine turns it off where the environment sets STRATA_LOGITS_IN_PLACE=0 (A/B).
  bool logits_in_place = true;
  // decode_sample on the device also for a batch whose samplers' parameters differ (each row its own rule,
  // DeviceSampling::rules); off: such a batch brings its logits back and picks on the CPU. On since session
  // 39 (H100, `strata serve`, 8 requests at 8 temperatures: 484.1 against 210.2 tok/s; its GPU tests pass);
  // STRATA_DEVICE_MIXED_SAMPLING=0 turns it off (A/B).
  bool mixed_device_sampling = true;
  // decode_sample on the device also for a batch with banned tokens (SampleBans); off: such a batch brings
  // its logits back and the CPU path edits them. STRATA_DEVICE_BANS=0 turns it off (A/B).
  bool device_bans = true;
  // generate chains its decode steps on the device where the model offers it (Model::chains_decode); off: a
  // decode_sample loop. STRATA_DECODE_CHAIN=0 turns it off (A/B).
  bool chain_decode = true;
};

// Tokens some sequences of a decode_sample call never pick: ids (each in [0, n_vocab)) for sequence i where
// rows[i] is nonzero. rows empty: none; else one flag per sequence.
struct SampleBans {
  std::span<const int32_t> ids;
  std::span<const uint8_t> rows;
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, const EngineOptions& opt);

  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return opt_; }
  int32_t n_vocab() const { return model_->n_vocab(); }
  ThreadPool& pool() { return pool_; }
  size_t workspace_bytes() const { return ws_->memory_bytes(); }

  std::unique_ptr<SequenceState> new_sequence() const;

  // Appends `tokens` to seq at positions n_past.. and evaluates them in chunks of n_batch.
  // logits: [n_vocab] of the last token, or with all_logits [tokens.size()][n_vocab]; may be null.
  void prefill(SequenceState& seq, std::span<const int32_t> tokens, float* logits,
               bool all_logits = false);
  // One token for each sequence (seqs distinct), in one forward pass (split if more than n_batch).
  // logits: [seqs.size()][n_vocab].
  void decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens, float* logits);
  // decode, then a pick for each sequence by samplers[i] into out[i] (the caller accept()s it). Where the
  // model samples on its device (a GPU) and every sampler is penalty-free with the same parameters, the
  // picks are made there from the same draws (Sampler::next_draw) and no logits come back; else on the CPU.
  // bans: tokens the flagged sequences never pick (a request's ignore_eos), as if their logits were -inf.
  void decode_sample(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                     std::span<Sampler* const> samplers, int32_t* out, const SampleBans& bans = {});
  // decode() and prefill() with the logits in memory the engine picks: the model's own where it offers
  // room for them in one pass (EngineOptions::logits_in_place), else the engine's. Valid until the next
  // call on this engine. decode_logits: [seqs.size()][n_vocab]; prefill_logits: [n_vocab] of the last
  // token, or with all_logits [tokens.size()][n_vocab].
  std::span<const float> decode_logits(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens);
  // Generation, step after step: step 0 feeds tokens[i] to seqs[i], step s > 0 the picks of step s - 1;
  // each step is a decode_sample (with `bans`, the same every step), after which on_step(s, picks) (picks[i] for seqs[i]; it
  // accept()s them into their samplers where their penalties should see them) says whether to go on.
  // Stops after max_steps steps, when on_step returns false, or before a step that a full context leaves
  // no room for. Returns the steps run (= on_step calls).
  // Chained (where the model offers it, Model::chains_decode, and the picks are made on the device): step
  // s + 1 is launched on the device, from step s's picks there, before on_step(s) runs, so the device does
  // not wait for the host between steps. When on_step(s) stops, step s + 1 is dropped: the sequences end
  // where a step-by-step loop leaves them, and each sampler's draw for it is taken back. The same picks
  // either way (tests/cuda/test_decode_chain_gpu.cpp).
  using StepFn = std::function<bool(int step, std::span<const int32_t> picks)>;
  int generate(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
               std::span<Sampler* const> samplers, int max_steps, const StepFn& on_step,
               const SampleBans& bans = {});
  std::span<const float> prefill_logits(SequenceState& seq, std::span<const int32_t> tokens,
                                        bool all_logits = false);

 private:
  void check_token(int32_t t) const;
  void check_prefill(const SequenceState& seq, std::span<const int32_t> tokens) const;
  // prefill() after check_prefill (decode_impl's counterpart).
  void prefill_impl(SequenceState& seq, std::span<const int32_t> tokens, float* logits, bool all_logits);
  // Memory for `rows` rows of logits: the model's (logits_in_place) when one_pass and it has room, else
  // logits_ (grown to fit).
  float* logits_memory(size_t rows, bool one_pass);
  void decode_impl(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens, float* logits,
                   const DeviceSampling* sampling);
  // Whether decode_sample picks on the device for these samplers and bans; if so fills *ds (its draws from
  // each sampler's next_draw into draws_, per-row rules into rules_) with out as its picks.
  bool device_sampling(std::span<Sampler* const> samplers, const SampleBans& bans, int32_t* out, DeviceSampling* ds);
  // Whether those picks are made on the device (no draws taken); *same: every sampler has the same rule.
  bool picks_on_device(std::span<Sampler* const> samplers, const SampleBans& bans, bool* same) const;
  void check_decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens) const;
  // generate's chained loop (chains_decode and device picks hold).
  int generate_chained(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                       std::span<Sampler* const> samplers, int max_steps, const StepFn& on_step,
                       const SampleBans& bans);
  void check_bans(const SampleBans& bans, size_t n_seqs) const;  // decode_sample's checks of bans
  std::shared_ptr<const Model> model_;
  EngineOptions opt_;
  ThreadPool pool_;
  std::unique_ptr<Workspace> ws_;
  std::vector<BatchToken> batch_;  // [n_batch], reused
  std::vector<float> logits_;      // logits_memory's own rows ([rows][n_vocab], reused)
  std::vector<float> draws_;       // decode_sample's draws on the device path ([n_seqs])
  std::vector<DeviceSampling::Rule> rules_;  // its per-row rules when the samplers differ ([n_seqs])
};

}  // namespace strata
