#include "engine/engine.h"

#include <algorithm>

#include "common/env_switch.h"
#include "common/error.h"
#include "cpu/ops.h"
#include "quant/q4k_repack.h"

namespace strata {

namespace {
// Whether bans apply to some sequence of the call (some banned id and some flagged row).
bool bans_some_row(const SampleBans& bans) {
  return !bans.ids.empty() && std::any_of(bans.rows.begin(), bans.rows.end(), [](uint8_t r) { return r != 0; });
}
}  // namespace

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& opt)
    : model_(std::move(model)), opt_(opt), pool_(opt.n_threads) {
  STRATA_REQUIRE(opt_.n_ctx >= 1, "--ctx must be >= 1, got {}", opt_.n_ctx);
  STRATA_REQUIRE(opt_.n_batch >= 1, "--batch must be >= 1, got {}", opt_.n_batch);
  opt_.n_batch = std::min(opt_.n_batch, opt_.n_ctx);
  opt_.n_threads = pool_.size();
  opt_.logits_in_place = opt_.logits_in_place && env_on_unless_zero("STRATA_LOGITS_IN_PLACE");
  opt_.mixed_device_sampling = env_digit("STRATA_DEVICE_MIXED_SAMPLING", 0, 1, opt_.mixed_device_sampling) == 1;
  opt_.device_bans = opt_.device_bans && env_on_unless_zero("STRATA_DEVICE_BANS");
  opt_.chain_decode = opt_.chain_decode && env_on_unless_zero("STRATA_DECODE_CHAIN");
  ws_ = model_->new_workspace(opt_.n_batch, opt_.n_ctx, pool_.size());
  // Fast-mode prefill of Q4_K weights may use 8-row repacked copies, made lazily and bounded by this
  // budget (STRATA_Q4K_REPACK_MIB, off by default; bit-identical results; quant/q4k_repack.h).
  // Never lowers a budget another engine set.
  if (opt_.mode == MatmulMode::Fast)
    q::q4k_repack_set_budget(std::max(q::q4k_repack_budget(), q::q4k_repack_default_budget()));
  batch_.reserve(size_t(opt_.n_batch));
}

std::unique_ptr<SequenceState> Engine::new_sequence() const {
  return model_->new_sequence(opt_.n_ctx, opt_.kv_type);
}

void Engine::check_token(int32_t t) const {
  STRATA_REQUIRE(t >= 0 && t < n_vocab(),
                 "token id {} is out of range: the vocabulary has {} tokens (0..{})", t, n_vocab(),
                 n_vocab() - 1);
}

void Engine::check_prefill(const SequenceState& seq, std::span<const int32_t> tokens) const {
  STRATA_REQUIRE(!tokens.empty(), "empty prompt: nothing to evaluate");
  STRATA_REQUIRE(tokens.size() <= size_t(seq.space_left()),
                 "context overflow: {} tokens already in the sequence + {} new > --ctx {}",
                 seq.n_past(), tokens.size(), seq.n_ctx());
  for (int32_t t : tokens) check_token(t);
}

float* Engine::logits_memory(size_t rows, bool one_pass) {
  if (opt_.logits_in_place && one_pass)
    if (float* p = model_->logits_in_place(*ws_, int64_t(rows))) return p;
  logits_.resize(rows * size_t(n_vocab()));  // grows once to the largest call seen, then reused
  return logits_.data();
}

std::span<const float> Engine::decode_logits(std::span<SequenceState* const> seqs,
                                             std::span<const int32_t> tokens) {
  float* out = logits_memory(seqs.size(), seqs.size() <= size_t(opt_.n_batch));
  decode_impl(seqs, tokens, out, nullptr);
  return {out, seqs.size() * size_t(n_vocab())};
}

std::span<const float> Engine::prefill_logits(SequenceState& seq, std::span<const int32_t> tokens,
                                              bool all_logits) {
  check_prefill(seq, tokens);  // (before any memory is sized by tokens)
  // Without all_logits only the last pass writes (one row), so any number of passes may use the model's.
  const size_t rows = all_logits ? tokens.size() : 1;
  float* out = logits_memory(rows, !all_logits || tokens.size() <= size_t(opt_.n_batch));
  prefill_impl(seq, tokens, out, all_logits);
  return {out, rows * size_t(n_vocab())};
}

