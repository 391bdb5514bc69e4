#!/usr/bin/python3
"""Reference renderer for chat templates: Debian's python3-jinja2, set up the way HF transformers'
apply_chat_template sets it up (the environment real OpenAI-compatible servers such as vLLM use):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[loopcontrols, AssistantTracker ({% generation %})])
  filters["tojson"]  = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=False)
  globals["raise_exception"] -> TemplateError(message)
  globals["strftime_now"]    -> datetime.now().strftime(fmt)   (here: a fixed UTC time, see "now")

Variables: messages, tools (None when absent), documents (None), add_generation_prompt, bos_token,
eos_token, enable_thinking (only when given), then the case's extra kwargs. Like vLLM, a tool call's
function.arguments that is a JSON-object string is parsed into a dict first.

Usage: jinja_reference.py CASES.json OUT.json
CASES.json: [{"source": template text, "vars": {...}} (rendered with exactly those variables) or
             {"template": path, "messages": [...], "tools": [...]|null, "add_generation_prompt": bool,
              "enable_thinking": bool (optional), "bos_token": str, "eos_token": str,
              "extra": {...}, "now": unix seconds}, ...]
OUT.json:   [{"ok": true, "text": str} | {"ok": false, "error": str}, ...]
"""
import json
import sys
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """HF's {% generation %} block: renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now, timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def normalize(messages):
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("tool_calls"), list):
            for tc in m["tool_calls"]:
                fn = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        parsed = json.loads(fn["arguments"])
                    except ValueError:
                        continue
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
    return messages


def render(case, cache):
    if "source" in case:  # an inline template rendered with exactly the given variables
        return make_env(case.get("now", 0)).from_string(case["source"]).render(**case.get("vars", {}))
    key = (case["template"], case.get("now", 0))
    if key not in cache:
        with open(key[0], encoding="utf-8") as f:
            cache[key] = make_env(key[1]).from_string(f.read())
    tmpl = cache[key]
    ctx = dict(messages=normalize(case["messages"]), tools=case.get("tools"), documents=None,
               add_generation_prompt=case.get("add_generation_prompt", True),
               bos_token=case.get("bos_token", ""), eos_token=case.get("eos_token", ""))
    if "enable_thinking" in case:
        ctx["enable_thinking"] = case["enable_thinking"]
    ctx.update(case.get("extra") or {})
    return tmpl.render(**ctx)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    cache, out = {}, []
    for case in cases:
        try:
            out.append({"ok": True, "text": render(case, cache)})
        except Exception as e:  # any failure of the template is a result to compare
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True)


if __name__ == "__main__":
    main()
