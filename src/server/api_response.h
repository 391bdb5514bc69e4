#pragma once
// Response bodies and SSE events, byte-compatible with the OpenAI API (chat.completion,
// chat.completion.chunk, text_completion, `data: [DONE]`) and Anthropic's Messages API (message,
// message_start / content_block_start / content_block_delta / content_block_stop / message_delta /
// message_stop). One ResponseWriter per request turns generation events into the body text.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_request.h"

namespace strata::server {

enum class FinishReason { None, Eos, Length, StopString, Cancelled };

struct Usage {
  int64_t prompt_tokens = 0;      // tokens of the prompt (all of them, reused or not)
  int64_t completion_tokens = 0;  // tokens generated
  int64_t cached_tokens = 0;      // prompt tokens whose KV was reused from an earlier request
};

// JSON text for the wire: invalid UTF-8 (a token split mid-character at the end) becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);

// Error bodies: OpenAI {"error": {...}}, Anthropic {"type": "error", "error": {...}}.
nlohmann::json error_body(ApiKind kind, const ApiError& e);
// Anthropic's error type for an HTTP status (invalid_request_error, authentication_error, ...).
std::string anthropic_error_type(int status);

class ResponseWriter {
 public:
  ResponseWriter(const GenerationRequest& req, std::string model_id, int64_t created_unix,
                 std::string id);

  // Streaming: the SSE text to send at the start, for a text delta, and at the end.
  std::string stream_begin(const Usage& prompt_usage);
  std::string stream_delta(const std::string& text);
  std::string stream_end(FinishReason why, const std::string& stop, const Usage& usage);
  // An error after the stream started (headers already sent with 200).
  std::string stream_error(const ApiError& e);

  // Non-streaming: the whole response object.
  nlohmann::json full(const std::string& text, FinishReason why, const std::string& stop,
                      const Usage& usage) const;

  const std::string& id() const { return id_; }

 private:
  nlohmann::json usage_json(const Usage& u) const;
  nlohmann::json chunk_base() const;

  ApiKind kind_;
  bool include_usage_;
  std::string model_;
  int64_t created_;
  std::string id_;
  std::string echo_prefix_;  // completions with echo=true
};

// The OpenAI finish_reason / Anthropic stop_reason string.
std::string finish_reason_name(ApiKind kind, FinishReason r);

}  // namespace strata::server
