// Chat template rendering with the variables of an OpenAI-style request (see chat_template.h).
#include "tokenizer/chat_template.h"

#include "gguf/gguf.h"

namespace strata {

using jinja::Value;
using json = nlohmann::ordered_json;

static Value json_to_value_depth(const json& j, int depth) {
  if (depth > 128) throw Error("JSON nested too deeply for the chat template");
  switch (j.type()) {
    case json::value_t::null: return Value::none();
    case json::value_t::boolean: return Value::boolean(j.get<bool>());
    case json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw Error("JSON integer too large: " + std::to_string(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case json::value_t::number_float: return Value::floating(j.get<double>());
    case json::value_t::string: return Value::string(j.get<std::string>());
    case json::value_t::array: {
      jinja::List items;
      items.reserve(j.size());
      for (auto& x : j) items.push_back(json_to_value_depth(x, depth + 1));
      return Value::make_list(std::move(items));
    }
    case json::value_t::object: {
      auto d = std::make_shared<jinja::Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), json_to_value_depth(it.value(), depth + 1));
      return Value::make_dict(d);
    }
    default: throw Error("unsupported JSON value in chat request");
  }
}

Value json_to_value(const json& j) { return json_to_value_depth(j, 0); }

ChatTemplate::ChatTemplate(std::string source, std::string bos, std::string eos)
    : source_(std::move(source)), bos_(std::move(bos)), eos_(std::move(eos)), tmpl_(jinja::Template::parse(source_)) {}

static std::string token_text(const gguf::File& f, const char* id_key) {
  const gguf::Value* id = f.find(id_key);
  const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
  if (!id || !toks || toks->type != gguf::ValueType::ARRAY || toks->elem_type != gguf::ValueType::STRING) return "";
  uint64_t k;
  switch (id->type) {
    case gguf::ValueType::UINT32:
    case gguf::ValueType::UINT64:
    case gguf::ValueType::UINT16:
    case gguf::ValueType::UINT8: k = id->num.u; break;
    case gguf::ValueType::INT32:
    case gguf::ValueType::INT64:
    case gguf::ValueType::INT16:
    case gguf::ValueType::INT8:
      if (id->num.i < 0) return "";
      k = static_cast<uint64_t>(id->num.i);
      break;
    default: return "";
  }
  return k < toks->arr.size() ? toks->arr[k].str : "";
}

ChatTemplate ChatTemplate::from_gguf(const gguf::File& f) {
  const gguf::Value* t = f.find("tokenizer.chat_template");
  STRATA_REQUIRE(t != nullptr, "{}: no tokenizer.chat_template in the GGUF metadata (use --template FILE)", f.path());
  STRATA_REQUIRE(t->type == gguf::ValueType::STRING, "{}: tokenizer.chat_template is a {}, expected a string",
                 f.path(), gguf::value_type_name(t->type));
  return ChatTemplate(t->str, token_text(f, "tokenizer.ggml.bos_token_id"), token_text(f, "tokenizer.ggml.eos_token_id"));
}

// OpenAI sends tool-call arguments as a JSON string; templates expect a mapping (vLLM parses it).
static json normalize_messages(const json& messages, bool parse_args) {
  STRATA_REQUIRE(messages.is_array(), "messages must be a JSON array, got {}", messages.type_name());
  json out = messages;
  if (!parse_args) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      auto& fn = tc["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      json parsed = json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
  }
  return out;
}

std::string ChatTemplate::render(const ChatRequest& req, const jinja::RenderOptions& opt) const {
  STRATA_REQUIRE(req.tools.is_null() || req.tools.is_array(), "tools must be a JSON array, got {}", req.tools.type_name());
  STRATA_REQUIRE(req.extra.is_object(), "template kwargs must be a JSON object, got {}", req.extra.type_name());
  jinja::Dict ctx;
  ctx.set("messages", json_to_value(normalize_messages(req.messages, req.parse_tool_arguments)));
  ctx.set("tools", json_to_value(req.tools));
  ctx.set("documents", Value::none());
  ctx.set("add_generation_prompt", Value::boolean(req.add_generation_prompt));
  ctx.set("bos_token", Value::string(bos_));
  ctx.set("eos_token", Value::string(eos_));
  if (req.enable_thinking) ctx.set("enable_thinking", Value::boolean(*req.enable_thinking));
  for (auto it = req.extra.begin(); it != req.extra.end(); ++it) ctx.set(it.key(), json_to_value(it.value()));
  return tmpl_.render(ctx, opt);
}

}  // namespace strata
