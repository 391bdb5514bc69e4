// Request parsing and validation for the generation endpoints (see api_request.h).
// Messages follow OpenAI's wording ("Invalid type for 'x': expected ..., but got ... instead.") so a
// client sees what a real OpenAI/Anthropic server would have told it.
#include "server/api_request.h"

#include <fmt/format.h>

#include "common/error.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace strata::server {

using json = nlohmann::json;

const char* api_kind_name(ApiKind k) {
  switch (k) {
    case ApiKind::ChatCompletions: return "chat.completions";
    case ApiKind::Completions: return "completions";
    case ApiKind::AnthropicMessages: return "messages";
  }
  return "?";
}

namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopLength = 256;

[[noreturn]] void bad(std::string param, std::string msg, std::string code = "") {
  ApiError e;
  e.status = 400;
  e.message = std::move(msg);
  e.param = std::move(param);
  e.code = std::move(code);
  throw e;
}

const char* type_word(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a decimal";
    default: return "an unsupported value";
  }
}

[[noreturn]] void bad_type(const std::string& name, const char* expected, const json& v) {
  bad(name, fmt::format("Invalid type for '{}': expected {}, but got {} instead.", name, expected,
                        type_word(v)));
}

// The request object, with a record of which keys were consumed so leftovers can be reported.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // nullptr when the key is absent or JSON null (clients send null for "use the default").
  const json* get(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  const json& require(const std::string& key) {
    const json* v = get(key);
    if (!v) bad(key, fmt::format("Missing required parameter: '{}'.", key));
    return *v;
  }
  void ignore(const std::string& key) { seen_.insert(key); }

  std::optional<double> number(const std::string& key, double lo, double hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad_type(key, "a number", *v);
    double d = v->get<double>();
    if (!std::isfinite(d)) bad(key, fmt::format("Invalid '{}': must be a finite number.", key));
    if (d < lo)
      bad(key, fmt::format("Invalid '{}': number below minimum value. Expected a value >= {}, but "
                           "got {} instead.", key, lo, d));
    if (d > hi)
      bad(key, fmt::format("Invalid '{}': number above maximum value. Expected a value <= {}, but "
                           "got {} instead.", key, hi, d));
    return d;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) bad_type(key, "an integer", *v);
    // Unsigned values above int64 max are out of range for every integer parameter we take.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(key, fmt::format("Invalid '{}': integer above maximum value. Expected a value <= {}.", key, hi));
    int64_t i = v->get<int64_t>();
    if (i < lo)
      bad(key, fmt::format("Invalid '{}': integer below minimum value. Expected a value >= {}, but "
                           "got {} instead.", key, lo, i));
    if (i > hi)
      bad(key, fmt::format("Invalid '{}': integer above maximum value. Expected a value <= {}, but "
                           "got {} instead.", key, hi, i));
    return i;
  }
  std::optional<bool> boolean(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad_type(key, "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad_type(key, "a string", *v);
    return v->get<std::string>();
  }

  // Every key the endpoint did not consume is an error, as OpenAI does.
  void reject_unknown(bool anthropic) {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (seen_.count(it.key())) continue;
      if (anthropic) bad(it.key(), fmt::format("{}: Extra inputs are not permitted", it.key()));
      bad(it.key(), fmt::format("Unrecognized request argument supplied: {}", it.key()));
    }
  }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

std::vector<std::string> parse_stop(Fields& f, const std::string& key, bool allow_string) {
  const json* v = f.get(key);
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string() && allow_string) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStopStrings)
      bad(key, fmt::format("Invalid '{}': array too long. Expected an array with maximum length {}, "
                           "but got an array with length {} instead.", key, kMaxStopStrings, v->size()));
    for (size_t i = 0; i < v->size(); ++i) {
      const json& s = (*v)[i];
      if (!s.is_string()) bad_type(fmt::format("{}[{}]", key, i), "a string", s);
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_type(key, allow_string ? "a string or an array of strings" : "an array of strings", *v);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) bad(key, fmt::format("Invalid '{}': stop strings must not be empty.", key));
    if (out[i].size() > kMaxStopLength)
      bad(key, fmt::format("Invalid '{}': a stop string is {} bytes; at most {} are allowed.", key,
                           out[i].size(), kMaxStopLength));
  }
  return out;
}

