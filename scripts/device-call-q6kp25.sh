#!/usr/bin/env bash
# Session 43, second device call: why Q6_K_P down lost at 25% resident (87.35 -> 82.43 tok/s, P = 1, Q4_K_M
# 48-layer file) while it won at 100% (523 -> 555). One full `strata bench` output per arm (pool time, direct
# pairs, bytes), then alternating arms with direct reads at their default (0.375) and off, and at 50%.
# The device tool: run "bash scripts/device-call-q6kp25.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
timeout 450 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built
f=$(timeout 150 scripts/device-model-30b /tmp/b/strata Q4_K_M .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st model
a="-m $f --backend cuda --adapt-every 0 -p 0 -n 64 -r 2 --no-roofline --parallel 1"
for v in 0 1; do
  STRATA_CUDA_Q6_K_P_DOWN=$v timeout 60 /tmp/b/strata bench $a --expert-cache 25% > $OUT/full25-$v.txt 2>&1
done
st full
for arm in "25% 0.375 3" "25% off 2" "50% 0.375 2"; do
  set -- $arm
  [ $(left) -gt 60 ] || break
  ROUNDS=$3 ARM_TIMEOUT=90 timeout $(( $(left) - 20 )) scripts/bench-arms /tmp/b/strata \
    "$a --expert-cache $1 --decode-direct $2" q6k=STRATA_CUDA_Q6_K_P_DOWN=0 q6kp=STRATA_CUDA_Q6_K_P_DOWN=1 2>&1 |
    tee -a $OUT/arms.txt | tail -3
  st "$1 direct $2"
done
st done
