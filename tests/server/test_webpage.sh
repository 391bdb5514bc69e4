#!/usr/bin/env bash
# The web page in headless Chromium (Debian chromium + chromium-driver, installed by
# scripts/bootstrap): type a message, see a streamed reply, the monitor, and a screenshot
# ($STRATA_BINARY_DIR/server-tests/test_webpage/page.png).
source "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
for b in /usr/bin/chromium /usr/bin/chromedriver node; do
  command -v "$b" > /dev/null || { echo "missing $b: run scripts/bootstrap" >&2; exit 1; }
done
start_server --parallel 2
if node "$HERE/webpage.mjs" "$BASE" "$WORK"; then pass "web page in chromium"; else fail "web page in chromium"; fi
finish
