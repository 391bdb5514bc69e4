#pragma once
// The server's Backend over the real engine (src/engine/engine.h): a loaded model, its tokenizer,
// its chat template (from the GGUF, or a file given with --chat-template), and strata::Sampler.
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/backend.h"

namespace strata::server {

struct EngineBackendOptions {
  std::string model_id;            // what /v1/models lists
  std::string chat_template_path;  // empty: tokenizer.chat_template from the GGUF (if any)
  std::string device = "cpu";
};

class EngineBackend : public Backend {
 public:
  EngineBackend(std::shared_ptr<const Model> model, const EngineOptions& engine,
                const EngineBackendOptions& opt);
  ~EngineBackend() override;

  const BackendInfo& info() const override { return info_; }
  BackendStats stats() const override;
  std::vector<int32_t> tokenize(const std::string& text, bool templated) const override;
  std::string piece(int32_t token) const override;
  bool is_end_of_generation(int32_t token) const override;
  std::vector<int32_t> end_of_generation_tokens() const override;
  std::string render_chat(const std::vector<ChatMessage>& messages) const override;

  std::unique_ptr<BackendSequence> new_sequence() override;
  void truncate(BackendSequence& seq, int32_t n) override;
  float* prefill(BackendSequence& seq, const int32_t* tokens, int32_t n) override;
  void decode(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, float* logits) override;
  void decode_sample(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, TokenSampler* const* samplers,
                     const uint8_t* ban_eog, float* logits, int32_t* out) override;
  int generate(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, TokenSampler* const* samplers,
               const uint8_t* ban_eog, float* logits, int max_steps, const StepFn& on_step) override;
  std::unique_ptr<TokenSampler> new_sampler(const SamplingOptions& opts, uint64_t seed) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  BackendInfo info_;
};

}  // namespace strata::server
