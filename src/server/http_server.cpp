#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <random>

#include "common/error.h"
#include "server/api_response.h"

namespace strata::server {

using json = nlohmann::json;

int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {0};
    int pport = -1, sport = -1;
    if (peer.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      pport = ntohs(a->sin_port);
      sport = ntohs(reinterpret_cast<sockaddr_in*>(&self)->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      pport = ntohs(a->sin6_port);
      sport = ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
    } else {
      continue;
    }
    if (pport == remote_port && sport == local_port && remote_addr == host) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

int find_listening_fd(int port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    socklen_t ll = sizeof(listening);
    if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) != 0 || !listening) continue;
    sockaddr_storage self{};
    socklen_t sl = sizeof(self);
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    int sport = self.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&self)->sin_port)
              : self.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port)
                                           : -1;
    if (sport == port) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

namespace {

void send_error(httplib::Response& res, ApiKind kind, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_body(kind, e)), "application/json");
}

ApiError make_error(int status, std::string type, std::string msg, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(msg);
  e.code = std::move(code);
  return e;
}

Metrics::Outcome outcome_for(int status) {
  if (status == 429 || status == 503) return Metrics::kRejected;
  if (status >= 500) return Metrics::kServerError;
  return Metrics::kClientError;
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kAlnum[rng() % 62];
  return s;
}

// Streams one job's output as SSE. Called repeatedly by cpp-httplib from the connection's thread.
struct StreamState {
  std::shared_ptr<Job> job;
  ResponseWriter writer;
  bool began = false;
  bool ended = false;
};

// Takes the text released so far and where its pieces end (Job::text_cuts); the caller holds job.mu.
void take_released(Job& job, std::string& text, std::vector<size_t>& cuts) {
  text.swap(job.text);
  job.text.clear();
  cuts.swap(job.text_cuts);
  job.text_cuts.clear();
}

// Waits until the job has text or has finished (or `timeout` passes); takes the text (take_released).
bool wait_job(Job& job, std::string& text, std::vector<size_t>& cuts, bool& done, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(job.mu);
  bool ready = job.cv.wait_for(lk, timeout, [&] { return !job.text.empty() || job.done; });
  take_released(job, text, cuts);
  done = job.done;
  return ready;
}

// One SSE delta per released piece (a token's text), so a client sees the reply token by token even when
// it reads after several were released. Text after the last cut (none expected) goes as one more piece.
std::string stream_pieces(ResponseWriter& w, const std::string& text, const std::vector<size_t>& cuts) {
  std::string out;
  size_t from = 0;
  for (size_t end : cuts) {
    if (end <= from || end > text.size()) continue;
    out += w.stream_delta(text.substr(from, end - from));
    from = end;
  }
  if (from < text.size()) out += w.stream_delta(text.substr(from));
  return out;
}

void wait_done(Job& job) {
  std::unique_lock<std::mutex> lk(job.mu);
  job.cv.wait(lk, [&] { return job.done; });
}

}  // namespace

HttpServer::HttpServer(Backend& backend, Scheduler& scheduler, Metrics& metrics, HttpConfig cfg)
    : backend_(backend), scheduler_(scheduler), metrics_(metrics), cfg_(std::move(cfg)),
      svr_(std::make_unique<httplib::Server>()),
      created_unix_(std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count()) {
  int threads = cfg_.threads > 0 ? cfg_.threads
                                 : scheduler_.config().parallel + scheduler_.config().max_queue + 8;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr_->set_payload_max_length(cfg_.max_body_bytes);
  svr_->set_keep_alive_timeout(5);
  // Generation can take long between two writes of a non-streaming reply; reads of a request are short.
  svr_->set_read_timeout(30);
  svr_->set_write_timeout(30);
  setup_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  if (cfg_.port == 0) {
    int p = svr_->bind_to_any_port(cfg_.host);
    STRATA_REQUIRE(p > 0, "cannot bind to {} (any port)", cfg_.host);
    cfg_.port = p;
  } else {
    STRATA_REQUIRE(svr_->bind_to_port(cfg_.host, cfg_.port), "cannot bind to {}:{} (in use, or not "
                   "an address of this machine?)", cfg_.host, cfg_.port);
  }
  listen_fd_ = find_listening_fd(cfg_.port);
  return cfg_.port;
}

void HttpServer::run() { svr_->listen_after_bind(); }

void HttpServer::stop() { svr_->stop(); }

