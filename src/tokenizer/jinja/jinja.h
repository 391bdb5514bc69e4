#pragma once
// strata's sandboxed Jinja interpreter for chat templates (public API).
//
//   auto t = jinja::Template::parse(source);          // TemplateError on a syntax error
//   Dict ctx; ctx.set("messages", ...);
//   std::string s = t.render(ctx);                    // TemplateError on a runtime error
//
// Semantics follow jinja2 3.1 as HF transformers configures it for chat templates
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson =
// json.dumps(ensure_ascii=False, ...), raise_exception, strftime_now). The sandbox sees only the
// context it is given; attributes starting with '_' (Python internals) are refused; every render
// is bounded in nesting depth, work, output and value sizes (Limits).
//
// Known differences from jinja2 (each fails with a clear TemplateError rather than rendering
// differently, except the last two): attributes starting with '_' other than plain dict keys
// (jinja2 yields an "unsafe" undefined), recursive loops, `*args`/`**kwargs` in calls, str.format,
// non-string dict keys, integers beyond int64, {% include/import/extends/block %}, an unknown
// filter/test (jinja2 may reject it at compile time even in a branch never taken), and printing a
// bound method or generator (no stable text in Python either). Upper/lower-casing maps ASCII,
// Latin-1, Latin Extended-A, Greek and Cyrillic only; jinja2's static scoping is reproduced for
// template-level names (analyze_root), not for names first set inside loop or macro bodies.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace strata::jinja {

struct Limits {
  int max_depth = 1000;             // nested statements/expressions/calls while rendering
  int max_macro_depth = 100;        // nested macro calls (recursion)
  uint64_t max_steps = 10'000'000;  // statements executed + loop iterations + calls, per render
  size_t max_output = 32u << 20;    // bytes of rendered text (and of any captured block)
  size_t max_string = 32u << 20;    // bytes of any single string value
  size_t max_items = 1u << 18;      // elements of any list (range(), repetition, concatenation)
};

struct RenderOptions {
  Limits limits;
  // Time used by strftime_now(), as Unix seconds rendered in UTC. Unset: the env var
  // STRATA_TEMPLATE_NOW (Unix seconds, UTC) when set, else the current local time.
  std::optional<int64_t> now_unix;
};

struct Stmt;

class Template {
 public:
  static Template parse(std::string_view source);
  // Renders with `context` as the template's variables (plus the builtin globals).
  std::string render(const Dict& context, const RenderOptions& opt = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
  std::shared_ptr<const std::vector<std::string>> root_undefined_;  // see analyze_root (interpreter.cpp)
};

}  // namespace strata::jinja
