#!/usr/bin/env bash
# Where a fully resident decode layer's time goes on today's defaults (the last per-kernel trace is session
# 24's, on an H200; the chain has changed since): a -DSTRATA_PDL_TRACE=ON build of strata into /tmp/bt, the
# greedy chained decode of the 48-layer Q4_0 file (tg64, contexts to 64) and at contexts to 512 (tg512), each
# traced, and scripts/pdl-trace-report's per-kernel steps, marks and block ends. For the next lead on the
# greedy chain (the 3x goal; session 50 closed the fused q|k|v + attention launch). Best as a second call on a
# warm machine after scripts/device-call-next.sh (its /tmp/b untouched).
# The device tool: run "bash scripts/device-call-trace.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
BUILD_DIR=/tmp/bt STRATA_CMAKE_ARGS="-DSTRATA_PDL_TRACE=ON" . scripts/device-call-start strata
m=$(scripts/device-model-30b $B/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
for n in 64 512; do
  STRATA_PDL_TRACE_FILE=$OUT/trace-tg$n.csv timeout 120 $B/strata bench -m $m --backend cuda --adapt-every 0 \
    --expert-cache 100% -p 0 -n $n -r 2 --no-roofline --tg-mode chain > $OUT/bench-tg$n.txt 2>&1
  echo "tg$n traced: $(awk '/^tg/ {print $2; exit}' $OUT/bench-tg$n.txt) tok/s" | tee -a $OUT/log.txt
  python3 scripts/pdl-trace-report $OUT/trace-tg$n.csv > $OUT/report-tg$n.txt 2>&1
  rm -f $OUT/trace-tg$n.csv  # (large; the report is what comes back)
  head -60 $OUT/report-tg$n.txt | tee -a $OUT/log.txt
done
st done | tee -a $OUT/log.txt
