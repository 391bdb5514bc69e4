#!/usr/bin/env bash
# The official `openai` npm package (v4) against the real server. The package is installed at test
# time into the build folder (idempotent: skipped when already there), never vendored.
source "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
export OPENAI_NPM_DIR="$STRATA_BINARY_DIR/npm"
if [ ! -f "$OPENAI_NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$OPENAI_NPM_DIR"
  npm install --prefix "$OPENAI_NPM_DIR" --no-audit --no-fund --loglevel=error openai@4 >&2
fi
start_server --parallel 2 --api-key k-123
if node "$HERE/openai_client.mjs" "$BASE" k-123; then pass "openai client"; else fail "openai client"; fi
finish
