// Request validation (each bad input -> 400 naming the parameter), response/SSE formats, and the
// text stream (UTF-8 boundaries, stop strings).
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/metrics.h"
#include "server/text_stream.h"

using namespace strata::server;
using json = nlohmann::json;

namespace {

ApiError expect_error(ApiKind kind, const std::string& body) {
  try {
    parse_generation_request(kind, body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

constexpr auto kChat = ApiKind::ChatCompletions;
constexpr auto kComp = ApiKind::Completions;
constexpr auto kMsg = ApiKind::AnthropicMessages;

}  // namespace

TEST(ServerApi, ParsesAFullChatRequest) {
  auto r = parse_generation_request(kChat, R"({
    "model": "m", "messages": [{"role": "developer", "content": "be nice"},
                               {"role": "user", "content": [{"type": "text", "text": "hi "},
                                                            {"type": "text", "text": "there"}]}],
    "max_completion_tokens": 12, "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1,
    "presence_penalty": 1.5, "frequency_penalty": -1, "repeat_penalty": 1.1, "seed": 18446744073709551615,
    "stop": "###", "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "u",
    "logprobs": false, "response_format": {"type": "text"}, "max_tokens": null})");
  EXPECT_TRUE(r.is_chat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(*r.max_tokens, 12);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(*r.sampling.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, std::vector<std::string>{"###"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ServerApi, ParsesCompletionsAndMessages) {
  auto c = parse_generation_request(kComp, R"({"prompt": ["Once"], "echo": true, "stop": ["a", "b"], "ignore_eos": true})");
  EXPECT_TRUE(c.ignore_eos);
  EXPECT_FALSE(c.is_chat);
  EXPECT_EQ(c.prompt, "Once");
  EXPECT_EQ(*c.max_tokens, 16);  // OpenAI's default for this endpoint
  EXPECT_TRUE(c.echo);
  auto m = parse_generation_request(kMsg, R"({"model": "x", "max_tokens": 5, "system": "sys",
      "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
      "stop_sequences": ["\n\n"], "temperature": 1, "top_k": 5, "stream": true, "metadata": {}})");
  ASSERT_EQ(m.messages.size(), 2u);
  EXPECT_EQ(m.messages[0].role, "system");
  EXPECT_EQ(m.messages[0].content, "sys");
  EXPECT_EQ(*m.max_tokens, 5);
  EXPECT_EQ(m.stop, std::vector<std::string>{"\n\n"});
}

// The server's defaults (strata serve --temp/--top-k/...) fill what a request does not name, on every endpoint;
// what it names wins; without them the API's own (top_k off, top_p 1, temperature 1).
TEST(ServerApi, SamplingStartsFromTheServersDefaults) {
  SamplingOptions d;
  d.temperature = 0.6f;
  d.top_k = 40;
  d.top_p = 0.95f;
  d.min_p = 0.05f;
  d.repeat_penalty = 1.1f;
  d.presence_penalty = 0.5f;
  d.frequency_penalty = -0.25f;
  for (auto [kind, body] : {std::pair{kChat, R"({"messages": [{"role": "user", "content": "hi"}]})"},
                            std::pair{kComp, R"({"prompt": "Once"})"},
                            std::pair{kMsg, R"({"model": "x", "max_tokens": 5, "messages": [{"role": "user",
                                                "content": "q"}]})"}}) {
    auto r = parse_generation_request(kind, body, d);
    EXPECT_EQ(r.sampling.temperature, 0.6f) << body;
    EXPECT_EQ(r.sampling.top_k, 40) << body;
    EXPECT_EQ(r.sampling.top_p, 0.95f) << body;
    EXPECT_EQ(r.sampling.min_p, 0.05f) << body;
    EXPECT_EQ(r.sampling.repeat_penalty, 1.1f) << body;
    EXPECT_EQ(r.sampling.presence_penalty, 0.5f) << body;  // (Anthropic has none: the default holds)
    EXPECT_EQ(r.sampling.frequency_penalty, -0.25f) << body;
    EXPECT_FALSE(r.sampling.seed.has_value()) << body;
  }
  auto named = parse_generation_request(kChat, R"({"messages": [{"role": "user", "content": "hi"}],
      "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 3})", d);
  EXPECT_EQ(named.sampling.temperature, 0.0f);
  EXPECT_EQ(named.sampling.top_k, 0);
  EXPECT_EQ(named.sampling.top_p, 1.0f);
  EXPECT_EQ(named.sampling.min_p, 0.0f);
  EXPECT_EQ(named.sampling.repeat_penalty, 1.1f);  // not named: the server's
  EXPECT_EQ(*named.sampling.seed, 3u);
  auto api = parse_generation_request(kComp, R"({"prompt": "Once"})");
  EXPECT_EQ(api.sampling.temperature, 1.0f);
  EXPECT_EQ(api.sampling.top_k, 0);
  EXPECT_EQ(api.sampling.top_p, 1.0f);
  EXPECT_EQ(api.sampling.min_p, 0.0f);
}

// A server default a request could not send is refused at start, naming the flag.
TEST(ServerApi, RefusesSamplingDefaultsOutOfRange) {
  EXPECT_NO_THROW(check_sampling_defaults(SamplingOptions{}));
  const auto refused = [](auto edit, const char* flag) {
    SamplingOptions s;
    edit(s);
    try {
      check_sampling_defaults(s);
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << flag << " accepted";
  };
  refused([](SamplingOptions& s) { s.temperature = -0.1f; }, "--temp");
  refused([](SamplingOptions& s) { s.temperature = 2.5f; }, "--temp");
  refused([](SamplingOptions& s) { s.temperature = std::nanf(""); }, "--temp");
  refused([](SamplingOptions& s) { s.top_p = 0.0f; }, "--top-p");
  refused([](SamplingOptions& s) { s.top_p = 1.5f; }, "--top-p");
  refused([](SamplingOptions& s) { s.top_k = -1; }, "--top-k");
  refused([](SamplingOptions& s) { s.top_k = (1 << 20) + 1; }, "--top-k");  // (past what a request may send)
  refused([](SamplingOptions& s) { s.min_p = 1.01f; }, "--min-p");
  refused([](SamplingOptions& s) { s.repeat_penalty = 0.0f; }, "--repeat-penalty");
  refused([](SamplingOptions& s) { s.repeat_penalty = 11.0f; }, "--repeat-penalty");
  refused([](SamplingOptions& s) { s.presence_penalty = 2.1f; }, "--presence-penalty");
  refused([](SamplingOptions& s) { s.frequency_penalty = -3.0f; }, "--frequency-penalty");
}

struct BadCase {
  ApiKind kind;
  const char* body;
  const char* param;
  const char* says;  // a fragment the message must contain
};

TEST(ServerApi, EachBadInputIs400WithAPreciseMessage) {
  const BadCase cases[] = {
      {kChat, "{", "", "could not parse the JSON body"},
      {kChat, R"({"messages": [], "max_tokens": 5e555})", "", "could not parse the JSON body"},
      {kChat, "[1]", "", "must be a JSON object, but got an array"},
      {kChat, R"({"model": "m"})", "messages", "Missing required parameter: 'messages'"},
      {kChat, R"({"messages": {}})", "messages", "expected an array, but got an object"},
      {kChat, R"({"messages": []})", "messages", "empty array"},
      {kChat, R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role", "'robot'"},
      {kChat, R"({"messages": [{"content": "x"}]})", "messages[0].role", "Missing required"},
      {kChat, R"({"messages": [{"role": "user"}]})", "messages[0].content", "Missing required"},
      {kChat, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "got an integer"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "'image_url' content is not supported"},
      {kChat, R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "messages[0].tool_calls", "tool calls are not supported"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature",
       "Invalid type for 'temperature': expected a number, but got a string instead."},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature",
       "Expected a value <= 2, but got 3"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p", "greater than 0"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens",
       "Expected a value >= 1, but got 0"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "max_tokens",
       "expected an integer, but got a decimal"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999})",
       "max_tokens", "integer above maximum value"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", "n", "one choice"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "stop": 7})", "stop",
       "expected a string or an array of strings"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop", "must not be empty"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       "stop", "maximum length 16"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream",
       "expected a boolean, but got a string"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
       "stream_options", "only allowed when 'stream' is true"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "seed": "1"})", "seed", "expected an integer"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})", "tools", "tool calling"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", "logprobs", "not supported"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1})", "frobnicate",
       "Unrecognized request argument supplied: frobnicate"},
      {kComp, R"({"max_tokens": 3})", "prompt", "Missing required parameter: 'prompt'"},
      {kComp, R"({"prompt": ""})", "prompt", "must not be empty"},
      {kComp, R"({"prompt": [1, 2, 3]})", "prompt", "token-id prompts"},
      {kComp, R"({"prompt": "x", "best_of": 3})", "best_of", "only 1"},
      {kComp, R"({"prompt": "x", "suffix": "y"})", "suffix", "insertion"},
      {kMsg, R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", "max_tokens",
       "Missing required parameter: 'max_tokens'"},
      {kMsg, R"({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})", "model", "Missing required"},
      {kMsg, R"({"model": "m", "max_tokens": 3, "messages": [{"role": "system", "content": "x"}]})",
       "messages.0.role", "Input should be 'user' or 'assistant'"},
      {kMsg, R"({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})",
       "temperature", "Expected a value <= 1"},
      {kMsg, R"({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"})",
       "stop_sequences", "expected an array of strings"},
      {kMsg, R"({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "foo": 1})",
       "foo", "Extra inputs are not permitted"},
  };
  for (const auto& c : cases) {
    ApiError e = expect_error(c.kind, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
}

TEST(ServerApi, ErrorBodiesFollowEachApi) {
  ApiError e;
  e.status = 400;
  e.message = "bad";
  e.param = "temperature";
  json o = error_body(kChat, e);
  EXPECT_EQ(o["error"]["message"], "bad");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o["error"]["param"], "temperature");
  EXPECT_TRUE(o["error"]["code"].is_null());
  json a = error_body(kMsg, e);
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");
  e.status = 429;
  EXPECT_EQ(error_body(kMsg, e)["error"]["type"], "rate_limit_error");
}

