// `strata eval`: evaluate token ids from position 0 (no BOS added), write every position's logits as
// raw f32 [n_tokens][n_vocab], optionally continue greedily and print the ids.
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>

#include "cli/command.h"
#include "cli/engine_flags.h"

namespace strata::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '\n') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != ',' && s[j] != '\t' && s[j] != '\n') ++j;
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + j, v);
    STRATA_REQUIRE(ec == std::errc() && p == s.data() + j && v >= INT32_MIN && v <= INT32_MAX,
                   "--tokens: '{}' is not a token id", s.substr(i, j - i));
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

int run_eval(const EngineFlags& ef, const std::string& tokens_arg, const std::string& logits_path,
             int n_greedy) {
  const std::vector<int32_t> ids = parse_ids(tokens_arg);
  STRATA_REQUIRE(!ids.empty(), "empty prompt: --tokens holds no token ids");
  STRATA_REQUIRE(n_greedy >= 0, "--greedy must be >= 0, got {}", n_greedy);
  std::shared_ptr<const Model> model = load_model_for(ef);
  const int32_t need = static_cast<int32_t>(ids.size()) + n_greedy;
  Engine eng(model, ef.options(need));
  auto seq = eng.new_sequence();
  const size_t V = static_cast<size_t>(eng.n_vocab());
  std::vector<float> logits(ids.size() * V);
  eng.prefill(*seq, ids, logits.data(), /*all_logits=*/true);
  print_cache_report(*model, "prefill");
  model->reset_cache_stats();
  if (!logits_path.empty()) {
    std::FILE* f = std::fopen(logits_path.c_str(), "wb");
    STRATA_REQUIRE(f, "cannot open {} for writing: {}", logits_path, std::strerror(errno));
    const size_t w = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
    const bool ok = w == logits.size() && std::fclose(f) == 0;
    STRATA_REQUIRE(ok, "writing {} failed: {}", logits_path, std::strerror(errno));
  }
  if (n_greedy > 0) {
    SamplingParams gp;
    gp.temperature = 0;
    Sampler greedy(gp, eng.n_vocab());
    std::span<const float> last(logits.end() - static_cast<std::ptrdiff_t>(V), logits.end());
    SequenceState* s = seq.get();
    for (int i = 0; i < n_greedy; ++i) {
      const int32_t t = greedy.sample(last.data());
      std::printf(i ? " %d" : "%d", t);
      if (i + 1 < n_greedy) last = eng.decode_logits({&s, 1}, {&t, 1});
    }
    std::printf("\n");
    print_cache_report(*model, "decode");
  }
  return 0;
}

const CommandRegistrar reg(
    "eval", "Evaluate token ids and write the logits of every position (raw f32)",
    [](CLI::App& app) -> std::function<int()> {
      auto ef = std::make_shared<EngineFlags>();
      auto tokens = std::make_shared<std::string>();
      auto out = std::make_shared<std::string>();
      auto greedy = std::make_shared<int>(0);
      ef->add(app, 0);
      app.add_option("--tokens", *tokens, "token ids, evaluated from position 0 (no BOS added)")
          ->required();
      app.add_option("--logits", *out, "write the logits here: raw f32 [n_tokens][n_vocab]");
      app.add_option("--greedy", *greedy, "then continue greedily and print N token ids");
      return [=] { return run_eval(*ef, *tokens, *out, *greedy); };
    });

}  // namespace
}  // namespace strata::cli
