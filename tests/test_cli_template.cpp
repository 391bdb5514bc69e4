// `strata template` and ChatTemplate::from_gguf: the template and BOS/EOS come from the GGUF,
// and the CLI prints exactly what the library renders.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_run.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

using CliRun = strata::test::CliOut;
CliRun run_cli(const std::string& args) { return strata::test::run_strata(args); }

const fs::path kVocab = fs::path(STRATA_FIXTURES_DIR) / "vocab/ggml-vocab-qwen2.gguf";

fs::path write_tmp(const std::string& name, const std::string& text) {
  fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << text;
  return dir / name;
}

const char* kMessages = R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
   "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "ok"}])";

}  // namespace

TEST(ChatTemplateGguf, TemplateAndSpecialTokensComeFromTheFile) {
  auto f = strata::gguf::File::open(kVocab.string());
  auto t = strata::ChatTemplate::from_gguf(f);
  EXPECT_EQ(t.source(), f.get<std::string>("tokenizer.chat_template"));
  auto tokens = f.get_array<std::string>("tokenizer.ggml.tokens");
  EXPECT_EQ(t.eos_token(), tokens.at(f.get<uint32_t>("tokenizer.ggml.eos_token_id")));
  if (f.has("tokenizer.ggml.bos_token_id"))
    EXPECT_EQ(t.bos_token(), tokens.at(f.get<uint32_t>("tokenizer.ggml.bos_token_id")));
  strata::ChatRequest req;
  req.messages = json::parse(kMessages);
  std::string out = t.render(req);
  EXPECT_NE(out.find("<|im_start|>user\nHi ü<|im_end|>"), std::string::npos) << out;
}

TEST(ChatTemplateGguf, MissingTemplateIsAClearError) {
  auto f = strata::gguf::File::open((fs::path(STRATA_FIXTURES_DIR) / "formats/zoo.gguf").string());
  try {
    strata::ChatTemplate::from_gguf(f);
    FAIL() << "expected an error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos) << e.what();
  }
}

TEST(CliTemplate, PrintsExactlyTheLibraryRendering) {
  fs::path msgs = write_tmp("cli_messages.json", kMessages);
  auto f = strata::gguf::File::open(kVocab.string());
  auto t = strata::ChatTemplate::from_gguf(f);
  strata::ChatRequest req;
  req.messages = json::parse(kMessages);
  CliRun r = run_cli("template -m '" + kVocab.string() + "' --messages '" + msgs.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, t.render(req));

  // --template with a fixture file, no generation prompt, thinking off, tools, extra kwargs
  fs::path tpl = fs::path(STRATA_FIXTURES_DIR) / "templates/Qwen3.5-4B.jinja";
  std::ifstream in(tpl);
  std::stringstream ss;
  ss << in.rdbuf();
  strata::ChatTemplate t2(ss.str());
  json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  fs::path tools_path = write_tmp("cli_tools.json", tools.dump());
  strata::ChatRequest req2;
  req2.messages = json::parse(kMessages);
  req2.tools = tools;
  req2.add_generation_prompt = false;
  req2.enable_thinking = false;
  req2.extra = json::parse(R"({"add_vision_id": true})");
  r = run_cli("template --template '" + tpl.string() + "' --messages '" + msgs.string() + "' --tools '" +
              tools_path.string() + "' --no-generation-prompt --thinking off --kwargs '{\"add_vision_id\": true}'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, t2.render(req2));

  // an OpenAI request body works as the messages file
  json body = {{"messages", json::parse(kMessages)}, {"tools", tools}};
  fs::path body_path = write_tmp("cli_body.json", body.dump());
  r = run_cli("template --template '" + tpl.string() + "' --messages '" + body_path.string() + "' --tools '" +
              tools_path.string() + "' --no-generation-prompt --thinking off --kwargs '{\"add_vision_id\": true}'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, t2.render(req2));
}

TEST(CliTemplate, BadInputGivesAnErrorNotACrash) {
  fs::path msgs = write_tmp("cli_messages2.json", kMessages);
  CliRun r = run_cli("template --template /nonexistent.jinja --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("strata: error:"), std::string::npos) << r.out;
  fs::path bad = write_tmp("cli_bad.jinja", "{% for x in messages %}{{ x.role ");
  r = run_cli("template --template '" + bad.string() + "' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("template line 1"), std::string::npos) << r.out;
  fs::path raising = write_tmp("cli_raise.jinja", "{{ raise_exception('roles must alternate') }}");
  r = run_cli("template --template '" + raising.string() + "' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("roles must alternate"), std::string::npos) << r.out;
  fs::path notjson = write_tmp("cli_notjson.json", "[{");
  r = run_cli("template --template '" + raising.string() + "' --messages '" + notjson.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;
}
