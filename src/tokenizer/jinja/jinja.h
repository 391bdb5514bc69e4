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
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

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
};

}  // namespace strata::jinja
