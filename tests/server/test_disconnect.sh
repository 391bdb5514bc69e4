#!/usr/bin/env bash
# A client that goes away mid-generation (streaming and not): the request is cancelled, its
# sequence stops and frees its KV, and the server keeps serving.
source "$(dirname "$0")/common.sh"
CTX=8192 start_server --parallel 2 --park-mb 0
LONGREQ='{"prompt":"Tell me everything","max_tokens":8000,"temperature":0.7,"ignore_eos":true}'
for mode in stream plain; do
  before=$(metric strata_client_disconnects_total)
  gen_before=$(metric strata_generated_tokens_total)
  gen_before=$(metric strata_generated_tokens_total)
  body=$LONGREQ
  [ $mode = stream ] && body='{"prompt":"Tell me everything","max_tokens":8000,"temperature":0.7,"ignore_eos":true,"stream":true}'
  curl -s -N --max-time 0.5 -H 'Content-Type: application/json' -d "$body" "$BASE/v1/completions" > "$WORK/$mode.out" || true
  # curl gave up after 0.5 s (about a quarter of max_tokens at this box's speed); within a moment the server must have noticed.
  ok=0
  for _ in $(seq 1 50); do
    if [ "$(metric strata_sequences_running)" = 0 ] && [ "$(metric strata_client_disconnects_total)" = $((before + 1)) ]; then ok=1; break; fi
    sleep 0.1
  done
  check "$mode: disconnect cancels the request (running $(metric strata_sequences_running), disconnects $before -> $(metric strata_client_disconnects_total))" [ $ok = 1 ]
  check "$mode: its KV is freed (none running, none parked)" [ "$(metric 'strata_kv_bytes{state="running"}')" = 0 ] && [ "$(metric 'strata_kv_bytes{state="parked"}')" = 0 ]
  GEN=$(( $(metric strata_generated_tokens_total) - gen_before ))
  check "$mode: it stopped well before max_tokens ($GEN of 8000 generated)" [ "$GEN" -lt 7000 ]
  [ $mode = stream ] && check "stream: tokens were flowing before the disconnect" grep -q '"text"' "$WORK/stream.out"
done
post /v1/completions '{"prompt":"still there?","max_tokens":4}'
check "server still serves" [ "$STATUS" = 200 ]
finish
