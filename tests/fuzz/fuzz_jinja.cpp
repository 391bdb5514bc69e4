// libFuzzer target for the chat template sandbox (run by scripts/fuzz under ASan+UBSan): arbitrary
// bytes are parsed as a template and rendered with a fixed small conversation under tight limits.
// Every input must render or throw strata::Error (TemplateError); anything else — a crash, a
// sanitizer report, another exception type, a hang, a leak — is a bug.
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi <b>&\"'\\ é 日本 🚀"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello", "reasoning_content": "r"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": [1, 2.5, null, true]}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image_url", "image_url": {"url": "x"}}]}
  ])");
  return m;
}

const nlohmann::ordered_json& tools() {
  static const auto t = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "number"}}},
    "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string src(reinterpret_cast<const char*>(data), size);
  strata::jinja::RenderOptions opt;
  opt.now_unix = 1735732800;
  opt.limits.max_depth = 400;
  opt.limits.max_macro_depth = 40;
  opt.limits.max_steps = 20000;
  opt.limits.max_output = 1 << 20;
  opt.limits.max_string = 1 << 20;
  opt.limits.max_items = 10000;
  try {
    strata::ChatTemplate t(src, "<s>", "</s>");
    strata::ChatRequest req;
    req.messages = messages();
    req.tools = (size & 1) ? tools() : nlohmann::ordered_json();
    req.add_generation_prompt = (size & 2) != 0;
    if (size & 4) req.enable_thinking = (size & 8) != 0;
    std::string out = t.render(req, opt);
    if (out.size() > opt.limits.max_output) __builtin_trap();
  } catch (const strata::Error&) {
    // a clear error is the expected outcome for most inputs
  }
  return 0;
}
