#include "server/engine_backend.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "engine/sampling.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {

class EngineSequence : public BackendSequence {
 public:
  explicit EngineSequence(std::unique_ptr<SequenceState> s) : state(std::move(s)) {}
  int32_t n_past() const override { return state->n_past(); }
  size_t memory_bytes() const override { return state->memory_bytes(); }
  std::unique_ptr<SequenceState> state;
};

class EngineSampler : public TokenSampler {
 public:
  EngineSampler(const SamplingParams& p, int32_t n_vocab) : s_(p, n_vocab) {}
  int32_t sample(const float* logits) override { return s_.sample(logits); }
  void accept(int32_t token) override { s_.accept(token); }
  Sampler& sampler() { return s_; }

 private:
  Sampler s_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_REQUIRE(f.good(), "cannot read the chat template file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

struct EngineBackend::Impl {
  std::shared_ptr<const Model> model;
  tokenizer::Tokenizer tok;
  std::unique_ptr<Engine> engine;
  std::optional<ChatTemplate> chat_template;
  std::vector<float> logits;  // [n_vocab] for prefill
  std::vector<int32_t> eog;   // the end-of-generation ids inside the model's vocabulary (ignore_eos bans)
};

EngineBackend::EngineBackend(std::shared_ptr<const Model> model, const EngineOptions& eo,
                             const EngineBackendOptions& opt)
    : impl_(new Impl{model, tokenizer::Tokenizer::from_gguf(model->file()), nullptr, std::nullopt, {}, {}}) {
  impl_->engine = std::make_unique<Engine>(model, eo);
  impl_->logits.resize(size_t(model->n_vocab()));
  for (int32_t t : impl_->tok.eog_ids())
    if (t >= 0 && t < model->n_vocab()) impl_->eog.push_back(t);
  const auto& tok = impl_->tok;
  if (!opt.chat_template_path.empty()) {
    std::string bos = tok.bos() != tokenizer::kNoToken ? tok.token_text(tok.bos()) : "";
    std::string eos = tok.eos() != tokenizer::kNoToken ? tok.token_text(tok.eos()) : "";
    impl_->chat_template.emplace(read_file(opt.chat_template_path), bos, eos);
  } else if (model->file().has("tokenizer.chat_template")) {
    impl_->chat_template.emplace(ChatTemplate::from_gguf(model->file()));
  }
  // A model with recurrent layers cannot rewind its state: prefix reuse needs the whole history.
  bool recurrent = false;
  auto probe = model->new_sequence(1, eo.kv_type);
  for (auto& r : probe->recurrent()) recurrent |= r.present();

  info_.model_id = opt.model_id;
  info_.n_ctx = eo.n_ctx;
  info_.n_vocab = model->n_vocab();
  info_.can_truncate = !recurrent;
  info_.device = opt.device == "cpu" ? model->backend_name() : opt.device;
}

EngineBackend::~EngineBackend() = default;

BackendStats EngineBackend::stats() const {
  BackendStats s;
  s.weights_bytes = impl_->model->weight_bytes();
  // A GPU model's expert cache (the CPU model has none: its figures stay 0). Counted since the model
  // was loaded (nothing here resets them), so hits/lookups are the server's totals.
  const ExpertCacheReport r = impl_->model->cache_report();
  if (r.present) {
    s.expert_cache_bytes = uint64_t(r.n_slots) * r.slot_bytes;
    s.expert_cache_used = uint64_t(r.slots_used) * r.slot_bytes;
    s.expert_cache_hits = uint64_t(r.hits);
    s.expert_cache_lookups = uint64_t(r.hits + r.misses);
    s.expert_cache_direct = uint64_t(r.direct);
  }
  return s;
}

std::vector<int32_t> EngineBackend::tokenize(const std::string& text, bool templated) const {
  // A rendered chat template carries its own special tokens (BOS where the template wants it).
  // A raw prompt gets BOS when the model asks for it; special tokens written in it are parsed
  // (as llama.cpp's server does), so a client may send an already templated prompt.
  return impl_->tok.tokenize(text, {.add_special = !templated, .parse_special = true});
}

std::string EngineBackend::piece(int32_t token) const {
  return std::string(impl_->tok.token_bytes(token, /*render_special=*/false));
}

bool EngineBackend::is_end_of_generation(int32_t token) const { return impl_->tok.is_eog(token); }

std::vector<int32_t> EngineBackend::end_of_generation_tokens() const { return impl_->tok.eog_ids(); }

std::string EngineBackend::render_chat(const std::vector<ChatMessage>& messages) const {
  if (!impl_->chat_template) {
    ApiError e;
    e.message = "This model has no chat template (tokenizer.chat_template); start the server with "
                "--chat-template FILE, or use /v1/completions.";
    throw e;
  }
  ChatRequest req;
  for (const auto& m : messages) req.messages.push_back({{"role", m.role}, {"content", m.content}});
  try {
    return impl_->chat_template->render(req);
  } catch (const jinja::TemplateError& err) {
    // Templates reject some conversations (e.g. roles out of order) with raise_exception.
    ApiError e;
    e.message = std::string("The chat template rejected these messages: ") + err.what();
    e.param = "messages";
    throw e;
  }
}

std::unique_ptr<BackendSequence> EngineBackend::new_sequence() {
  return std::make_unique<EngineSequence>(impl_->engine->new_sequence());
}

void EngineBackend::truncate(BackendSequence& seq, int32_t n) {
  static_cast<EngineSequence&>(seq).state->truncate(n);
}

float* EngineBackend::prefill(BackendSequence& seq, const int32_t* tokens, int32_t n) {
  impl_->engine->prefill(*static_cast<EngineSequence&>(seq).state,
                         std::span<const int32_t>(tokens, size_t(n)), impl_->logits.data());
  return impl_->logits.data();
}

void EngineBackend::decode(BackendSequence* const* seqs, const int32_t* tokens, int32_t n,
                           float* logits) {
  std::vector<SequenceState*> states(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) states[size_t(i)] = static_cast<EngineSequence*>(seqs[i])->state.get();
  impl_->engine->decode(states, std::span<const int32_t>(tokens, size_t(n)), logits);
}

namespace {

// The engine's view of a step's arguments (decode_sample's and generate's): the sequences' states, the
// samplers (false, and nothing else filled, when one is not an EngineSampler: the caller then takes
// Backend's host path) and the ignore_eos bans (eog: the model's end-of-generation ids).
struct EngineStepArgs {
  std::vector<SequenceState*> states;
  std::vector<Sampler*> samplers;
  SampleBans bans;
  bool take(BackendSequence* const* seqs, int32_t n, TokenSampler* const* ss, const uint8_t* ban_eog,
            std::span<const int32_t> eog) {
    for (int32_t i = 0; i < n; ++i) {
      auto* es = dynamic_cast<EngineSampler*>(ss[i]);
      if (!es) return false;
      samplers.push_back(&es->sampler());
      states.push_back(static_cast<EngineSequence*>(seqs[i])->state.get());
    }
    if (ban_eog) bans = {eog, std::span<const uint8_t>(ban_eog, size_t(n))};
    return true;
  }
};

}  // namespace

void EngineBackend::decode_sample(BackendSequence* const* seqs, const int32_t* tokens, int32_t n,
                                  TokenSampler* const* samplers, const uint8_t* ban_eog, float* logits, int32_t* out) {
  EngineStepArgs a;
  if (!a.take(seqs, n, samplers, ban_eog, impl_->eog))  // not ours: on the host
    return Backend::decode_sample(seqs, tokens, n, samplers, ban_eog, logits, out);
  impl_->engine->decode_sample(a.states, std::span<const int32_t>(tokens, size_t(n)), a.samplers, out, a.bans);
}

int EngineBackend::generate(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, TokenSampler* const* samplers,
                            const uint8_t* ban_eog, float* logits, int max_steps, const StepFn& on_step) {
  EngineStepArgs a;
  if (!a.take(seqs, n, samplers, ban_eog, impl_->eog))
    return Backend::generate(seqs, tokens, n, samplers, ban_eog, logits, max_steps, on_step);
  return impl_->engine->generate(a.states, std::span<const int32_t>(tokens, size_t(n)), a.samplers, max_steps,
                                 [&](int step, std::span<const int32_t> picks) { return on_step(step, picks.data()); },
                                 a.bans);
}

std::unique_ptr<TokenSampler> EngineBackend::new_sampler(const SamplingOptions& o, uint64_t seed) {
  SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;  // 0: off
  p.top_p = o.top_p;  // 1: off
  p.min_p = o.min_p;  // 0: off
  p.repeat_penalty = o.repeat_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = seed;
  p.validate();
  return std::make_unique<EngineSampler>(p, info_.n_vocab);
}

}  // namespace strata::server
