#!/usr/bin/env bash
# SIGTERM/SIGINT: stop accepting, let in-flight requests finish within --shutdown-timeout, exit 0;
# past the timeout, cancel what is left and still exit 0.
source "$(dirname "$0")/common.sh"

# 1. In-flight requests finish (a non-streaming and a streaming one).
CTX=4096 start_server --parallel 2 --shutdown-timeout 60
curl -s -H 'Content-Type: application/json' -d '{"prompt":"drain","max_tokens":3000,"temperature":0,"ignore_eos":true}' \
  "$BASE/v1/completions" > "$WORK/plain.json" &
P=$!
curl -s -N -H 'Content-Type: application/json' -d '{"prompt":"drain","max_tokens":3000,"temperature":0,"ignore_eos":true,"stream":true}' \
  "$BASE/v1/completions" > "$WORK/stream.txt" &
S=$!
for _ in $(seq 1 100); do [ "$(metric strata_sequences_running)" = 2 ] && break; sleep 0.02; done
check "both running before the signal" [ "$(metric strata_sequences_running)" = 2 ]
kill -TERM "$SERVER_PID"
sleep 0.3
check "no new connections after SIGTERM" [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$BASE/health")" = 000 ]
set +e; wait "$SERVER_PID"; RC=$?; set -e
SERVER_PID=""
wait $P $S || true
check "exit code 0 after drain" [ "$RC" = 0 ]
check "in-flight non-streaming request finished (3000 tokens)" [ "$(jq_ "$WORK/plain.json" 'd["usage"]["completion_tokens"]')" = 3000 ]
check "in-flight stream finished with [DONE]" grep -q 'data: \[DONE\]' "$WORK/stream.txt"
check "log says it drained" grep -q 'SIGTERM received' "$WORK/server.log"

# 2. Past the timeout: cancelled, still exit 0, and promptly.
CTX=16384 start_server --parallel 1 --shutdown-timeout 1
curl -s -N -H 'Content-Type: application/json' -d '{"prompt":"endless","max_tokens":16000,"temperature":0.7,"ignore_eos":true,"stream":true}' \
  "$BASE/v1/completions" > "$WORK/long.txt" &
L=$!
for _ in $(seq 1 100); do [ "$(metric strata_sequences_running)" = 1 ] && break; sleep 0.02; done
T0=$(date +%s.%N)
kill -INT "$SERVER_PID"
set +e; wait "$SERVER_PID"; RC=$?; set -e
SERVER_PID=""
T1=$(date +%s.%N)
wait $L || true
check "exit code 0 after SIGINT with a request cut off" [ "$RC" = 0 ]
check "stopped within the timeout plus a margin ($(python3 -c "print(round($T1-$T0,2))") s)" python3 -c "assert $T1 - $T0 < 5"
check "the cut-off stream was told why" grep -q 'cancelled before it finished' "$WORK/long.txt"
finish