void Engine::prefill(SequenceState& seq, std::span<const int32_t> tokens, float* logits,
                     bool all_logits) {
  check_prefill(seq, tokens);
  prefill_impl(seq, tokens, logits, all_logits);
}

void Engine::prefill_impl(SequenceState& seq, std::span<const int32_t> tokens, float* logits,
                          bool all_logits) {
  SequenceState* seqs[1] = {&seq};
  const size_t V = size_t(n_vocab());
  for (size_t b = 0; b < tokens.size(); b += size_t(opt_.n_batch)) {
    const size_t e = std::min(tokens.size(), b + size_t(opt_.n_batch));
    batch_.clear();
    for (size_t i = b; i < e; ++i)
      batch_.push_back({tokens[i], seq.n_past() + int32_t(i - b), 0,
                        logits && (all_logits || i + 1 == tokens.size())});
    float* out = !logits ? nullptr : all_logits ? logits + b * V : logits;
    model_->forward({batch_, seqs}, *ws_, out, pool_, {opt_.mode, opt_.attn, opt_.usage});
    seq.advance(int32_t(e - b));
  }
}

void Engine::decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                    float* logits) {
  decode_impl(seqs, tokens, logits, nullptr);
}

void Engine::decode_sample(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                           std::span<Sampler* const> samplers, int32_t* out, const SampleBans& bans) {
  STRATA_REQUIRE(samplers.size() == seqs.size(), "decode: {} sequences but {} samplers", seqs.size(),
                 samplers.size());
  check_bans(bans, seqs.size());
  DeviceSampling ds;
  if (device_sampling(samplers, bans, out, &ds)) {
    decode_impl(seqs, tokens, nullptr, &ds);
    return;
  }
  const bool banning = bans_some_row(bans);
  const size_t V = size_t(n_vocab());
  // The engine's (or the model's) own memory: the banned rows are edited in place before their pick.
  float* logits = logits_memory(seqs.size(), seqs.size() <= size_t(opt_.n_batch));
  decode_impl(seqs, tokens, logits, nullptr);
  if (banning)
    cpu::ban_tokens(logits, int64_t(seqs.size()), int64_t(V), bans.ids.data(), int32_t(bans.ids.size()),
                    bans.rows.data());
  for (size_t i = 0; i < samplers.size(); ++i) out[i] = samplers[i]->sample(logits + i * V);
}

bool Engine::picks_on_device(std::span<Sampler* const> samplers, const SampleBans& bans, bool* same) const {
  const bool banning = bans_some_row(bans);
  // On the device when it can: every sampler without penalties, with the same parameters (one rule per
  // pass) or with mixed_device_sampling a rule per row, and no bans or (device_bans) no more banned ids than
  // the device takes.
  bool device = !samplers.empty() && model_->samples_on_device() &&
                (!banning || (opt_.device_bans && bans.ids.size() <= size_t(DeviceSampling::kMaxDeviceBans)));
  *same = true;
  for (Sampler* s : samplers) {
    if (!device) break;
    const SamplingParams &p = s->params(), &p0 = samplers[0]->params();
    device = device && s->penalties_off();
    *same = *same && p.temperature == p0.temperature && p.top_k == p0.top_k && p.top_p == p0.top_p &&
            p.min_p == p0.min_p;
  }
  return device && (*same || opt_.mixed_device_sampling);
}