// Text of an OpenAI message `content` (string or array of {type:"text", text}) or an Anthropic
// content (string or array of {type:"text", text}).
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_type(where, "a string or an array of content parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string pw = fmt::format("{}[{}]", where, i);
    if (!part.is_object()) bad_type(pw, "an object", part);
    auto t = part.find("type");
    if (t == part.end() || !t->is_string())
      bad(pw + ".type", fmt::format("Missing required parameter: '{}.type'.", pw));
    std::string type = t->get<std::string>();
    if (type != "text")
      bad(pw + ".type", fmt::format("Invalid value for '{}.type': '{}' content is not supported by "
                                    "this model; only 'text' is.", pw, type));
    auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string())
      bad(pw + ".text", fmt::format("Missing required parameter: '{}.text' (a string).", pw));
    text += tx->get<std::string>();
  }
  return text;
}

// The ranges a request's sampling fields may take (OpenAI's, Anthropic's temperature at most 1); the server's
// defaults are held to the same (check_sampling_defaults).
constexpr double kMaxTemperature = 2.0, kMaxTemperatureAnthropic = 1.0;
constexpr int64_t kMaxTopK = 1 << 20;
constexpr double kMaxRepeatPenalty = 10.0;
constexpr double kMaxPenalty = 2.0;  // presence and frequency: [-2, 2]

void parse_common_sampling(Fields& f, SamplingOptions& s, bool anthropic) {
  if (auto v = f.number("temperature", 0.0, anthropic ? kMaxTemperatureAnthropic : kMaxTemperature))
    s.temperature = float(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v <= 0.0) bad("top_p", "Invalid 'top_p': must be greater than 0 and at most 1.");
    s.top_p = float(*v);
  }
  if (auto v = f.integer("top_k", 0, kMaxTopK)) s.top_k = int32_t(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = f.number("repeat_penalty", 0.0, kMaxRepeatPenalty)) {
    if (*v <= 0.0) bad("repeat_penalty", "Invalid 'repeat_penalty': must be greater than 0.");
    s.repeat_penalty = float(*v);
  }
  if (!anthropic) {
    if (auto v = f.number("presence_penalty", -kMaxPenalty, kMaxPenalty)) s.presence_penalty = float(*v);
    if (auto v = f.number("frequency_penalty", -kMaxPenalty, kMaxPenalty)) s.frequency_penalty = float(*v);
  }
  if (const json* v = f.get("seed")) {
    if (!v->is_number_integer()) bad_type("seed", "an integer", *v);
    // Any 64-bit value, signed or not: the bits seed the generator.
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
}

void parse_stream_options(Fields& f, GenerationRequest& r) {
  const json* so = f.get("stream_options");
  if (!so) return;
  if (!so->is_object()) bad_type("stream_options", "an object", *so);
  if (!r.stream)
    bad("stream_options", "Invalid value for 'stream_options': only allowed when 'stream' is true.");
  for (auto it = so->begin(); it != so->end(); ++it) {
    if (it.key() == "include_usage") {
      if (!it->is_boolean()) bad_type("stream_options.include_usage", "a boolean", *it);
      r.include_usage = it->get<bool>();
    } else {
      bad("stream_options." + it.key(),
          fmt::format("Unrecognized request argument supplied: stream_options.{}", it.key()));
    }
  }
}

void require_n_one(Fields& f) {
  if (auto n = f.integer("n", 1, 128); n && *n != 1)
    bad("n", fmt::format("Invalid 'n': this server generates one choice per request; got {}.", *n));
}

