# Helpers for the server integration tests (sourced). Each test starts the real `strata serve` on
# 127.0.0.1 with a free port (--port 0; the port is read from the server's start line), talks to it
# with real clients, and stops it. Environment (set by ctest, tests/CMakeLists.txt):
#   STRATA_CLI           path of the strata binary
#   STRATA_FIXTURES_DIR  the reference fixtures (the tiny qwen3moe model)
#   STRATA_BINARY_DIR    the build folder (scratch files, the npm folder)
set -euo pipefail
: "${STRATA_CLI:?}" "${STRATA_FIXTURES_DIR:?}" "${STRATA_BINARY_DIR:?}"
MODEL="$STRATA_FIXTURES_DIR/models/tiny-qwen3moe-A-Q8_0.gguf"
TEST_NAME="$(basename "${BASH_SOURCE[1]}" .sh)"
WORK="$STRATA_BINARY_DIR/server-tests/$TEST_NAME"
rm -rf "$WORK"
mkdir -p "$WORK"
SERVER_PID=""
PORT=""
BASE=""
FAILS=0
PASSES=0

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok: $*"; PASSES=$((PASSES + 1)); }
check() {  # check "what" command...
  local what="$1"; shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
finish() {
  stop_server
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" -eq 0 ]
}

# start_server [extra serve flags...]: starts the server (context $CTX, default 512), waits until
# /health answers 200.
start_server() {
  local log="$WORK/server.log"
  : > "$log"
  "$STRATA_CLI" serve -m "$MODEL" --host 127.0.0.1 --port 0 --ctx "${CTX:-512}" --threads 1 "$@" \
      > "$WORK/server.out" 2> "$log" &
  SERVER_PID=$!
  for _ in $(seq 1 200); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$PORT" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; echo "server died at start" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$PORT" ] || { cat "$log" >&2; echo "server did not start" >&2; exit 1; }
  BASE="http://127.0.0.1:$PORT"
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return 0
    sleep 0.1
  done
  echo "server not healthy" >&2
  exit 1
}

# stop_server: SIGTERM and wait; returns the server's exit code in SERVER_RC.
stop_server() {
  SERVER_RC=""
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    set +e
    wait "$SERVER_PID"
    SERVER_RC=$?
    set -e
  fi
  SERVER_PID=""
}
trap 'if [ -n "$SERVER_PID" ]; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi' EXIT

# post PATH JSON [curl args...] -> body in $WORK/body, status in $STATUS
post() {
  local path="$1" body="$2"; shift 2
  STATUS=$(curl -s -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' \
           "$@" -d "$body" "$BASE$path")
}
jq_() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {'d': d}))" "$@"; }

# metric NAME_WITH_LABELS -> its value from /metrics
metric() { curl -s "$BASE/metrics" "${@:2}" | awk -v n="$1" '$1 == n { print $2 }'; }
