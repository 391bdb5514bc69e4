#pragma once
// The three generation endpoints' request bodies (OpenAI chat/completions, OpenAI completions,
// Anthropic messages), parsed and validated into one GenerationRequest. Everything here is untrusted
// input: a wrong type, an out-of-range value, an unknown or unsupported parameter or bad JSON throws
// ApiError with the HTTP status and a message that names the parameter and what was expected.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

enum class ApiKind { ChatCompletions, Completions, AnthropicMessages };
const char* api_kind_name(ApiKind k);  // "chat.completions", "completions", "messages"

// A 4xx/5xx answer. `type` follows each API's error vocabulary (invalid_request_error, ...);
// `param` names the offending request field when there is one; `code` is OpenAI's error code
// (e.g. context_length_exceeded) or empty.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;
  std::string code;
};

struct ChatMessage {
  std::string role;     // system | user | assistant (developer maps to system)
  std::string content;  // text parts joined
};

struct SamplingOptions {
  float temperature = 1.0f;        // 0 = greedy
  float top_p = 1.0f;              // (0, 1]
  int32_t top_k = 0;               // 0 = off
  float min_p = 0.0f;              // [0, 1]
  float repeat_penalty = 1.0f;     // 1 = off (llama.cpp style, multiplicative)
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  std::optional<uint64_t> seed;    // none: the server draws one
};

struct GenerationRequest {
  ApiKind kind = ApiKind::ChatCompletions;
  std::string model;                 // as sent (echoed back); may be empty for completions
  bool is_chat = true;               // messages (chat template) vs raw prompt
  std::vector<ChatMessage> messages;
  std::string prompt;                // completions: raw text
  std::optional<int32_t> max_tokens; // none: until EOS or the context is full
  std::vector<std::string> stop;     // stop strings (not included in the output)
  bool stream = false;
  bool include_usage = false;        // OpenAI stream_options.include_usage
  bool echo = false;                 // completions: prepend the prompt to the text
  bool ignore_eos = false;           // extension (as llama.cpp): never sample end-of-generation
  SamplingOptions sampling;
};

// Parses a request body for `kind`. Throws ApiError (status 400) on any problem. The request's sampling starts
// from `defaults` (the server's own: `strata serve --temp/--top-k/...`; the API's when none is given) and each
// field the request names replaces its default.
GenerationRequest parse_generation_request(ApiKind kind, std::string_view body, const SamplingOptions& defaults = {});

// strata::Error naming the first server default outside the range a request may send (temperature [0, 2],
// top_p (0, 1], top_k [0, 2^20], min_p [0, 1], repeat_penalty (0, 10], presence and frequency penalties [-2, 2]).
void check_sampling_defaults(const SamplingOptions& s);

}  // namespace strata::server
