// `strata run`: generate text from a prompt. The text streams to stdout as it is generated; timing
// (prompt and decode tok/s) goes to stderr at the end.
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct RunArgs {
  std::string prompt;
  std::string system;
  int n_predict = 128;
  bool chat = false;
  bool no_eos_stop = false;
  std::vector<std::string> stops;
  bool quiet_timing = false;
};

int run_run(const EngineFlags& ef, const SamplingFlags& sf, const RunArgs& a) {
  STRATA_REQUIRE(!a.prompt.empty(), "empty prompt: give -p TEXT");
  STRATA_REQUIRE(a.n_predict >= 0, "-n must be >= 0, got {}", a.n_predict);
  const SamplingParams sp = sf.params();
  auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const Model> model = load_model_for(ef);
  const auto tok = tokenizer::Tokenizer::from_gguf(model->file());

  std::vector<int32_t> ids;
  if (a.chat) {
    const ChatTemplate tmpl = ChatTemplate::from_gguf(model->file());
    ChatRequest req;
    if (!a.system.empty()) req.messages.push_back({{"role", "system"}, {"content", a.system}});
    req.messages.push_back({{"role", "user"}, {"content", a.prompt}});
    const std::string text = tmpl.render(req);
    // The rendered template carries its own special tokens (BOS included where the template wants it).
    ids = tok.tokenize(text, {.add_special = false, .parse_special = true});
  } else {
    ids = tok.tokenize(a.prompt, {.add_special = true, .parse_special = false});
  }
  STRATA_REQUIRE(!ids.empty(), "empty prompt: the prompt gives no tokens");

  const int32_t ctx_default = std::min<int32_t>(model->hparams().n_ctx_train, 4096);
  Engine eng(model, ef.options(std::max<int32_t>(ctx_default, 1)));
  STRATA_REQUIRE(ids.size() + size_t(a.n_predict) <= size_t(eng.options().n_ctx),
                 "context overflow: the prompt has {} tokens and -n asks for {} more, --ctx is {}",
                 ids.size(), a.n_predict, eng.options().n_ctx);
  auto seq = eng.new_sequence();
  Sampler sampler(sp, eng.n_vocab());
  for (int32_t t : ids) sampler.accept(t);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  auto tp = std::chrono::steady_clock::now();
  const std::span<const float> logits = eng.prefill_logits(*seq, ids);  // valid until the first decode
  if (!a.quiet_timing) print_cache_report(*model, "prompt");
  model->reset_cache_stats();  // the decode numbers below are this request's decode alone
  const double prompt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();

  tokenizer::StreamDecoder dec(tok, /*render_special=*/false);
  StopMatcher stop(a.stops);
  int n_gen = 0;
  const char* why = "length";
  auto td = std::chrono::steady_clock::now();
  SequenceState* sp_seq = seq.get();
  Sampler* sp_sampler = &sampler;
  // Each generated token: into the penalty history, then the end checks, then out. False: stop here.
  const auto take = [&](int32_t t) {
    sampler.accept(t);
    ++n_gen;
    if (!a.no_eos_stop && tok.is_eog(t)) {
      why = "end of generation token";
      return false;
    }
    const std::string text = stop.feed(dec.push(t));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (stop.stopped()) {
      why = "stop string";
      return false;
    }
    return true;
  };
  // The first pick from the prompt's logits; the later ones from Engine::generate (on the GPU, each decode
  // step picks there and the next step starts from that pick without waiting for this loop).
  const int32_t first = sampler.sample(logits.data());
  if (a.n_predict > 0 && take(first) && a.n_predict > 1)
    eng.generate({&sp_seq, 1}, {&first, 1}, {&sp_sampler, 1}, a.n_predict - 1,
                 [&](int, std::span<const int32_t> picks) { return take(picks[0]); });
  if (!stop.stopped()) {
    const std::string rest = stop.feed(dec.flush());
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    const std::string held = stop.finish();
    std::fwrite(held.data(), 1, held.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - td).count();
  if (!a.quiet_timing) {
    std::fprintf(stderr,
                 "strata: load %.2f s | prompt %zu tokens in %.3f s (%.2f tok/s) | generated %d "
                 "tokens in %.3f s (%.2f tok/s) | stop: %s | %d threads, %s mode\n",
                 load_s, ids.size(), prompt_s, ids.size() / std::max(prompt_s, 1e-9), n_gen,
                 decode_s, n_gen > 1 ? (n_gen - 1) / std::max(decode_s, 1e-9) : 0.0, why,
                 eng.options().n_threads, ef.exact ? "exact" : "fast");
    print_cache_report(*model, "decode");
  }
  return 0;
}

const CommandRegistrar reg(
    "run", "Generate text from a prompt (streams to stdout, timing on stderr)",
    [](CLI::App& app) -> std::function<int()> {
      auto ef = std::make_shared<EngineFlags>();
      auto sf = std::make_shared<SamplingFlags>();
      auto a = std::make_shared<RunArgs>();
      ef->add(app, 4096);
      app.add_option("-p,--prompt", a->prompt, "prompt text")->required();
      app.add_option("-n,--n-predict", a->n_predict, "tokens to generate at most")->capture_default_str();
      app.add_flag("--chat", a->chat, "wrap the prompt in the model's chat template (a user turn)");
      app.add_option("--system", a->system, "system message (with --chat)");
      app.add_option("--stop", a->stops, "stop when this text appears (repeatable)");
      app.add_flag("--ignore-eos", a->no_eos_stop, "do not stop at end-of-generation tokens");
      app.add_flag("--no-timing", a->quiet_timing, "do not print timing on stderr");
      sf->add(app);
      return [=] { return run_run(*ef, *sf, *a); };
    });

}  // namespace
}  // namespace strata::cli
