// `strata template`: renders a chat template (from a GGUF's tokenizer.chat_template, or a .jinja
// file) for a conversation and prints the prompt exactly as the model would receive it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/command.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"

namespace strata::cli {
namespace {

using json = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream f(path, std::ios::binary);
  STRATA_REQUIRE(f.good(), "cannot open '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  STRATA_REQUIRE(!j.is_discarded(), "{}: not valid JSON", what);
  return j;
}

struct Options {
  std::string model, template_file, messages_file, tools_file, kwargs, thinking, bos, eos;
  bool no_generation_prompt = false;
};

int run(const Options& o) {
  STRATA_REQUIRE(!o.model.empty() || !o.template_file.empty(), "give a model (-m MODEL.gguf) or --template FILE.jinja");
  std::optional<ChatTemplate> tmpl;
  if (!o.template_file.empty()) {
    tmpl.emplace(read_text(o.template_file), o.bos, o.eos);
  } else {
    auto f = gguf::File::open(o.model);
    tmpl.emplace(ChatTemplate::from_gguf(f));
    if (!o.bos.empty() || !o.eos.empty())
      tmpl.emplace(tmpl->source(), o.bos.empty() ? tmpl->bos_token() : o.bos, o.eos.empty() ? tmpl->eos_token() : o.eos);
  }

  ChatRequest req;
  json m = parse_json(read_text(o.messages_file), o.messages_file);
  if (m.is_object()) {  // an OpenAI chat request body
    STRATA_REQUIRE(m.contains("messages"), "{}: a JSON object needs a \"messages\" array", o.messages_file);
    req.messages = m["messages"];
    if (m.contains("tools")) req.tools = m["tools"];
    if (m.contains("chat_template_kwargs")) req.extra = m["chat_template_kwargs"];
  } else {
    req.messages = m;
  }
  STRATA_REQUIRE(req.messages.is_array(), "{}: messages must be a JSON array", o.messages_file);
  if (!o.tools_file.empty()) req.tools = parse_json(read_text(o.tools_file), o.tools_file);
  if (!o.kwargs.empty()) {
    json k = parse_json(o.kwargs, "--kwargs");
    STRATA_REQUIRE(k.is_object(), "--kwargs must be a JSON object");
    for (auto it = k.begin(); it != k.end(); ++it) req.extra[it.key()] = it.value();
  }
  req.add_generation_prompt = !o.no_generation_prompt;
  if (o.thinking == "on") req.enable_thinking = true;
  if (o.thinking == "off") req.enable_thinking = false;

  std::string prompt = tmpl->render(req);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

const CommandRegistrar reg(
    "template", "Render a chat template for a conversation and print the prompt", [](CLI::App& sub) {
      auto o = std::make_shared<Options>();
      auto* m = sub.add_option("-m,--model", o->model, "GGUF model whose tokenizer.chat_template is used");
      auto* t = sub.add_option("--template", o->template_file, "Jinja template file instead of a model's");
      m->excludes(t);
      sub.add_option("--messages", o->messages_file,
                     "JSON file ('-' = stdin): a messages array, or an OpenAI request {messages, tools, "
                     "chat_template_kwargs}")
          ->required();
      sub.add_option("--tools", o->tools_file, "JSON file with the tools array");
      sub.add_flag("--no-generation-prompt", o->no_generation_prompt, "Do not open an assistant turn at the end");
      sub.add_option("--thinking", o->thinking, "Pass enable_thinking=true/false to the template")
          ->check(CLI::IsMember({"on", "off"}));
      sub.add_option("--kwargs", o->kwargs, "Extra template variables as a JSON object, e.g. '{\"reasoning_effort\":\"low\"}'");
      sub.add_option("--bos", o->bos, "bos_token string (default: the model's; empty with --template)");
      sub.add_option("--eos", o->eos, "eos_token string (default: the model's; empty with --template)");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace strata::cli
