"""Reads an SSE body (OpenAI or Anthropic) from a file and prints a JSON summary:
{"text": concatenated deltas, "events": [event names], "finish": finish/stop reason, "usage": {...},
 "done": saw data: [DONE], "objects": set of "object" fields}. Exits 1 on malformed framing."""
import json
import sys

body = open(sys.argv[1], encoding="utf-8").read()
if not body.endswith("\n\n"):
    sys.exit("stream does not end with a blank line")
out = {"text": "", "events": [], "finish": None, "usage": None, "done": False, "objects": []}
for block in body.split("\n\n")[:-1]:
    name, data = None, None
    for line in block.split("\n"):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line.startswith(":") or line == "":
            continue
        else:
            sys.exit("bad SSE line: %r" % line)
    if data is None:
        sys.exit("event without data")
    if data == "[DONE]":
        out["done"] = True
        continue
    j = json.loads(data)
    if name is not None:  # Anthropic
        if j["type"] != name:
            sys.exit("event name %s != data.type %s" % (name, j["type"]))
        out["events"].append(name)
        if name == "content_block_delta":
            out["text"] += j["delta"]["text"]
        if name == "message_delta":
            out["finish"] = j["delta"]["stop_reason"]
            out["usage"] = j["usage"]
        if name == "message_start":
            out["start_usage"] = j["message"]["usage"]
        continue
    if "error" in j:
        out["error"] = j["error"]
        continue
    out["objects"].append(j["object"])
    if j.get("usage"):
        out["usage"] = j["usage"]
    for c in j["choices"]:
        if "delta" in c:
            out["text"] += c["delta"].get("content") or ""
        else:
            out["text"] += c.get("text") or ""
        if c.get("finish_reason"):
            out["finish"] = c["finish_reason"]
print(json.dumps(out))