bool Engine::device_sampling(std::span<Sampler* const> samplers, const SampleBans& bans, int32_t* out,
                             DeviceSampling* ds) {
  bool same = true;
  if (!picks_on_device(samplers, bans, &same)) return false;
  const bool banning = bans_some_row(bans);
  const SamplingParams& p = samplers[0]->params();
  draws_.resize(samplers.size());
  for (size_t i = 0; i < samplers.size(); ++i) draws_[i] = float(samplers[i]->next_draw());
  *ds = DeviceSampling{};
  ds->temperature = p.temperature;
  ds->top_k = std::max(p.top_k, 0);
  ds->top_p = p.top_p;
  ds->min_p = p.min_p;
  ds->u = draws_.data();
  ds->out = out;
  if (!same) {
    rules_.resize(samplers.size());
    for (size_t i = 0; i < samplers.size(); ++i) {
      const SamplingParams& q = samplers[i]->params();
      rules_[i] = {q.temperature, std::max(q.top_k, 0), q.top_p, q.min_p};
    }
    ds->rules = rules_.data();
  }
  if (banning) {
    ds->ban = bans.ids.data();
    ds->n_ban = int32_t(bans.ids.size());
    ds->ban_rows = bans.rows.data();
  }
  return true;
}

int Engine::generate(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                     std::span<Sampler* const> samplers, int max_steps, const StepFn& on_step,
                     const SampleBans& bans) {
  STRATA_REQUIRE(samplers.size() == seqs.size(), "generate: {} sequences but {} samplers", seqs.size(),
                 samplers.size());
  STRATA_REQUIRE(max_steps >= 0, "generate: max_steps {} must be >= 0", max_steps);
  STRATA_REQUIRE(bool(on_step), "generate: no step callback");
  STRATA_REQUIRE(tokens.size() == seqs.size(), "generate: {} sequences but {} tokens", seqs.size(), tokens.size());
  if (max_steps == 0 || std::any_of(seqs.begin(), seqs.end(), [](SequenceState* q) { return q->space_left() < 1; }))
    return 0;
  check_decode(seqs, tokens);
  check_bans(bans, seqs.size());
  bool same = true;
  if (opt_.chain_decode && max_steps > 1 && seqs.size() <= size_t(opt_.n_batch) &&
      picks_on_device(samplers, bans, &same) && model_->chains_decode(*ws_, int32_t(seqs.size())))
    return generate_chained(seqs, tokens, samplers, max_steps, on_step, bans);
  std::vector<int32_t> cur(tokens.begin(), tokens.end()), picks(seqs.size());
  for (int step = 0; step < max_steps; ++step) {
    for (SequenceState* s : seqs)
      if (s->space_left() < 1) return step;
    decode_sample(seqs, cur, samplers, picks.data(), bans);
    if (!on_step(step, picks)) return step + 1;
    cur = picks;
  }
  return max_steps;
}

int Engine::generate_chained(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::span<Sampler* const> samplers, int max_steps, const StepFn& on_step,
                             const SampleBans& bans) {
  const size_t n = seqs.size();
  std::vector<int32_t> picks[2] = {std::vector<int32_t>(n), std::vector<int32_t>(n)};  // step s's: picks[s & 1]
  std::vector<Rng> before(n);  // each sampler's generator before the draw of the step launched ahead
  int pending = 0;             // passes the model may hold (ForwardOptions::defer)
  bool unkept = false;         // a step launched ahead that on_step has not yet let go on
  // Launches step s (toks null: chained to step s - 1's picks): its draws now, its picks into picks[s & 1]
  // when the model completes it.
  const auto launch = [&](int s, const int32_t* toks) {
    DeviceSampling ds;
    const bool device = device_sampling(samplers, bans, picks[size_t(s & 1)].data(), &ds);
    STRATA_REQUIRE(device, "generate: the picks left the device");  // (generate checked picks_on_device)
    batch_.clear();
    for (size_t i = 0; i < n; ++i) batch_.push_back({toks ? toks[i] : 0, seqs[i]->n_past(), int32_t(i), true});
    ForwardOptions fo{opt_.mode, opt_.attn, opt_.usage, &ds};
    fo.chain = toks == nullptr;
    fo.defer = true;
    ++pending;  // (counted first: a forward that throws late may have left its pass pending)
    model_->forward({batch_, seqs}, *ws_, nullptr, pool_, fo);
    for (SequenceState* q : seqs) q->advance(1);
  };
  const auto drain = [&] {
    for (; pending > 0; --pending) model_->finish_deferred(*ws_);
  };
  const auto drop_ahead = [&] {  // after drain(): the sequences and generators as before the step ahead
    for (size_t i = 0; i < n; ++i) {
      seqs[i]->truncate(seqs[i]->n_past() - 1);
      samplers[i]->set_generator(before[i]);
    }
    unkept = false;
  };
  try {
    launch(0, tokens.data());
    for (int s = 0;; ++s) {
      const bool ahead = s + 1 < max_steps && std::all_of(seqs.begin(), seqs.end(), [](SequenceState* q) {
                           return q->space_left() >= 1;
                         });
      if (ahead) {
        for (size_t i = 0; i < n; ++i) before[i] = samplers[i]->generator();
        launch(s + 1, nullptr);
        unkept = true;
      }
      model_->finish_deferred(*ws_);  // step s: its picks in picks[s & 1]
      --pending;
      const bool go = on_step(s, picks[size_t(s & 1)]);
      if (!go || !ahead) {
        if (unkept) {
          drain();
          drop_ahead();
        }
        return s + 1;
      }
      unkept = false;
    }
  } catch (...) {
    // What is still pending completes before the caller sees the error (its buffers stay in use until
    // then; errors of those ends give way to the first), and a step launched ahead is dropped.
    try {
      drain();
      if (unkept) drop_ahead();
    } catch (...) {
    }
    throw;
  }
}