namespace {
// Splits an SSE body into its events' data payloads (and event names).
std::vector<std::pair<std::string, std::string>> sse_events(const std::string& body) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "event not terminated by a blank line";
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos), name, data;
    size_t lp = 0;
    while (lp < ev.size()) {
      size_t le = ev.find('\n', lp);
      if (le == std::string::npos) le = ev.size();
      std::string line = ev.substr(lp, le - lp);
      if (line.rfind("event: ", 0) == 0) name = line.substr(7);
      if (line.rfind("data: ", 0) == 0) data = line.substr(6);
      lp = le + 1;
    }
    out.emplace_back(name, data);
    pos = end + 2;
  }
  return out;
}
}  // namespace

TEST(ServerApi, ChatStreamChunksAndFinalObject) {
  auto req = parse_generation_request(
      kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
                 "stream_options": {"include_usage": true}})");
  ResponseWriter w(req, "tiny", 1700000000, "chatcmpl-1");
  Usage u{10, 3, 4};
  std::string body = w.stream_begin(u) + w.stream_delta("Hel") + w.stream_delta("") +
                     w.stream_delta("lo") + w.stream_end(FinishReason::Eos, "", u);
  auto evs = sse_events(body);
  ASSERT_EQ(evs.size(), 6u);  // role, 2 deltas, finish, usage, [DONE]
  std::string text;
  for (size_t i = 0; i + 1 < evs.size(); ++i) {
    json c = json::parse(evs[i].second);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], "chatcmpl-1");
    EXPECT_EQ(c["created"], 1700000000);
    EXPECT_EQ(c["model"], "tiny");
    if (i + 2 == evs.size()) {
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(c["usage"]["prompt_tokens"], 10);
      EXPECT_EQ(c["usage"]["completion_tokens"], 3);
      EXPECT_EQ(c["usage"]["total_tokens"], 13);
      EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
      continue;
    }
    EXPECT_TRUE(c["usage"].is_null());
    auto& ch = c["choices"][0];
    EXPECT_EQ(ch["index"], 0);
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    }
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (i == 3) {
      EXPECT_EQ(ch["finish_reason"], "stop");
    } else {
      EXPECT_TRUE(ch["finish_reason"].is_null());
    }
  }
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(evs.back().second, "[DONE]");

  json full = w.full("Hello", FinishReason::Length, "", u);
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(ServerApi, CompletionStreamAndEcho) {
  auto req = parse_generation_request(kComp, R"({"prompt": "Say", "stream": true, "echo": true})");
  ResponseWriter w(req, "tiny", 1, "cmpl-1");
  auto evs = sse_events(w.stream_begin({}) + w.stream_delta(" hi") + w.stream_end(FinishReason::Length, "", {}));
  ASSERT_EQ(evs.size(), 4u);
  std::string text;
  for (size_t i = 0; i + 1 < evs.size(); ++i) {
    json c = json::parse(evs[i].second);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    EXPECT_FALSE(c.contains("usage"));  // only with stream_options.include_usage
  }
  EXPECT_EQ(text, "Say hi");
  EXPECT_EQ(json::parse(evs[2].second)["choices"][0]["finish_reason"], "length");
  json full = w.full(" hi", FinishReason::Eos, "", {5, 1, 0});
  EXPECT_EQ(full["choices"][0]["text"], "Say hi");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "stop");
}

