#pragma once
// The HTTP front end (cpp-httplib): routes, API-key check, request validation, SSE streaming, and the
// hand-off of generation jobs to the Scheduler. Shutdown: stop() closes the listening socket; run()
// returns once every in-flight handler has finished (the scheduler drains or cancels them).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/backend.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace strata::server {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (bind() returns it)
  std::string api_key;                // empty: no key required
  int threads = 0;                    // HTTP worker threads (0: parallel + max_queue + 8)
  size_t max_body_bytes = 8u << 20;
  double health_stall_s = 60.0;       // /health fails when the scheduler loop is stuck this long
  SamplingOptions sampling_defaults;  // what a request's sampling starts from (strata serve --temp, --top-k, ...)
};

class HttpServer {
 public:
  HttpServer(Backend& backend, Scheduler& scheduler, Metrics& metrics, HttpConfig cfg);
  ~HttpServer();

  int bind();   // binds host:port, returns the port; throws strata::Error when it cannot
  void run();   // serves until stop(); returns after in-flight handlers have finished
  void stop();  // stop now: in-flight SSE streams are cut (callable from any thread)
  // Graceful: refuse new connections; in-flight responses (streams too) go on until their jobs end.
  void stop_accepting();

 private:
  void setup_routes();
  bool authorized(const std::string& auth_header, const std::string& x_api_key) const;
  void handle_generation(ApiKind kind, const httplib::Request& req, httplib::Response& res);

  Backend& backend_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  HttpConfig cfg_;
  std::unique_ptr<httplib::Server> svr_;
  int64_t created_unix_;
  std::atomic<int> listen_fd_{-1};
};

// The socket of the connection whose ends are local_port / remote_addr:remote_port, found among this
// process's descriptors (cpp-httplib 0.11 does not expose it); -1 when not found. Used only to watch
// for the client closing the connection.
int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port);
// The listening socket bound to `port`, -1 when not found.
int find_listening_fd(int port);

// The HTML page served at "/" (chat + live monitor), embedded in the binary.
const std::string& web_page_html();

}  // namespace strata::server
