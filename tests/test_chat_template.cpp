// Every real chat template in fixtures/templates renders byte-identical to the reference
// (Debian's python3-jinja2 in HF transformers' environment: tests/jinja_reference.py) for a set of
// conversations x tools on/off x generation prompt on/off x enable_thinking unset/true/false x extra
// kwargs. When the reference raises, strata must raise too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tokenizer/chat_template.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr int64_t kNow = 1735732800;  // 2025-01-01 12:00:00 UTC: strftime_now() in both renderers

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<fs::path> fixture_templates() {
  std::vector<fs::path> out;
  for (auto& e : fs::directory_iterator(fs::path(STRATA_FIXTURES_DIR) / "templates"))
    if (e.path().extension() == ".jinja") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

struct Case {
  json request;  // as jinja_reference.py reads it
  std::string label;
};

std::vector<Case> build_cases(const std::vector<fs::path>& templates) {
  json data = json::parse(read_file(fs::path(STRATA_SOURCE_DIR) / "tests/data/chat_conversations.json"));
  std::vector<Case> cases;
  for (auto& t : templates)
    for (auto& [name, messages] : data["conversations"].items())
      for (bool with_tools : {false, true})
        for (bool gen : {true, false})
          for (int thinking : {-1, 0, 1})
            for (size_t x = 0; x < data["extras"].size(); ++x) {
              json r;
              r["template"] = t.string();
              r["messages"] = messages;
              r["tools"] = with_tools ? data["tools"] : json(nullptr);
              r["add_generation_prompt"] = gen;
              if (thinking >= 0) r["enable_thinking"] = thinking == 1;
              r["bos_token"] = "<|bos|>";
              r["eos_token"] = "<|eos|>";
              r["extra"] = data["extras"][x];
              r["now"] = kNow;
              std::string label = t.filename().string() + " / " + name + (with_tools ? " +tools" : "") +
                                  (gen ? " +gen" : " -gen") +
                                  (thinking < 0 ? "" : thinking ? " thinking=on" : " thinking=off") +
                                  (x ? " +extra" + std::to_string(x) : "");
              cases.push_back({std::move(r), std::move(label)});
            }
  return cases;
}

}  // namespace

TEST(ChatTemplateReference, FixtureTemplatesMatchPythonJinja2) {
  auto templates = fixture_templates();
  ASSERT_EQ(templates.size(), 8u) << "expected the 8 real templates in fixtures/templates";
  auto cases = build_cases(templates);

  fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(dir);
  fs::path in_path = dir / "jinja_cases.json", out_path = dir / "jinja_reference_out.json";
  {
    json all = json::array();
    for (auto& c : cases) all.push_back(c.request);
    std::ofstream(in_path) << all.dump();
  }
  fs::remove(out_path);
  std::string cmd = "/usr/bin/python3 '" + (fs::path(STRATA_SOURCE_DIR) / "tests/jinja_reference.py").string() +
                    "' '" + in_path.string() + "' '" + out_path.string() + "'";
  int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "reference renderer failed (is python3-jinja2 installed? scripts/bootstrap): " << cmd;
  json ref = json::parse(read_file(out_path));
  ASSERT_EQ(ref.size(), cases.size());

  std::map<std::string, std::unique_ptr<strata::ChatTemplate>> compiled;
  std::map<std::string, int> rendered_ok, total;
  int same_text = 0, same_error = 0, mismatches = 0;
  strata::jinja::RenderOptions opt;
  opt.now_unix = kNow;
  for (size_t k = 0; k < cases.size(); ++k) {
    const json& r = cases[k].request;
    const std::string tpath = r["template"];
    if (!compiled.count(tpath))
      compiled[tpath] = std::make_unique<strata::ChatTemplate>(read_file(tpath), "<|bos|>", "<|eos|>");
    strata::ChatRequest req;
    req.messages = r["messages"];
    req.tools = r["tools"];
    req.add_generation_prompt = r["add_generation_prompt"];
    if (r.contains("enable_thinking")) req.enable_thinking = r["enable_thinking"].get<bool>();
    req.extra = r["extra"];
    std::string text, error;
    bool ok = true;
    try {
      text = compiled[tpath]->render(req, opt);
    } catch (const strata::jinja::TemplateError& e) {
      ok = false;
      error = e.what();
    }
    const json& want = ref[k];
    ++total[tpath];
    if (want["ok"].get<bool>()) {
      ++rendered_ok[tpath];
      if (!ok) {
        ADD_FAILURE() << cases[k].label << ": python rendered, strata raised: " << error;
        ++mismatches;
      } else if (text != want["text"].get<std::string>()) {
        ADD_FAILURE() << cases[k].label << ": output differs\n--- python:\n"
                      << want["text"].get<std::string>() << "\n--- strata:\n" << text;
        ++mismatches;
      } else {
        ++same_text;
      }
    } else if (ok) {
      ADD_FAILURE() << cases[k].label << ": python raised (" << want["error"].get<std::string>()
                    << ") but strata rendered:\n" << text;
      ++mismatches;
    } else {
      ++same_error;
    }
    if (mismatches > 20) FAIL() << "too many mismatches, stopping";
  }
  // The comparison means something only if most cases render (not all raise).
  for (auto& [t, n] : total) EXPECT_GE(rendered_ok[t] * 2, n) << t << ": the reference raised for most cases";
  std::printf("[chat templates] %zu cases over %zu templates: %d byte-identical renders, %d raised in both\n",
              cases.size(), templates.size(), same_text, same_error);
}
