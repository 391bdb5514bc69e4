#!/usr/bin/env bash
# curl against the real server and model: chat (non-streaming and streaming agree for one seed),
# completions, Anthropic messages with its event sequence, models, metrics, conversation reuse
# reported in usage, and each bad input answered 4xx with a message that names the problem.
source "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
start_server --parallel 2 --api-key test-key
AUTH=(-H 'Authorization: Bearer test-key')

# --- chat, non-streaming vs streaming, sampled with a seed ---
CHAT='{"model":"tiny","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Tell me a story about a cat."}],"max_tokens":40,"temperature":0.9,"top_p":0.95,"seed":1234}'
post /v1/chat/completions "$CHAT" "${AUTH[@]}"
check "chat 200" [ "$STATUS" = 200 ]
cp "$WORK/body" "$WORK/chat.json"
FULL=$(jq_ "$WORK/chat.json" 'd["choices"][0]["message"]["content"]')
check "chat object" [ "$(jq_ "$WORK/chat.json" 'd["object"]')" = chat.completion ]
check "chat usage adds up" [ "$(jq_ "$WORK/chat.json" 'd["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"] == d["usage"]["total_tokens"]')" = True ]
check "chat has cached_tokens field" [ "$(jq_ "$WORK/chat.json" '"cached_tokens" in d["usage"]["prompt_tokens_details"]')" = True ]
check "chat text non-empty" [ -n "$FULL" ]

STREAM=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['stream']=True; d['stream_options']={'include_usage':True}; print(json.dumps(d))" "$CHAT")
curl -sN "${AUTH[@]}" -H 'Content-Type: application/json' -d "$STREAM" "$BASE/v1/chat/completions" > "$WORK/stream.txt"
python3 "$HERE/sse.py" "$WORK/stream.txt" > "$WORK/stream.json"
check "stream ends with [DONE]" [ "$(jq_ "$WORK/stream.json" 'd["done"]')" = True ]
check "stream chunks are chat.completion.chunk" [ "$(jq_ "$WORK/stream.json" 'set(d["objects"])')" = "{'chat.completion.chunk'}" ]
check "stream text == non-stream text (same seed)" [ "$(jq_ "$WORK/stream.json" 'd["text"]')" = "$FULL" ]
check "stream usage == non-stream completion tokens" [ "$(jq_ "$WORK/stream.json" 'd["usage"]["completion_tokens"]')" = "$(jq_ "$WORK/chat.json" 'd["usage"]["completion_tokens"]')" ]
check "same conversation again reuses its KV (cached_tokens > 0)" [ "$(jq_ "$WORK/stream.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens"] > 0')" = True ]

