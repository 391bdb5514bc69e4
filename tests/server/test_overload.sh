#!/usr/bin/env bash
# Over --parallel + --max-queue, a request is answered 429 at once with the reason; after the load
# goes away it is served again.
source "$(dirname "$0")/common.sh"
CTX=8192 start_server --parallel 1 --max-queue 1
LONG='{"prompt":"busy","max_tokens":8000,"temperature":0.7,"ignore_eos":true,"stream":true}'
curl -s -N -H 'Content-Type: application/json' -d "$LONG" "$BASE/v1/completions" > "$WORK/a.out" &
A=$!
for _ in $(seq 1 100); do [ "$(metric strata_sequences_running)" = 1 ] && break; sleep 0.05; done
curl -s -N -H 'Content-Type: application/json' -d "$LONG" "$BASE/v1/completions" > "$WORK/b.out" &
B=$!
for _ in $(seq 1 100); do [ "$(metric strata_queue_depth)" = 1 ] && break; sleep 0.05; done
check "one running, one queued" [ "$(metric strata_queue_depth)" = 1 ]
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
check "429 when running and queue are full" [ "$STATUS" = 429 ]
check "429 says why" grep -q 'queue is full (1 waiting, --max-queue 1)' "$WORK/body"
post /v1/messages '{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}'
check "429 on the Anthropic endpoint too, as rate_limit_error" grep -q '"rate_limit_error"' "$WORK/body"
check "rejections counted" [ "$(metric 'strata_requests_total{endpoint="chat.completions",outcome="rejected"}')" = 1 ]
kill $A $B 2>/dev/null || true
wait $A $B 2>/dev/null || true
for _ in $(seq 1 50); do [ "$(metric strata_sequences_running)" = 0 ] && [ "$(metric strata_queue_depth)" = 0 ] && break; sleep 0.1; done
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
check "served again once the load is gone" [ "$STATUS" = 200 ]
finish