void parse_chat(Fields& f, GenerationRequest& r) {
  r.is_chat = true;
  r.model = f.string("model").value_or("");
  const json& msgs = f.require("messages");
  if (!msgs.is_array()) bad_type("messages", "an array", msgs);
  if (msgs.empty())
    bad("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, but "
                    "got an empty array instead.");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string w = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_type(w, "an object", m);
    auto role = m.find("role");
    if (role == m.end()) bad(w + ".role", fmt::format("Missing required parameter: '{}.role'.", w));
    if (!role->is_string()) bad_type(w + ".role", "a string", *role);
    std::string rs = role->get<std::string>();
    if (rs == "developer") rs = "system";
    if (rs != "system" && rs != "user" && rs != "assistant")
      bad(w + ".role", fmt::format("Invalid value: '{}'. Supported values are: 'system', 'developer', "
                                   "'user' and 'assistant'.", role->get<std::string>()));
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& k = it.key();
      if (k == "role" || k == "content" || k == "name") continue;
      if (k == "tool_calls" || k == "function_call")
        bad(w + "." + k, fmt::format("Invalid '{}.{}': tool calls are not supported.", w, k));
      bad(w + "." + k, fmt::format("Unrecognized request argument supplied: {}.{}", w, k));
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null())
      bad(w + ".content", fmt::format("Missing required parameter: '{}.content'.", w));
    r.messages.push_back({rs, content_text(*content, w + ".content")});
  }
  auto mt = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
  auto mct = f.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
  if (mct) r.max_tokens = int32_t(*mct);
  else if (mt) r.max_tokens = int32_t(*mt);
  r.stop = parse_stop(f, "stop", true);
  r.stream = f.boolean("stream").value_or(false);
  parse_stream_options(f, r);
  parse_common_sampling(f, r.sampling, false);
  require_n_one(f);
  if (auto lp = f.boolean("logprobs"); lp && *lp)
    bad("logprobs", "Invalid 'logprobs': log probabilities are not supported by this server.");
  if (f.get("top_logprobs")) bad("top_logprobs", "Invalid 'top_logprobs': not supported (logprobs are not).");
  if (const json* lb = f.get("logit_bias")) {
    if (!lb->is_object()) bad_type("logit_bias", "an object", *lb);
    if (!lb->empty()) bad("logit_bias", "Invalid 'logit_bias': not supported by this server.");
  }
  if (const json* rf = f.get("response_format")) {
    if (!rf->is_object()) bad_type("response_format", "an object", *rf);
    auto t = rf->find("type");
    if (t == rf->end() || !t->is_string() || t->get<std::string>() != "text")
      bad("response_format", "Invalid 'response_format': only {\"type\": \"text\"} is supported.");
  }
  for (const char* k : {"tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"})
    if (f.get(k)) bad(k, fmt::format("Invalid '{}': tool calling is not supported by this server.", k));
  if (auto u = f.get("user"); u && !u->is_string()) bad_type("user", "a string", *u);
  if (auto s = f.get("store"); s && !s->is_boolean()) bad_type("store", "a boolean", *s);
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (auto md = f.get("metadata"); md && !md->is_object()) bad_type("metadata", "an object", *md);
  f.reject_unknown(false);
}

void parse_completion(Fields& f, GenerationRequest& r) {
  r.is_chat = false;
  r.model = f.string("model").value_or("");
  const json& p = f.require("prompt");
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt = p[0].get<std::string>();
  } else if (p.is_array()) {
    bad("prompt", "Invalid 'prompt': this server takes one prompt per request (a string or an array "
                  "of one string); token-id prompts and batches are not supported.");
  } else {
    bad_type("prompt", "a string", p);
  }
  if (r.prompt.empty()) bad("prompt", "Invalid 'prompt': must not be empty.");
  // OpenAI's legacy completions endpoint defaults max_tokens to 16.
  r.max_tokens = int32_t(f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max()).value_or(16));
  r.stop = parse_stop(f, "stop", true);
  r.stream = f.boolean("stream").value_or(false);
  parse_stream_options(f, r);
  r.echo = f.boolean("echo").value_or(false);
  parse_common_sampling(f, r.sampling, false);
  require_n_one(f);
  if (auto b = f.integer("best_of", 1, 128); b && *b != 1)
    bad("best_of", "Invalid 'best_of': only 1 is supported.");
  if (f.get("logprobs")) bad("logprobs", "Invalid 'logprobs': log probabilities are not supported.");
  if (const json* s = f.get("suffix")) {
    if (!s->is_string()) bad_type("suffix", "a string", *s);
    if (!s->get<std::string>().empty()) bad("suffix", "Invalid 'suffix': insertion is not supported.");
  }
  if (const json* lb = f.get("logit_bias")) {
    if (!lb->is_object()) bad_type("logit_bias", "an object", *lb);
    if (!lb->empty()) bad("logit_bias", "Invalid 'logit_bias': not supported by this server.");
  }
  if (auto u = f.get("user"); u && !u->is_string()) bad_type("user", "a string", *u);
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  f.reject_unknown(false);
}

