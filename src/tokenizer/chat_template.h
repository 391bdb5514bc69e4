#pragma once
// Chat templates: a model's `tokenizer.chat_template` (Jinja) rendered by strata's sandboxed
// interpreter (src/tokenizer/jinja) with the variables OpenAI-compatible servers pass, the way
// HF transformers' apply_chat_template does:
//   messages               the conversation (OpenAI format: role system/user/assistant/tool,
//                          content string or list of parts, tool_calls, tool_call_id, ...)
//   tools                  list of tool definitions, or none when the request has none
//   documents              none
//   add_generation_prompt  bool
//   bos_token, eos_token   strings (from the GGUF vocabulary)
//   enable_thinking        bool, only when the request sets it (templates test `is defined`)
//   + any extra kwargs (chat_template_kwargs), which override the above.
// Like vLLM, a tool call's `function.arguments` given as a JSON-object string (the OpenAI wire
// format) is parsed into a mapping first, since templates iterate it (`arguments|items`).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tokenizer/jinja/jinja.h"

namespace strata {
namespace gguf {
class File;
}

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null (no tools) or an array
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables
  bool parse_tool_arguments = true;
};

class ChatTemplate {
 public:
  // Throws jinja::TemplateError on a syntax error.
  explicit ChatTemplate(std::string source, std::string bos_token = "", std::string eos_token = "");
  // Reads `tokenizer.chat_template`, and BOS/EOS strings from the token list; throws
  // strata::Error when the file has no chat template.
  static ChatTemplate from_gguf(const gguf::File& f);

  std::string render(const ChatRequest& req, const jinja::RenderOptions& opt = {}) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  std::string source_, bos_, eos_;
  jinja::Template tmpl_;
};

// JSON -> sandbox value (objects keep their order; nesting bounded).
jinja::Value json_to_value(const nlohmann::ordered_json& j);

}  // namespace strata
