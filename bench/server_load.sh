#!/usr/bin/env bash
# Bounded load run of `strata serve`: 8 concurrent streaming chat clients for SECONDS (default 90;
# the full run is 300: `bench/server_load.sh 300`), no errors allowed, resident memory must stay flat.
# Appends the result to bench/results/server_load.md.
#   bench/server_load.sh [SECONDS] [MODEL] [extra serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-90}
MODEL=${2:-../shared/fixtures/models/tiny-qwen3moe-A-Q8_0.gguf}
shift $(( $# < 2 ? $# : 2 ))
BIN=${STRATA_BIN:-build/strata}
LOG=$(mktemp)
"$BIN" serve -m "$MODEL" --port 0 --parallel 8 --max-queue 16 --ctx 1024 --park-mb 64 "$@" 2> "$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 300); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$LOG"; exit 1; }
set +e
OUT=$(node bench/server_load.mjs "http://127.0.0.1:$PORT" "$PID" 8 "$SECONDS_RUN")
RC=$?
set -e
echo "$OUT"
METRICS=$(curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^strata_(decode_steps_total|decode_batch_tokens_total|parked_evictions_total|prompt_tokens_reused_total|generated_tokens_total) ')
kill -TERM $PID
wait $PID
SRV_RC=$?
{
  echo
  echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
  echo
  echo "Command: \`bench/server_load.sh $SECONDS_RUN $MODEL $*\` (server: --parallel 8 --max-queue 16 --ctx 1024 --park-mb 64)"
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m), model $(basename "$MODEL")"
  echo "Result: $([ $RC = 0 ] && echo PASS || echo FAIL) (load exit $RC), server exit after SIGTERM: $SRV_RC"
  echo
  echo '```json'
  echo "$OUT"
  echo '```'
  echo
  echo 'Server counters at the end:'
  echo '```'
  echo "$METRICS"
  echo '```'
} >> bench/results/server_load.md
exit $RC
