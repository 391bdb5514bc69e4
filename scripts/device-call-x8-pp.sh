#!/usr/bin/env bash
# One device call, best on a warm machine whose /tmp/b a previous call built (else the build comes first,
# ~200 s): Q4_0_X8's pp512 and 25%-resident A/B on a 48-layer Qwen3-30B-A3B-geometry Q4_0 file (session 34
# measured only tg64). Carry [".carry/deps", ".carry/fix"]. Results in $OUT.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-500} - ($(date +%s) - t0) )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; git log --oneline -1; } > $OUT/env.txt 2>&1
timeout 450 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -30 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file: $(tail -n1 $OUT/mkmodel.txt 2>/dev/null)"
METRIC=pp ROUNDS=2 ARM_TIMEOUT=60 timeout $(( $(left) - 120 )) scripts/bench-arms /tmp/b/strata "-m $f --backend cuda --adapt-every 0 --expert-cache 100% -p 512 -n 1 -r 3 --no-roofline" \
  x8off=STRATA_CUDA_Q4_0_X8=0 x8on=STRATA_CUDA_Q4_0_X8=1 > $OUT/arms_pp.txt 2>&1
st "pp arms"; tail -4 $OUT/arms_pp.txt
for r in 1 2; do for a in 0 1; do
  [ "$(left)" -ge 30 ] || break 2
  STRATA_CUDA_Q4_0_X8=$a timeout 50 /tmp/b/strata bench -m $f --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n 32 -r 1 --no-roofline 2>&1 \
    | grep -E "^\| |tg|hit" | sed "s/^/round $r x8=$a /"
done; done | tee $OUT/q40_25.txt
st done
