#!/usr/bin/env bash
# scripts/pdl-trace-report on a made-up timeline with known steps: kernels at a.cu:10, b.cu:20, c.cu:30
# return 3, 2 and 4 us apart (A's first block early by 1 us, B's by 0.5, C's not), ten rounds, with a
# 300 us host gap after round 5 (left out). Then a timeline with the last block's waits and marks. Also: a
# malformed line is an error, not a table.
set -euo pipefail
report=${STRATA_SOURCE_DIR:?}/scripts/pdl-trace-report
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t=1000000
for r in $(seq 1 10); do
  echo "/x/a.cu,10,$((t - 1000)),$t"
  echo "/x/b.cu,20,$((t + 2500)),$((t + 3000))"
  echo "/x/c.cu,30,$((t + 5000)),$((t + 5000))"
  t=$((t + 9000))
  if [ "$r" = 5 ]; then t=$((t + 300000)); fi
done | sort -R > "$tmp/trace.csv"   # (order in the file does not matter)
out=$(python3 "$report" "$tmp/trace.csv")
echo "$out"
check() {  # site calls step early
  echo "$out" | awk -v s="$1" -v n="$2" -v st="$3" -v e="$4" \
    '$1 == s { found = 1; if ($2 != n || $3 != st || $7 != e) { print "bad row: " $0; exit 1 } }
     END { if (!found) { print "no row for " s; exit 1 } }'
}
check a.cu:10 10 3.00 1.00
check b.cu:20 10 2.00 0.50
check c.cu:30 8 4.00 0.00   # the last round has no next kernel; round 5's step is the host gap
echo "$out" | grep -q "^30 waits recorded$"

# The 5-field records of a build with marks: b's last block reaches its wait 0.2 us after block 0's wait
# returned (kind 3), and b marks its end 1.5 us (block 0, kind 1) and 1.8 us (last block, kind 2) after.
t=1000000
for r in $(seq 1 4); do
  echo "/x/a.cu,10,$((t - 1000)),$t,0"
  echo "/x/b.cu,20,$((t + 2500)),$((t + 3000)),0"
  echo "/x/b.cu,20,$((t + 3200)),$((t + 3210)),3"
  echo "/x/b.cu,25,$((t + 4500)),$((t + 4500)),1"
  echo "/x/b.cu,25,$((t + 4800)),$((t + 4800)),2"
  t=$((t + 9000))
done > "$tmp/marks.csv"
out=$(python3 "$report" "$tmp/marks.csv")
echo "$out"
echo "$out" | awk '$1 == "b.cu:20" { found = 1; if ($8 != "-0.20") { print "bad last early: " $0; exit 1 } }
                   END { if (!found) exit 1 }'
echo "$out" | awk '$1 == "b.cu:25" && $2 == "0" { z = ($3 == 4 && $4 == "1.50") }
                   $1 == "b.cu:25" && $2 == "last" { l = ($3 == 4 && $4 == "1.80") }
                   END { if (!z || !l) { print "bad mark rows"; exit 1 } }'
echo "$out" | grep -q "^8 waits recorded$"

# Block-end histograms (kind 5: bucket, blocks): 100 blocks of b.cu:25, 50 ending in bucket 3 (0.75-1.00
# us after their wait), 40 in 7, 9 in 11 and one in the last bucket (later than 31.75 us).
{ cat "$tmp/marks.csv"
  echo "/x/b.cu,25,3,50,5"; echo "/x/b.cu,25,7,30,5"; echo "/x/b.cu,25,7,10,5"; echo "/x/b.cu,25,11,9,5"
  echo "/x/b.cu,25,127,1,5"; } > "$tmp/ends.csv"
out=$(python3 "$report" "$tmp/ends.csv")
echo "$out"
echo "$out" | sed -n '/^block ends/,$p' | awk '$1 == "b.cu:25" { found = 1
    if ($2 != 100 || $3 != "1.00" || $4 != "2.00" || $5 != "3.00" || $6 != ">31.75") {
      print "bad end row: " $0; exit 1 } }
  END { if (!found) { print "no end row"; exit 1 } }'
echo "$out" | grep -q "^8 waits recorded$"
echo "/x/b.cu,25,128,1,5" > "$tmp/bad_bucket.csv"
if python3 "$report" "$tmp/bad_bucket.csv" 2> "$tmp/err"; then echo "a bucket out of range was accepted"; exit 1; fi
grep -q "bad_bucket.csv:1: bucket 128 out of range" "$tmp/err"

echo "/x/a.cu,10,5" > "$tmp/bad.csv"
if python3 "$report" "$tmp/bad.csv" 2> "$tmp/err"; then echo "a malformed line was accepted"; exit 1; fi
grep -q "bad.csv:1: expected file,line,reached_ns,returned_ns" "$tmp/err"
echo ok
