// The Jinja sandbox: (1) differential test of ~100 snippets covering the language (whitespace
// control, operators, filters, tests, methods, loops, scoping, macros, undefined, errors) against
// python3-jinja2 in HF's environment (tests/jinja_reference.py); (2) sandbox limits; (3) errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/jinja.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using strata::jinja::Dict;
using strata::jinja::Template;
using strata::jinja::TemplateError;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Dict vars_of(const json& j) {
  Dict d;
  for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), strata::json_to_value(it.value()));
  return d;
}

std::string render(const std::string& src, const Dict& ctx = {}, const strata::jinja::RenderOptions& opt = {}) {
  return Template::parse(src).render(ctx, opt);
}

// The error message of rendering `src` ("" when it renders).
std::string error_of(const std::string& src, const Dict& ctx = {}, const strata::jinja::RenderOptions& opt = {}) {
  try {
    render(src, ctx, opt);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JinjaReference, SnippetsMatchPythonJinja2) {
  json data = json::parse(read_file(fs::path(STRATA_SOURCE_DIR) / "tests/data/jinja_snippets.json"));
  const json& snippets = data["snippets"];
  fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(dir);
  fs::path in_path = dir / "jinja_snippets_cases.json", out_path = dir / "jinja_snippets_out.json";
  json cases = json::array();
  for (auto& s : snippets) cases.push_back({{"source", s}, {"vars", data["vars"]}});
  std::ofstream(in_path) << cases.dump();
  fs::remove(out_path);
  std::string cmd = "/usr/bin/python3 '" + (fs::path(STRATA_SOURCE_DIR) / "tests/jinja_reference.py").string() +
                    "' '" + in_path.string() + "' '" + out_path.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference renderer failed (python3-jinja2 installed?): " << cmd;
  json ref = json::parse(read_file(out_path));
  ASSERT_EQ(ref.size(), snippets.size());
  Dict ctx = vars_of(data["vars"]);
  int texts = 0, errors = 0;
  for (size_t k = 0; k < snippets.size(); ++k) {
    const std::string src = snippets[k];
    std::string text, error;
    bool ok = true;
    try {
      text = render(src, ctx);
    } catch (const TemplateError& e) {
      ok = false;
      error = e.what();
    }
    if (ref[k]["ok"].get<bool>()) {
      if (!ok)
        ADD_FAILURE() << "snippet " << k << ": " << src << "\npython rendered: " << ref[k]["text"].get<std::string>()
                      << "\nstrata raised: " << error;
      else if (text != ref[k]["text"].get<std::string>())
        ADD_FAILURE() << "snippet " << k << ": " << src << "\n--- python:\n"
                      << ref[k]["text"].get<std::string>() << "\n--- strata:\n" << text;
      else
        ++texts;
    } else if (ok) {
      ADD_FAILURE() << "snippet " << k << ": " << src << "\npython raised: " << ref[k]["error"].get<std::string>()
                    << "\nstrata rendered: " << text;
    } else {
      ++errors;
    }
  }
  std::printf("[jinja snippets] %zu snippets: %d byte-identical, %d raised in both\n", snippets.size(), texts, errors);
}

// ---- sandbox limits: each fails with a clear error instead of hanging or exhausting memory ----
TEST(JinjaSandbox, InfiniteMacroRecursionFails) {
  std::string e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e.find("recursion"), std::string::npos) << e;
}

TEST(JinjaSandbox, HugeRangeFails) {
  std::string e = error_of("{% for i in range(10**9) %}{{ i }}{% endfor %}");
  EXPECT_NE(e.find("range()"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ range(10**9)|length }}").find("exceeds the limit"), std::string::npos);
}

TEST(JinjaSandbox, HugeStringRepeatFails) {
  std::string e = error_of("{{ 'a' * 10**9 }}");
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ 'ab' * 9223372036854775807 }}").find("exceeds the limit"), std::string::npos);
  EXPECT_NE(error_of("{{ [1, 2] * 10**9 }}").find("exceeds the limit"), std::string::npos);
  // doubling a string in a loop hits the string limit long before memory runs out
  EXPECT_NE(error_of("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("exceeds the limit"),
            std::string::npos);
}

// An empty string or list times a huge count is empty at once (as Python's), not a loop of that many
// empty appends (a fuzzer-found hang: the size limits pass because the total is 0).
TEST(JinjaSandbox, EmptySequenceRepeatIsImmediate) {
  EXPECT_EQ(render("{{ ('' * 9223372036854775807) | length }}|{{ ([] * 10**15) | length }}|{{ (() * 10**15) | length }}"),
            "0|0|0");
  EXPECT_EQ(render("{{ ('' * -3) ~ 'x' }}{{ [] * 0 }}"), "x[]");
}

