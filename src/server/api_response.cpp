#include "server/api_response.h"

namespace strata::server {

using json = nlohmann::json;

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json error_body(ApiKind kind, const ApiError& e) {
  if (kind == ApiKind::AnthropicMessages)
    return {{"type", "error"},
            {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}};
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return {{"error", err}};
}

std::string finish_reason_name(ApiKind kind, FinishReason r) {
  if (kind == ApiKind::AnthropicMessages) {
    switch (r) {
      case FinishReason::Eos: return "end_turn";
      case FinishReason::StopString: return "stop_sequence";
      case FinishReason::Length: return "max_tokens";
      default: return "end_turn";
    }
  }
  return r == FinishReason::Length ? "length" : "stop";
}

ResponseWriter::ResponseWriter(const GenerationRequest& req, std::string model_id,
                               int64_t created_unix, std::string id)
    : kind_(req.kind), include_usage_(req.include_usage), model_(std::move(model_id)),
      created_(created_unix), id_(std::move(id)) {
  if (req.kind == ApiKind::Completions && req.echo) echo_prefix_ = req.prompt;
}

json ResponseWriter::usage_json(const Usage& u) const {
  if (kind_ == ApiKind::AnthropicMessages)
    return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens},
            {"output_tokens", u.completion_tokens}};
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json ResponseWriter::chunk_base() const {
  const char* object = kind_ == ApiKind::ChatCompletions ? "chat.completion.chunk" : "text_completion";
  json j = {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_},
            {"system_fingerprint", "strata-" STRATA_VERSION}};
  return j;
}

static std::string sse_data(const json& j) { return "data: " + dump_json(j) + "\n\n"; }
static std::string sse_event(const char* name, const json& j) {
  return std::string("event: ") + name + "\ndata: " + dump_json(j) + "\n\n";
}

std::string ResponseWriter::stream_begin(const Usage& u) {
  switch (kind_) {
    case ApiKind::ChatCompletions: {
      json c = chunk_base();
      c["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
      if (include_usage_) c["usage"] = nullptr;
      return sse_data(c);
    }
    case ApiKind::Completions:
      return echo_prefix_.empty() ? std::string() : stream_delta(echo_prefix_);
    case ApiKind::AnthropicMessages: {
      json msg = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", model_},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", usage_json(u)}};
      return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) +
             sse_event("content_block_start", {{"type", "content_block_start"},
                                               {"index", 0},
                                               {"content_block", {{"type", "text"}, {"text", ""}}}}) +
             sse_event("ping", {{"type", "ping"}});
    }
  }
  return {};
}

std::string ResponseWriter::stream_delta(const std::string& text) {
  if (text.empty()) return {};
  switch (kind_) {
    case ApiKind::ChatCompletions: {
      json c = chunk_base();
      c["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"content", text}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
      if (include_usage_) c["usage"] = nullptr;
      return sse_data(c);
    }
    case ApiKind::Completions: {
      json c = chunk_base();
      c["choices"] = json::array(
          {{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      if (include_usage_) c["usage"] = nullptr;
      return sse_data(c);
    }
    case ApiKind::AnthropicMessages:
      return sse_event("content_block_delta", {{"type", "content_block_delta"},
                                               {"index", 0},
                                               {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  return {};
}

std::string ResponseWriter::stream_end(FinishReason why, const std::string& stop, const Usage& u) {
  std::string out;
  switch (kind_) {
    case ApiKind::ChatCompletions:
    case ApiKind::Completions: {
      json c = chunk_base();
      if (kind_ == ApiKind::ChatCompletions)
        c["choices"] = json::array({{{"index", 0},
                                     {"delta", json::object()},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish_reason_name(kind_, why)}}});
      else
        c["choices"] = json::array({{{"text", ""},
                                     {"index", 0},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish_reason_name(kind_, why)}}});
      if (include_usage_) c["usage"] = nullptr;
      out += sse_data(c);
      if (include_usage_) {
        json uc = chunk_base();
        uc["choices"] = json::array();
        uc["usage"] = usage_json(u);
        out += sse_data(uc);
      }
      out += "data: [DONE]\n\n";
      return out;
    }
    case ApiKind::AnthropicMessages: {
      out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
      json delta = {{"stop_reason", finish_reason_name(kind_, why)},
                    {"stop_sequence", why == FinishReason::StopString ? json(stop) : json(nullptr)}};
      out += sse_event("message_delta", {{"type", "message_delta"},
                                         {"delta", delta},
                                         {"usage", {{"output_tokens", u.completion_tokens}}}});
      out += sse_event("message_stop", {{"type", "message_stop"}});
      return out;
    }
  }
  return out;
}

std::string ResponseWriter::stream_error(const ApiError& e) {
  if (kind_ == ApiKind::AnthropicMessages) return sse_event("error", error_body(kind_, e));
  return sse_data(error_body(kind_, e)) + "data: [DONE]\n\n";
}

json ResponseWriter::full(const std::string& text, FinishReason why, const std::string& stop,
                          const Usage& u) const {
  switch (kind_) {
    case ApiKind::ChatCompletions:
      return {{"id", id_},
              {"object", "chat.completion"},
              {"created", created_},
              {"model", model_},
              {"system_fingerprint", "strata-" STRATA_VERSION},
              {"choices", json::array({{{"index", 0},
                                        {"message", {{"role", "assistant"},
                                                     {"content", text},
                                                     {"refusal", nullptr}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason_name(kind_, why)}}})},
              {"usage", usage_json(u)}};
    case ApiKind::Completions:
      return {{"id", id_},
              {"object", "text_completion"},
              {"created", created_},
              {"model", model_},
              {"system_fingerprint", "strata-" STRATA_VERSION},
              {"choices", json::array({{{"text", echo_prefix_ + text},
                                        {"index", 0},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason_name(kind_, why)}}})},
              {"usage", usage_json(u)}};
    case ApiKind::AnthropicMessages:
      return {{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model_},
              {"content", json::array({{{"type", "text"}, {"text", text}}})},
              {"stop_reason", finish_reason_name(kind_, why)},
              {"stop_sequence", why == FinishReason::StopString ? json(stop) : json(nullptr)},
              {"usage", usage_json(u)}};
  }
  return {};
}

}  // namespace strata::server
