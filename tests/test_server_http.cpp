// The HTTP front end in process, over the toy backend (fast, no model): routes, API key, each 4xx,
// 429 over HTTP, SSE framing, client disconnect -> cancel + KV freed, /health tracking the scheduler.
// The real binary with the real model is tested by tests/server/*.sh.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "server_fake_backend.h"

using namespace strata::server;
using strata::server::testing::FakeBackend;
using json = nlohmann::json;

namespace {

class HttpFixture : public ::testing::Test {
 protected:
  void start(int parallel = 2, int max_queue = 4, std::string key = "") {
    SchedulerConfig sc;
    sc.parallel = parallel;
    sc.max_queue = max_queue;
    sc.park_budget_bytes = 10000;
    sched = std::make_unique<Scheduler>(backend, sc, metrics);
    sched->start();
    HttpConfig hc;
    hc.host = "127.0.0.1";
    hc.port = 0;
    hc.api_key = std::move(key);
    http = std::make_unique<HttpServer>(backend, *sched, metrics, hc);
    port = http->bind();
    thread = std::thread([this] { http->run(); });
  }
  void TearDown() override {
    if (!http) return;
    http->stop();
    sched->drain_and_stop(std::chrono::milliseconds(2000));
    thread.join();
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body, httplib::Headers h = {}) {
    return client().Post(path.c_str(), h, body, "application/json");
  }

  FakeBackend backend;
  Metrics metrics;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;
};

// A raw connection that sends one request and reads what arrives.
struct RawConn {
  int fd = -1;
  explicit RawConn(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~RawConn() { close_now(); }
  void send_post(const std::string& path, const std::string& body) {
    std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
  }
  std::string read_some() {
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
  }
  void close_now() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

const char* kChatBody = R"({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0})";

}  // namespace

TEST_F(HttpFixture, ChatNonStreamingAndStreamingAgree) {
  start();
  auto r = post("/v1/chat/completions", kChatBody);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  std::string full = j["choices"][0]["message"]["content"];
  EXPECT_EQ(full.size(), 12u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);

  json sb = json::parse(kChatBody);
  sb["stream"] = true;
  sb["stream_options"] = {{"include_usage", true}};
  auto s = post("/v1/chat/completions", sb.dump());
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  EXPECT_EQ(s->get_header_value("Content-Type"), "text/event-stream");
  std::string text;
  size_t pos = 0;
  bool done = false;
  json usage;
  int pieces = 0;  // non-empty content deltas
  while ((pos = s->body.find("data: ", pos)) != std::string::npos) {
    size_t e = s->body.find("\n\n", pos);
    std::string data = s->body.substr(pos + 6, e - pos - 6);
    pos = e;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json c = json::parse(data);
    if (!c["usage"].is_null()) usage = c["usage"];
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content")) {
      const std::string piece = c["choices"][0]["delta"]["content"].get<std::string>();
      text += piece;
      pieces += !piece.empty();
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, full);
  // One delta per token (the toy backend's tokens are one character each), however many tokens were
  // released before the HTTP thread read them (Job::text_cuts).
  EXPECT_EQ(pieces, 12);
  EXPECT_EQ(usage["completion_tokens"], 12);
  // The same conversation again: its prompt is in a parked sequence.
  EXPECT_GT(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST_F(HttpFixture, ApiKeyBearerOrXApiKey) {
  start(2, 4, "sekret");
  EXPECT_EQ(post("/v1/chat/completions", kChatBody)->status, 401);
  auto wrong = post("/v1/chat/completions", kChatBody, {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong->status, 401);
  EXPECT_NE(wrong->body.find("Incorrect API key"), std::string::npos);
  EXPECT_EQ(post("/v1/chat/completions", kChatBody, {{"Authorization", "Bearer sekret"}})->status, 200);
  auto m = post("/v1/messages",
                R"({"model": "x", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})",
                {{"x-api-key", "sekret"}});
  EXPECT_EQ(m->status, 200) << m->body;
  auto c = client();
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);  // open: load balancers probe it
  EXPECT_EQ(c.Get("/")->status, 200);
  auto a401 = post("/v1/messages", "{}");
  EXPECT_EQ(json::parse(a401->body)["error"]["type"], "authentication_error");
}

TEST_F(HttpFixture, BadInputsAre4xxWithMessages) {
  start();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* says;
  } cases[] = {
      {"/v1/chat/completions", "{not json", 400, "could not parse the JSON body"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "expected an array"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "top_k": -1})", 400,
       "top_k"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 300})", 400, "maximum context length is 256"},
      {"/v1/completions", R"({"prompt": ")" + std::string(300, 'a') + R"("})", 400,
       "maximum context length is 256"},
      {"/v1/messages", R"({"model": "m", "messages": []})", 400, "max_tokens"},
      {"/v1/nothing", "{}", 404, "Unknown path"},
  };
  for (auto& c : cases) {
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    EXPECT_NE(r->body.find(c.says), std::string::npos) << r->body;
    EXPECT_NO_THROW(json::parse(r->body)) << r->body;
  }
  auto ctx = json::parse(post("/v1/completions", R"({"prompt": "x", "max_tokens": 300})")->body);
  EXPECT_EQ(ctx["error"]["code"], "context_length_exceeded");
}