TEST(JinjaSandbox, WorkAndOutputAreBounded) {
  strata::jinja::RenderOptions opt;
  opt.limits.max_steps = 100000;
  std::string e = error_of("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", {}, opt);
  EXPECT_NE(e.find("steps"), std::string::npos) << e;
  opt = {};
  opt.limits.max_output = 1000;
  e = error_of("{% for i in range(2000) %}x{% endfor %}", {}, opt);
  EXPECT_NE(e.find("output exceeds"), std::string::npos) << e;
  // exponential macro fan-out: bounded by steps
  opt = {};
  opt.limits.max_steps = 200000;
  e = error_of("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", {}, opt);
  EXPECT_NE(e.find("steps"), std::string::npos) << e;
}

TEST(JinjaSandbox, InternalsAreUnreachable) {
  for (const char* src : {"{{ ''.__class__ }}", "{{ ''.__class__.__mro__ }}", "{{ d.__class__ }}",
                          "{{ d['__class__'] }}", "{{ range.__globals__ }}", "{{ ns._Namespace__attrs }}",
                          "{{ lst.__len__() }}", "{{ (1).__class__.__subclasses__() }}"}) {
    Dict ctx;
    ctx.set("d", strata::json_to_value(json::parse(R"({"a": 1})")));
    ctx.set("lst", strata::json_to_value(json::parse("[1]")));
    std::string e = error_of(std::string("{% set ns = namespace(a=1) %}") + src, ctx);
    EXPECT_FALSE(e.empty()) << src << " rendered";
    if (std::string(src).find("__") != std::string::npos || std::string(src).find("._") != std::string::npos)
      EXPECT_NE(e.find("unsafe"), std::string::npos) << src << ": " << e;
  }
  // mutating methods exist but refuse to run (immutable sandbox)
  Dict ctx;
  ctx.set("lst", strata::json_to_value(json::parse("[1]")));
  EXPECT_NE(error_of("{{ lst.append(2) }}", ctx).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ {'a': 1}.update({'b': 2}) }}").find("unsafe"), std::string::npos);
}

TEST(JinjaSandbox, DeepNestingIsRejected) {
  std::string deep(5000, '(');
  EXPECT_NE(error_of("{{ " + deep + "1" + std::string(5000, ')') + " }}").find("too deeply"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("too deeply"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(error_of("{{ " + nots + "1 }}").find("too deeply"), std::string::npos);
}

TEST(JinjaSandbox, NamespaceCyclesDoNotLeakOrLoop) {
  // ns.a = ns makes a cycle: printing is bounded, and the render frees it (ASan/LSan in fuzzing).
  std::string e = error_of("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}");
  EXPECT_NE(e.find("nested too deeply"), std::string::npos) << e;
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.a = [ns] %}{{ ns|tojson }}").find("JSON"), std::string::npos);
}

// ---- errors carry positions ----
TEST(JinjaErrors, SyntaxErrorsHaveLineAndColumn) {
  std::string e = error_of("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  EXPECT_NE(e.find("template line 3"), std::string::npos) << e;
  e = error_of("{% for x in y %}");
  EXPECT_NE(e.find("endfor"), std::string::npos) << e;
  e = error_of("ok\n  {{ x.y }}");
  EXPECT_NE(e.find("template line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("'x' is undefined"), std::string::npos) << e;
}

TEST(JinjaErrors, RaiseExceptionMessageReachesTheCaller) {
  std::string e = error_of("{{ raise_exception('Conversation roles must alternate') }}");
  EXPECT_NE(e.find("Conversation roles must alternate"), std::string::npos) << e;
  EXPECT_THROW(Template::parse("\xff\xfe{{ 1 }}"), TemplateError);  // not UTF-8
}

TEST(JinjaDates, StrftimeNowUsesTheFixedTime) {
  strata::jinja::RenderOptions opt;
  opt.now_unix = 1735732800;  // 2025-01-01 12:00:00 UTC
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %b %Y') }}", {}, opt),
            "2025-01-01 12:00 01 Jan 2025");
}

TEST(JinjaSandbox, DeeplyNestedValuesAreRejected) {
  // [[[[...]]]] built in a loop would overflow the stack when printed or freed
  std::string e = error_of(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  EXPECT_NE(e.find("nested deeper"), std::string::npos) << e;
  e = error_of("{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}{% endfor %}");
  EXPECT_NE(e.find("nested deeper"), std::string::npos) << e;
  // 200 levels are fine and print like Python
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}"
                   "{{ ns.x|tojson|length }}"),
            "401");
}

TEST(JinjaSandbox, QuadraticCopyingIsCharged) {
  // s = s ~ x and l = l + [x] in a loop copy O(n^2) bytes: the copies count as work
  strata::jinja::RenderOptions opt;
  opt.limits.max_steps = 200000;
  std::string e = error_of(
      "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'xxxxxxxxxx' %}{% endfor %}", {},
      opt);
  EXPECT_NE(e.find("steps"), std::string::npos) << e;
  e = error_of("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}", {},
               opt);
  EXPECT_NE(e.find("steps"), std::string::npos) << e;
}