TEST(ServerApi, AnthropicStreamEvents) {
  auto req = parse_generation_request(
      kMsg, R"({"model": "claude-x", "max_tokens": 9, "stream": true,
                "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["END"]})");
  ResponseWriter w(req, "claude-x", 1, "msg_1");
  Usage u{20, 2, 15};
  auto evs = sse_events(w.stream_begin(u) + w.stream_delta("a") + w.stream_delta("b") +
                        w.stream_end(FinishReason::StopString, "END", u));
  std::vector<std::string> names;
  for (auto& e : evs) {
    names.push_back(e.first);
    EXPECT_EQ(json::parse(e.second)["type"], e.first);  // event name == data.type
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "ping",
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"}));
  json start = json::parse(evs[0].second)["message"];
  EXPECT_EQ(start["id"], "msg_1");
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["usage"]["input_tokens"], 5);
  EXPECT_EQ(start["usage"]["cache_read_input_tokens"], 15);
  json d = json::parse(evs[3].second);
  EXPECT_EQ(d["delta"]["type"], "text_delta");
  EXPECT_EQ(d["delta"]["text"], "a");
  json md = json::parse(evs[6].second);
  EXPECT_EQ(md["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(md["delta"]["stop_sequence"], "END");
  EXPECT_EQ(md["usage"]["output_tokens"], 2);
  json full = w.full("ab", FinishReason::Length, "", u);
  EXPECT_EQ(full["type"], "message");
  EXPECT_EQ(full["content"][0]["type"], "text");
  EXPECT_EQ(full["content"][0]["text"], "ab");
  EXPECT_EQ(full["stop_reason"], "max_tokens");
  EXPECT_TRUE(full["stop_sequence"].is_null());
}

TEST(ServerApi, InvalidUtf8IsReplacedNotThrown) {
  EXPECT_EQ(dump_json(json("a\xC3")), "\"a\xEF\xBF\xBD\"");
}

TEST(ServerTextStream, HoldsPartialUtf8AndStopPrefixes) {
  TextStream t({"STOP"});
  EXPECT_EQ(t.push("ab\xE2\x82"), "ab");  // "€" split: held
  EXPECT_EQ(t.push("\xAC "), "\xE2\x82\xAC ");
  EXPECT_EQ(t.push("xS"), "x");          // "S" may start STOP
  EXPECT_EQ(t.push("T"), "");
  EXPECT_EQ(t.push("x"), "STx");         // not a stop after all
  EXPECT_EQ(t.push("yST"), "y");
  EXPECT_EQ(t.push("OPzzz"), "");        // stop found: nothing after
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.matched_stop(), "STOP");
  EXPECT_EQ(t.push("more"), "");
  EXPECT_EQ(t.flush(), "");
}

TEST(ServerTextStream, EarliestStopWinsAndFlushReleasesTail) {
  TextStream t({"cd", "bc"});
  EXPECT_EQ(t.push("abcd"), "a");
  EXPECT_EQ(t.matched_stop(), "bc");
  TextStream u({"zz"});
  EXPECT_EQ(u.push("az"), "a");
  EXPECT_EQ(u.flush(), "z");
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98\x80"), 0u);
}

TEST(ServerMetrics, PrometheusTextHasTheFigures) {
  Metrics m;
  m.count_request(kChat, Metrics::kOk);
  m.count_request(kMsg, Metrics::kRejected);
  m.generated_tokens = 42;
  BackendInfo info;
  info.model_id = "tiny\"q";
  info.n_ctx = 256;
  info.device = "cpu";
  SchedulerSnapshot s;
  s.queue_depth = 3;
  s.decode_tok_s = 12.5;
  BackendStats bs;
  bs.expert_cache_hits = 30, bs.expert_cache_lookups = 120, bs.expert_cache_direct = 35;
  std::string t = m.render_prometheus(info, bs, s);
  EXPECT_NE(t.find("strata_requests_total{endpoint=\"chat.completions\",outcome=\"ok\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("strata_requests_total{endpoint=\"messages\",outcome=\"rejected\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("strata_generated_tokens_total 42\n"), std::string::npos);
  EXPECT_NE(t.find("strata_queue_depth 3\n"), std::string::npos);
  EXPECT_NE(t.find("strata_decode_tokens_per_second 12.5\n"), std::string::npos);
  EXPECT_NE(t.find("strata_expert_cache_hit_rate 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("strata_expert_cache_direct_total 35\n"), std::string::npos);
  EXPECT_NE(t.find("model=\"tiny\\\"q\""), std::string::npos);
  // Every sample line belongs to a declared metric family.
  std::string family;
  size_t pos = 0;
  while (pos < t.size()) {
    size_t e = t.find('\n', pos);
    std::string line = t.substr(pos, e - pos);
    pos = e + 1;
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
    } else if (line[0] != '#') {
      EXPECT_EQ(line.rfind(family, 0), 0u) << line;
    }
  }
}