TEST_F(HttpFixture, OverloadAnswers429WithReason) {
  backend.step_delay = std::chrono::milliseconds(10);
  start(1, 0);
  RawConn busy(port);
  busy.send_post("/v1/completions", R"({"prompt": "keep busy", "max_tokens": 200, "stream": true})");
  EXPECT_NE(busy.read_some().find("200 OK"), std::string::npos);
  auto r = post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_NE(r->body.find("queue is full"), std::string::npos) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
}

TEST_F(HttpFixture, DisconnectCancelsAndFreesKv) {
  backend.step_delay = std::chrono::milliseconds(10);
  start(2, 4);
  for (bool stream : {true, false}) {
    uint64_t before = metrics.disconnects.load();
    RawConn c(port);
    c.send_post("/v1/completions", std::string(R"({"prompt": "long one", "max_tokens": 240, "stream": )") +
                                       (stream ? "true" : "false") + "}");
    while (sched->snapshot().running < 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a few tokens in
    int64_t calls = backend.decode_calls.load();
    c.close_now();
    auto t0 = std::chrono::steady_clock::now();
    while (sched->snapshot().running > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(sched->snapshot().running, 0) << "stream=" << stream;
    EXPECT_LE(backend.decode_calls.load() - calls, 3) << "stream=" << stream;
    EXPECT_EQ(metrics.disconnects.load(), before + 1) << "stream=" << stream;
    EXPECT_EQ(backend.live_sequences.load(), 0) << "a cancelled request's KV is freed, not parked";
  }
}

TEST_F(HttpFixture, HealthModelsMetricsAndPage) {
  start();
  auto c = client();
  auto h = c.Get("/health");
  EXPECT_EQ(h->status, 200);
  json hj = json::parse(h->body);
  EXPECT_EQ(hj["status"], "ok");
  EXPECT_LT(hj["scheduler_heartbeat_age_s"].get<double>(), 1.0);
  auto m = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "fake-model");
  EXPECT_EQ(c.Get("/v1/models/fake-model")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/other")->status, 404);
  post("/v1/completions", R"({"prompt": "count me", "max_tokens": 5})");
  auto met = c.Get("/metrics");
  EXPECT_NE(met->body.find("strata_requests_total{endpoint=\"completions\",outcome=\"ok\"} 1"),
            std::string::npos);
  EXPECT_NE(met->body.find("strata_generated_tokens_total 5"), std::string::npos);
  auto page = c.Get("/");
  EXPECT_NE(page->body.find("<title>strata</title>"), std::string::npos);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  // The scheduler loop gone: /health says so even though HTTP still answers.
  sched->drain_and_stop(std::chrono::milliseconds(100));
  auto h2 = c.Get("/health");
  EXPECT_EQ(h2->status, 503);
  EXPECT_EQ(json::parse(h2->body)["status"], "error");
}