void parse_anthropic(Fields& f, GenerationRequest& r) {
  r.is_chat = true;
  const json& model = f.require("model");
  if (!model.is_string()) bad_type("model", "a string", model);
  r.model = model.get<std::string>();
  const json& mt = f.require("max_tokens");
  (void)mt;
  r.max_tokens = int32_t(*f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max()));
  if (const json* sys = f.get("system")) {
    std::string text = content_text(*sys, "system");
    if (!text.empty()) r.messages.push_back({"system", text});
  }
  const json& msgs = f.require("messages");
  if (!msgs.is_array()) bad_type("messages", "an array", msgs);
  if (msgs.empty()) bad("messages", "messages: at least one message is required");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string w = fmt::format("messages.{}", i);
    if (!m.is_object()) bad_type(w, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      bad(w + ".role", fmt::format("{}.role: Field required (a string: 'user' or 'assistant')", w));
    std::string rs = role->get<std::string>();
    if (rs != "user" && rs != "assistant")
      bad(w + ".role", fmt::format("{}.role: Input should be 'user' or 'assistant', got '{}'", w, rs));
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it.key() != "role" && it.key() != "content")
        bad(w + "." + it.key(), fmt::format("{}.{}: Extra inputs are not permitted", w, it.key()));
    auto content = m.find("content");
    if (content == m.end() || content->is_null())
      bad(w + ".content", fmt::format("{}.content: Field required", w));
    r.messages.push_back({rs, content_text(*content, w + ".content")});
  }
  if (r.messages.back().role != "user" && r.messages.back().role != "assistant")
    bad("messages", "messages: the last message must be from 'user' or 'assistant'");
  r.stop = parse_stop(f, "stop_sequences", false);
  r.stream = f.boolean("stream").value_or(false);
  parse_common_sampling(f, r.sampling, true);
  if (auto md = f.get("metadata"); md && !md->is_object()) bad_type("metadata", "an object", *md);
  for (const char* k : {"tools", "tool_choice"})
    if (f.get(k)) bad(k, fmt::format("{}: tool use is not supported by this server", k));
  if (f.get("thinking")) bad("thinking", "thinking: extended thinking is not supported by this server");
  f.reject_unknown(true);
}

}  // namespace

void check_sampling_defaults(const SamplingOptions& s) {
  const auto in = [](float v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  STRATA_REQUIRE(in(s.temperature, 0.0, kMaxTemperature), "--temp must be in [0, {}], got {}", kMaxTemperature,
                 s.temperature);
  STRATA_REQUIRE(in(s.top_p, 0.0, 1.0) && s.top_p > 0.0f, "--top-p must be in (0, 1], got {}", s.top_p);
  STRATA_REQUIRE(s.top_k >= 0 && s.top_k <= kMaxTopK, "--top-k must be in [0, {}] (0: off), got {}", kMaxTopK,
                 s.top_k);
  STRATA_REQUIRE(in(s.min_p, 0.0, 1.0), "--min-p must be in [0, 1], got {}", s.min_p);
  STRATA_REQUIRE(in(s.repeat_penalty, 0.0, kMaxRepeatPenalty) && s.repeat_penalty > 0.0f,
                 "--repeat-penalty must be in (0, {}], got {}", kMaxRepeatPenalty, s.repeat_penalty);
  STRATA_REQUIRE(in(s.presence_penalty, -kMaxPenalty, kMaxPenalty), "--presence-penalty must be in [-{}, {}], got {}",
                 kMaxPenalty, kMaxPenalty, s.presence_penalty);
  STRATA_REQUIRE(in(s.frequency_penalty, -kMaxPenalty, kMaxPenalty),
                 "--frequency-penalty must be in [-{}, {}], got {}", kMaxPenalty, kMaxPenalty, s.frequency_penalty);
}

GenerationRequest parse_generation_request(ApiKind kind, std::string_view body, const SamplingOptions& defaults) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e999
    bad("", fmt::format("We could not parse the JSON body of your request. ({})", e.what()));
  }
  if (!j.is_object())
    bad("", fmt::format("The request body must be a JSON object, but got {} instead.", type_word(j)));
  GenerationRequest r;
  r.kind = kind;
  r.sampling = defaults;
  Fields f(j, "");
  switch (kind) {
    case ApiKind::ChatCompletions: parse_chat(f, r); break;
    case ApiKind::Completions: parse_completion(f, r); break;
    case ApiKind::AnthropicMessages: parse_anthropic(f, r); break;
  }
  return r;
}

}  // namespace strata::server
