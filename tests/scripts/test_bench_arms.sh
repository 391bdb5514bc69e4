#!/usr/bin/env bash
# scripts/bench-arms with a stand-in for `strata` whose decode rate depends on the arm's switches: the runs
# alternate arm by arm, every run's rate and each arm's median land in the table, a run without a tg line
# is "failed" (left out of the median), METRIC=pp reads the prefill line, BIN= gives an arm its own binary,
# and bad arguments are errors before anything runs.
set -euo pipefail
arms=${STRATA_SOURCE_DIR:?}/scripts/bench-arms
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/strata" <<'FAKE'
#!/usr/bin/env bash
[ "$1" = bench ] || exit 3
echo "$1 ${2:-} ${STAMP:-default}" >> "$(dirname "$0")/calls"
[ "${CRASH:-0}" = 1 ] && { echo "error: boom"; exit 1; }
n=$(wc -l < "$(dirname "$0")/calls")
echo "model: stand-in"
echo "pp512          $((9000 + ${ADD:-0} + n)).25 tok/s"
echo "tg64           $((500 + ${ADD:-0} + n)).50 tok/s"
echo "tg64           1.00 tok/s"
FAKE
chmod +x "$tmp/strata"
out=$(ROUNDS=3 "$arms" "$tmp/strata" "-m x.gguf" base=- fast="ADD=50 STAMP=fast" crash="CRASH=1 STAMP=crash" 2>"$tmp/err")
echo "$out"
# calls: base, fast, crash, base, fast, crash, ...: call n prints 500 + ADD + n
[ "$(sed -n 1p "$tmp/calls")" = "bench -m default" ] && [ "$(sed -n 2p "$tmp/calls")" = "bench -m fast" ] &&
  [ "$(sed -n 3p "$tmp/calls")" = "bench -m crash" ] && [ "$(wc -l < "$tmp/calls")" = 9 ] || { cat "$tmp/calls"; exit 1; }
grep -qx "round 2  fast  555.50" <<<"$out"
grep -qx "round 3  crash  failed" <<<"$out"
grep -qx "| base | (defaults) | 501.50, 504.50, 507.50 | 504.50 |" <<<"$out"
grep -qx "| fast | ADD=50 STAMP=fast | 552.50, 555.50, 558.50 | 555.50 |" <<<"$out"
grep -qx "| crash | CRASH=1 STAMP=crash | failed, failed, failed | - |" <<<"$out"
grep -q "error: boom" "$tmp/err"
# An even count's median is the mean of the middle two.
rm "$tmp/calls"
ROUNDS=2 "$arms" "$tmp/strata" "-m x.gguf" only=- | grep -qx "| only | (defaults) | 501.50, 502.50 | 502.00 |"
# METRIC=pp: the first pp line (prefill) instead.
rm "$tmp/calls"
METRIC=pp ROUNDS=2 "$arms" "$tmp/strata" "-m x.gguf" only=- | grep -qx "| only | (defaults) | 9001.25, 9002.25 | 9001.75 |"
# BIN= runs an arm with another binary (not passed on as a switch).
rm -f "$tmp/calls"
mkdir "$tmp/other" && sed 's/500 +/900 +/' "$tmp/strata" > "$tmp/other/strata" && chmod +x "$tmp/other/strata"
out=$(ROUNDS=1 "$arms" "$tmp/strata" "-m x.gguf" main=- branch="BIN=$tmp/other/strata STAMP=b")
grep -qx "round 1  main  501.50" <<<"$out"
grep -qx "round 1  branch  901.50" <<<"$out"   # (its own calls file: its first call)
[ "$(cat "$tmp/other/calls")" = "bench -m b" ] || { cat "$tmp/other/calls"; exit 1; }
# Bad arguments: exit 2, nothing run.
rm -f "$tmp/calls"
for bad in "noequals" "a=NOTKV" "bad/name=-" "a=BIN=$tmp/nothere"; do
  if "$arms" "$tmp/strata" "-m x" "$bad" 2>/dev/null; then echo "accepted arm '$bad'"; exit 1; fi
done
if ROUNDS=0 "$arms" "$tmp/strata" "-m x" a=- 2>/dev/null; then echo "accepted ROUNDS=0"; exit 1; fi
if METRIC=xx "$arms" "$tmp/strata" "-m x" a=- 2>/dev/null; then echo "accepted METRIC=xx"; exit 1; fi
if "$arms" "$tmp/nothere" "-m x" a=- 2>/dev/null; then echo "accepted a missing binary"; exit 1; fi
[ ! -e "$tmp/calls" ] || { echo "a bad call ran the binary"; exit 1; }
echo "bench-arms: ok"