void HttpServer::stop_accepting() {
  // Shutting the listening socket down makes httplib's accept loop end (it then closes the socket
  // and waits for its workers). Unlike Server::stop(), this leaves running chunked (SSE) responses
  // alone: httplib ends those as soon as stop() marks the server as shutting down.
  int fd = listen_fd_.exchange(-1);
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

bool HttpServer::authorized(const std::string& auth, const std::string& xkey) const {
  if (cfg_.api_key.empty()) return true;
  auto same = [&](const std::string& a) {
    // Constant time in the key length: no early exit on the first differing byte.
    if (a.size() != cfg_.api_key.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ cfg_.api_key[i]);
    return diff == 0;
  };
  static const std::string kBearer = "Bearer ";
  if (auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0 &&
      same(auth.substr(kBearer.size())))
    return true;
  return !xkey.empty() && same(xkey);
}

void HttpServer::setup_routes() {
  auto& s = *svr_;

  // Every /v1/* route, /metrics and /stats need the key when one is set; "/" and /health do not.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    bool open = req.path == "/" || req.path == "/health" || req.path == "/favicon.ico";
    if (open || authorized(req.get_header_value("Authorization"), req.get_header_value("x-api-key")))
      return httplib::Server::HandlerResponse::Unhandled;
    metrics_.http_unauthorized++;
    ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
    bool sent = req.has_header("Authorization") || req.has_header("x-api-key");
    send_error(res, kind,
               make_error(401, "invalid_request_error",
                          sent ? "Incorrect API key provided. Send the server's key as "
                                 "'Authorization: Bearer KEY' or 'x-api-key: KEY'."
                               : "You didn't provide an API key. Send it as 'Authorization: Bearer "
                                 "KEY' or 'x-api-key: KEY'.",
                          "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error body
    ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
    std::string msg;
    if (res.status == 404)
      msg = fmt::format("Unknown path: {} {}", req.method, req.path);
    else if (res.status == 413)
      msg = "The request body is too large.";
    else
      msg = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
    send_error(res, kind, make_error(res.status, res.status == 404 ? "not_found_error"
                                                                  : "invalid_request_error", msg));
  });

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(dump_json(error_body(ApiKind::ChatCompletions,
                                         make_error(500, "server_error", msg))),
                    "application/json");
  });

  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(web_page_html(), "text/html; charset=utf-8");
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    SchedulerSnapshot snap = scheduler_.snapshot();
    std::string status = "ok";
    if (!snap.loop_alive) status = "error";
    else if (snap.heartbeat_age_s > cfg_.health_stall_s) status = "stalled";
    else if (snap.draining) status = "draining";
    json j = {{"status", status},
              {"scheduler_heartbeat_age_s", snap.heartbeat_age_s},
              {"running", snap.running},
              {"queue_depth", snap.queue_depth}};
    res.status = status == "ok" ? 200 : 503;
    res.set_content(dump_json(j), "application/json");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render_prometheus(backend_.info(), backend_.stats(), scheduler_.snapshot()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  s.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(metrics_.stats_json(backend_.info(), backend_.stats(),
                                                  scheduler_.snapshot())),
                    "application/json");
  });

  auto model_obj = [this] {
    return json{{"id", backend_.info().model_id}, {"object", "model"}, {"created", created_unix_},
                {"owned_by", "strata"}};
  };
  s.Get("/v1/models", [model_obj](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json({{"object", "list"}, {"data", json::array({model_obj()})}}),
                    "application/json");
  });
  s.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != backend_.info().model_id) {
      send_error(res, ApiKind::ChatCompletions,
                 make_error(404, "invalid_request_error",
                            fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                        std::string(req.matches[1]), backend_.info().model_id),
                            "model_not_found"));
      return;
    }
    res.set_content(dump_json(model_obj()), "application/json");
  });

  auto gen = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      handle_generation(kind, req, res);
    };
  };
  s.Post("/v1/chat/completions", gen(ApiKind::ChatCompletions));
  s.Post("/v1/completions", gen(ApiKind::Completions));
  s.Post("/v1/messages", gen(ApiKind::AnthropicMessages));
}

