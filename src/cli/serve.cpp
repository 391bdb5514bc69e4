// `strata serve`: the OpenAI- and Anthropic-compatible HTTP server (src/server/).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "server/engine_backend.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace strata::cli {
namespace {

struct ServeArgs {
  std::string alias;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int parallel = 4;
  int max_queue = 64;
  double park_mb = 1024;
  std::string chat_template;
  double shutdown_timeout_s = 10;
  int http_threads = 0;
  server::SamplingOptions sampling;  // the defaults of every request (the API's unless set)
};

int run_serve(const EngineFlags& ef, ServeArgs a) {
  STRATA_REQUIRE(a.port >= 0 && a.port <= 65535, "--port must be 0..65535 (got {})", a.port);
  STRATA_REQUIRE(a.parallel >= 1 && a.parallel <= 256, "--parallel must be 1..256 (got {})", a.parallel);
  STRATA_REQUIRE(a.max_queue >= 0, "--max-queue must be >= 0 (got {})", a.max_queue);
  STRATA_REQUIRE(a.park_mb >= 0, "--park-mb must be >= 0 (got {})", a.park_mb);
  STRATA_REQUIRE(a.shutdown_timeout_s >= 0, "--shutdown-timeout must be >= 0 (got {})",
                 a.shutdown_timeout_s);
  STRATA_REQUIRE(ef.n_batch >= 1, "--batch must be >= 1 (got {})", ef.n_batch);
  server::check_sampling_defaults(a.sampling);
  if (a.api_key.empty())
    if (const char* k = std::getenv("STRATA_API_KEY")) a.api_key = k;

  // SIGINT/SIGTERM go to one thread that runs the shutdown; block them before any thread exists
  // (the engine's pool, the scheduler, HTTP workers all inherit the mask).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);  // internal: the HTTP server stopped on its own
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  EngineFlags ef_load = ef;
  ef_load.kv_sequences = a.parallel;  // --expert-cache auto leaves room for every slot's KV
  std::shared_ptr<const Model> model = load_model_for(ef_load);
  EngineOptions eo = ef.options(std::max<int32_t>(std::min<int32_t>(model->hparams().n_ctx_train, 4096), 16));
  STRATA_REQUIRE(eo.n_ctx >= 16, "--ctx must be at least 16 (got {})", eo.n_ctx);
  eo.n_batch = std::max<int32_t>(ef.n_batch, a.parallel);  // one decode step holds every sequence
  server::EngineBackendOptions bo;
  bo.model_id = a.alias.empty() ? std::filesystem::path(ef.model).stem().string() : a.alias;
  bo.chat_template_path = a.chat_template;
  server::EngineBackend backend(model, eo, bo);

  server::Metrics metrics;
  server::SchedulerConfig sc;
  sc.parallel = a.parallel;
  sc.max_queue = a.max_queue;
  sc.park_budget_bytes = uint64_t(a.park_mb * 1024.0 * 1024.0);
  sc.prefill_chunk = ef.n_batch;
  server::Scheduler scheduler(backend, sc, metrics);

  server::HttpConfig hc;
  hc.host = a.host;
  hc.port = a.port;
  hc.api_key = a.api_key;
  hc.threads = a.http_threads;
  hc.sampling_defaults = a.sampling;
  server::HttpServer http(backend, scheduler, metrics, hc);
  int port = http.bind();
  scheduler.start();

  auto grace = std::chrono::milliseconds(int64_t(a.shutdown_timeout_s * 1000));
  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != SIGUSR1)
      std::fprintf(stderr, "strata serve: %s received: no new requests; finishing in-flight ones "
                   "(up to %g s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", a.shutdown_timeout_s);
    http.stop_accepting();            // new connections are refused; running streams go on
    scheduler.drain_and_stop(grace);  // finishes (or, past the grace, cancels) every request
  });

  std::fprintf(stderr, "strata serve: model %s (ctx %d, parallel %d) listening on http://%s:%d\n",
               backend.info().model_id.c_str(), eo.n_ctx, a.parallel, a.host.c_str(), port);
  std::fflush(stderr);
  http.run();  // returns once the listener is closed and every handler has finished
  pthread_kill(sig_thread.native_handle(), SIGUSR1);  // wakes it if run() ended on its own
  sig_thread.join();
  std::fprintf(stderr, "strata serve: stopped\n");
  return 0;
}

CommandRegistrar reg("serve", "OpenAI/Anthropic-compatible HTTP server with streaming and batching",
                     [](CLI::App& sub) -> std::function<int()> {
  auto ef = std::make_shared<EngineFlags>();
  auto a = std::make_shared<ServeArgs>();
  ef->add(sub);
  sub.add_option("--alias", a->alias, "model id shown by /v1/models (default: the file name)");
  sub.add_option("--host", a->host, "address to listen on")->capture_default_str();
  sub.add_option("--port", a->port, "port (0: any free port, printed at start)")->capture_default_str();
  sub.add_option("--api-key", a->api_key, "require this key (Bearer or x-api-key); env STRATA_API_KEY");
  sub.add_option("--parallel", a->parallel, "sequences generating at once (continuous batching)")
      ->capture_default_str();
  sub.add_option("--max-queue", a->max_queue, "requests that may wait for a sequence; beyond: HTTP 429")
      ->capture_default_str();
  sub.add_option("--park-mb", a->park_mb, "memory for idle conversations' KV kept for reuse (LRU), MiB")
      ->capture_default_str();
  sub.add_option("--chat-template", a->chat_template, "Jinja chat template file (default: the GGUF's)");
  sub.add_option("--shutdown-timeout", a->shutdown_timeout_s,
                 "seconds in-flight requests may take to finish on SIGTERM/SIGINT")->capture_default_str();
  sub.add_option("--http-threads", a->http_threads, "HTTP worker threads (0: parallel + max-queue + 8)");
  // A request's sampling fields it does not name. The defaults are the API's (a draw over the whole
  // vocabulary at temperature 1); llama.cpp's server uses --top-k 40 --top-p 0.95 --min-p 0.05.
  auto& sd = a->sampling;
  sub.add_option("--temp", sd.temperature, "default temperature of a request (0: greedy)")->capture_default_str();
  sub.add_option("--top-k", sd.top_k, "default top_k of a request (0: off)")->capture_default_str();
  sub.add_option("--top-p", sd.top_p, "default top_p of a request (1: off)")->capture_default_str();
  sub.add_option("--min-p", sd.min_p, "default min_p of a request (0: off)")->capture_default_str();
  sub.add_option("--repeat-penalty", sd.repeat_penalty, "default repeat_penalty of a request (1: off)")
      ->capture_default_str();
  sub.add_option("--presence-penalty", sd.presence_penalty, "default presence_penalty of a request")
      ->capture_default_str();
  sub.add_option("--frequency-penalty", sd.frequency_penalty, "default frequency_penalty of a request")
      ->capture_default_str();
  return [ef, a] { return run_serve(*ef, *a); };
});

}  // namespace
}  // namespace strata::cli