void Engine::check_bans(const SampleBans& bans, size_t n_seqs) const {
  STRATA_REQUIRE(bans.rows.empty() || bans.rows.size() == n_seqs, "decode: {} sequences but {} ban flags", n_seqs,
                 bans.rows.size());
  STRATA_REQUIRE(bans.ids.size() <= size_t(INT32_MAX), "decode: {} banned ids", bans.ids.size());
  for (int32_t t : bans.ids)
    STRATA_REQUIRE(t >= 0 && t < n_vocab(), "decode: banned token id {} is out of range (vocabulary {})", t,
                   n_vocab());
}

void Engine::check_decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens) const {
  STRATA_REQUIRE(!seqs.empty(), "decode: no sequences");
  STRATA_REQUIRE(seqs.size() == tokens.size(), "decode: {} sequences but {} tokens", seqs.size(),
                 tokens.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    check_token(tokens[i]);
    STRATA_REQUIRE(seqs[i]->space_left() >= 1, "context overflow: the sequence holds --ctx {} tokens",
                   seqs[i]->n_ctx());
    STRATA_REQUIRE(seqs[i]->kv_type() == seqs[0]->kv_type(),
                   "decode: sequences of one batch must share a KV type");
    for (size_t j = 0; j < i; ++j)
      STRATA_REQUIRE(seqs[j] != seqs[i], "decode: a sequence appears twice in one batch");
  }
}

void Engine::decode_impl(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens, float* logits,
                         const DeviceSampling* sampling) {
  check_decode(seqs, tokens);
  const size_t V = size_t(n_vocab());
  for (size_t b = 0; b < seqs.size(); b += size_t(opt_.n_batch)) {
    const size_t e = std::min(seqs.size(), b + size_t(opt_.n_batch));
    batch_.clear();
    for (size_t i = b; i < e; ++i)
      batch_.push_back({tokens[i], seqs[i]->n_past(), int32_t(i - b), true});
    DeviceSampling part;
    if (sampling) {  // this chunk's draws, picks, ban flags and rules
      part = *sampling;
      part.u = sampling->u + b;
      part.out = sampling->out + b;
      if (sampling->ban_rows) part.ban_rows = sampling->ban_rows + b;
      if (sampling->rules) part.rules = sampling->rules + b;
    }
    model_->forward({batch_, seqs.subspan(b, e - b)}, *ws_, logits ? logits + b * V : nullptr, pool_,
                    {opt_.mode, opt_.attn, opt_.usage, sampling ? &part : nullptr});
    for (size_t i = b; i < e; ++i) seqs[i]->advance(1);
  }
}

}  // namespace strata