void HttpServer::handle_generation(ApiKind kind, const httplib::Request& req,
                                   httplib::Response& res) {
  const BackendInfo& info = backend_.info();
  auto job = std::make_shared<Job>();
  GenerationRequest gr;
  try {
    gr = parse_generation_request(kind, req.body, cfg_.sampling_defaults);
    std::string text = gr.is_chat ? backend_.render_chat(gr.messages) : gr.prompt;
    job->prompt = backend_.tokenize(text, gr.is_chat);
    if (job->prompt.empty())
      throw make_error(400, "invalid_request_error", "The prompt is empty after tokenization.");
    int64_t n_prompt = int64_t(job->prompt.size());
    if (n_prompt >= info.n_ctx || (gr.max_tokens && n_prompt + *gr.max_tokens > info.n_ctx)) {
      ApiError e = make_error(
          400, "invalid_request_error",
          gr.max_tokens
              ? fmt::format("This model's maximum context length is {} tokens. However, you requested "
                            "{} tokens ({} in the messages, {} in the completion). Please reduce the "
                            "length of the messages or completion.",
                            info.n_ctx, n_prompt + *gr.max_tokens, n_prompt, *gr.max_tokens)
              : fmt::format("This model's maximum context length is {} tokens. However, your "
                            "messages resulted in {} tokens. Please reduce the length of the messages.",
                            info.n_ctx, n_prompt),
          "context_length_exceeded");
      e.param = "messages";
      throw e;
    }
    job->kind = kind;
    job->sampling = gr.sampling;
    job->seed = gr.sampling.seed ? *gr.sampling.seed : std::random_device{}() * 0x100000001ull;
    job->max_tokens = gr.max_tokens ? *gr.max_tokens : int32_t(info.n_ctx - n_prompt);
    job->stop = gr.stop;
    job->ignore_eos = gr.ignore_eos;
    job->watch_fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
    scheduler_.submit(job);
  } catch (const ApiError& e) {
    metrics_.count_request(kind, outcome_for(e.status));
    send_error(res, kind, e);
    return;
  } catch (const Error& e) {  // tokenizer / template errors on user input
    metrics_.count_request(kind, Metrics::kClientError);
    send_error(res, kind, make_error(400, "invalid_request_error", e.what()));
    return;
  }

  const char* id_prefix = kind == ApiKind::ChatCompletions ? "chatcmpl-"
                          : kind == ApiKind::Completions   ? "cmpl-"
                                                           : "msg_";
  int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
  std::string model = gr.model.empty() ? info.model_id : gr.model;

  if (!gr.stream) {
    wait_done(*job);
    std::lock_guard<std::mutex> lk(job->mu);
    if (!job->error.empty()) {
      metrics_.count_request(kind, Metrics::kServerError);
      send_error(res, kind, make_error(500, "server_error", "generation failed: " + job->error));
      return;
    }
    if (job->finish == FinishReason::Cancelled) {
      metrics_.count_request(kind, Metrics::kCancelled);
      send_error(res, kind, make_error(503, "server_error",
                                       "The request was cancelled (client gone or server shutting "
                                       "down) before it finished."));
      return;
    }
    metrics_.count_request(kind, Metrics::kOk);
    ResponseWriter w(gr, model, created, random_id(id_prefix));
    res.set_content(dump_json(w.full(job->text, job->finish, job->matched_stop, job->usage)),
                    "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>(
      StreamState{job, ResponseWriter(gr, model, created, random_id(id_prefix))});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  Metrics* metrics = &metrics_;
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, kind, metrics](size_t, httplib::DataSink& sink) -> bool {
        Job& job = *st->job;
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          if (sink.write(s.data(), s.size())) return true;
          // The client is gone: cancel, and keep the socket until the scheduler has let go.
          job.client_gone = true;
          job.cancel = true;
          wait_done(job);
          metrics->count_request(kind, Metrics::kCancelled);
          return false;
        };
        if (!st->began) {
          // Wait for admission and prefill so the first event carries the right usage.
          std::unique_lock<std::mutex> lk(job.mu);
          job.cv.wait(lk, [&] { return job.started || job.done; });
          Usage u = job.usage;
          lk.unlock();
          st->began = true;
          if (!write(st->writer.stream_begin(u))) return false;
        }
        std::string text;
        std::vector<size_t> cuts;
        bool done = false;
        wait_job(job, text, cuts, done, std::chrono::milliseconds(200));
        if (!write(stream_pieces(st->writer, text, cuts))) return false;
        if (!done) return true;
        std::string tail;
        {
          std::lock_guard<std::mutex> lk(job.mu);
          take_released(job, tail, cuts);
        }
        if (!write(stream_pieces(st->writer, tail, cuts))) return false;
        std::string end;
        if (!job.error.empty()) {
          end = st->writer.stream_error(make_error(500, "server_error", "generation failed: " + job.error));
          metrics->count_request(kind, Metrics::kServerError);
        } else if (job.finish == FinishReason::Cancelled) {
          end = st->writer.stream_error(make_error(503, "server_error",
                                                   "The request was cancelled before it finished "
                                                   "(server shutting down)."));
          metrics->count_request(kind, Metrics::kCancelled);
        } else {
          end = st->writer.stream_end(job.finish, job.matched_stop, job.usage);
          metrics->count_request(kind, Metrics::kOk);
        }
        if (!sink.write(end.data(), end.size())) return false;
        st->ended = true;
        sink.done();
        return true;
      },
      [st](bool) {
        // Response destroyed (sent, or the connection failed before the provider finished):
        // make sure the scheduler lets go of the job before the socket can be reused.
        if (!st->ended) {
          st->job->cancel = true;
          wait_done(*st->job);
        }
      });
}

}  // namespace strata::server