# --- a follow-up turn reuses the whole earlier prompt ---
FOLLOW=$(python3 -c "
import json,sys
d=json.loads(sys.argv[1]); d['messages'].append({'role':'assistant','content':sys.argv[2]})
d['messages'].append({'role':'user','content':'And then?'}); print(json.dumps(d))" "$CHAT" "$FULL")
post /v1/chat/completions "$FOLLOW" "${AUTH[@]}"
check "follow-up 200" [ "$STATUS" = 200 ]
PT1=$(jq_ "$WORK/chat.json" 'd["usage"]["prompt_tokens"]')
check "follow-up reuses at least the first prompt ($PT1 tokens)" [ "$(jq_ "$WORK/body" "d['usage']['prompt_tokens_details']['cached_tokens'] >= $PT1")" = True ]

# --- completions ---
post /v1/completions '{"prompt":"Once upon a time","max_tokens":12,"temperature":0}' "${AUTH[@]}"
check "completions 200" [ "$STATUS" = 200 ]
check "completions object" [ "$(jq_ "$WORK/body" 'd["object"]')" = text_completion ]
check "completions length finish" [ "$(jq_ "$WORK/body" 'd["choices"][0]["finish_reason"]')" = length ]
check "completions 12 tokens" [ "$(jq_ "$WORK/body" 'd["usage"]["completion_tokens"]')" = 12 ]

# --- Anthropic messages, streaming and not ---
MSG='{"model":"tiny","max_tokens":20,"system":"Be brief.","messages":[{"role":"user","content":"Hello"}],"temperature":0}'
post /v1/messages "$MSG" -H 'x-api-key: test-key' -H 'anthropic-version: 2023-06-01'
check "messages 200" [ "$STATUS" = 200 ]
cp "$WORK/body" "$WORK/msg.json"
check "messages type" [ "$(jq_ "$WORK/msg.json" 'd["type"] + "/" + d["role"] + "/" + d["content"][0]["type"]')" = message/assistant/text ]
MSTREAM=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['stream']=True; print(json.dumps(d))" "$MSG")
curl -sN -H 'x-api-key: test-key' -H 'Content-Type: application/json' -d "$MSTREAM" "$BASE/v1/messages" > "$WORK/mstream.txt"
python3 "$HERE/sse.py" "$WORK/mstream.txt" > "$WORK/mstream.json"
check "anthropic event order" python3 -c "
import json,sys
e=json.load(open(sys.argv[1]))['events']
core=[x for x in e if x not in ('ping','content_block_delta')]
assert core==['message_start','content_block_start','content_block_stop','message_delta','message_stop'], e
assert e.count('content_block_delta')>=1, e" "$WORK/mstream.json"
check "anthropic stream text == non-stream text" [ "$(jq_ "$WORK/mstream.json" 'd["text"]')" = "$(jq_ "$WORK/msg.json" 'd["content"][0]["text"]')" ]

# --- models, health, metrics ---
check "models lists the model" [ "$(curl -s "${AUTH[@]}" "$BASE/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')" = tiny-qwen3moe-A-Q8_0 ]
check "health ok" [ "$(curl -s "$BASE/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')" = ok ]
check "metrics count generated tokens" [ "$(metric strata_generated_tokens_total "${AUTH[@]}")" -gt 0 ]
check "metrics count reused tokens" [ "$(metric strata_prompt_tokens_reused_total "${AUTH[@]}")" -gt 0 ]
check "metrics expert cache hit rate (0 on CPU)" [ "$(metric strata_expert_cache_hit_rate "${AUTH[@]}")" = 0 ]

# --- each bad input: status and a message that says what is wrong ---
bad() {  # bad STATUS "fragment" PATH BODY [curl args]
  local want="$1" frag="$2" path="$3" body="$4"; shift 4
  post "$path" "$body" "$@"
  if [ "$STATUS" = "$want" ] && grep -qF -- "$frag" "$WORK/body"; then pass "$want for $path ${body:0:80}"
  else fail "$path $body -> $STATUS $(cat "$WORK/body")"; fi
}
bad 401 "didn't provide an API key" /v1/chat/completions "$CHAT"
bad 401 "Incorrect API key" /v1/chat/completions "$CHAT" -H 'Authorization: Bearer wrong'
bad 400 "could not parse the JSON body" /v1/chat/completions '{"messages": [' "${AUTH[@]}"
bad 400 "Invalid type for 'max_tokens'" /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}' "${AUTH[@]}"
bad 400 "Unrecognized request argument supplied: temprature" /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temprature":1}' "${AUTH[@]}"
bad 400 "Expected a value <= 2" /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":7}' "${AUTH[@]}"
bad 400 "maximum context length is 512 tokens" /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":600}' "${AUTH[@]}"
LONG=$(python3 -c "print('word ' * 2000)")
bad 400 "maximum context length is 512 tokens" /v1/completions "{\"prompt\":\"$LONG\"}" "${AUTH[@]}"
bad 400 "max_tokens" /v1/messages '{"model":"m","messages":[{"role":"user","content":"x"}]}' -H 'x-api-key: test-key'
bad 404 "Unknown path" /v1/embeddings '{"input":"x"}' "${AUTH[@]}"
finish
