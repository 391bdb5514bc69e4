#!/usr/bin/env bash
# Session 43's third device call: copies into a slot move the layer's expert_bytes, not the whole slot
# (the largest layer's). Steps: an A/B build of strata (ab_old: HEAD's versions of the changed sources;
# make it with `for f in $(git diff --name-only HEAD -- src); do ...`, scripts/device-ab-build), then the GPU
# tests; the tests of the changed paths with the stream checker (the expert cache, the MoE kernels' direct
# fetch, the direct-read / streaming / CPU-pool model tests, Q6_KPGpu); tg64 on the 48-layer Q4_K_M file at
# 25% resident (direct reads copy a pair's expert: 24 of its 48 layers have Q4_K down, ~16% smaller than
# the Q6_K_P-down layers), old / new binaries alternating. LIMIT=S (default 585) bounds every step.
# The device tool: run "bash scripts/device-call-s43b.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
timeout 400 scripts/device-ab-build ab_old /tmp/b .carry/deps > $OUT/build.log 2>&1 &&
  timeout 200 scripts/device-build . /tmp/b .carry/deps strata_cuda_tests >> $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error|Error" $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
tests='ExpertCacheGpu.*:CudaMoe.*:Qwen3MoeGpuDirect.*:Qwen3MoeGpuStreaming.*:Qwen3MoeGpuGated.*:Q6_KPGpu.*:*ExpertCacheSizesAgree*:*ChunkedPrefillWithCpuPool*'
STRATA_STREAM_CHECK=1 GTEST_FILTER=$tests timeout $(( $(left) - 150 )) /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
f=$(timeout 150 scripts/device-model-30b /tmp/b/strata Q4_K_M .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st model
a="-m $f --backend cuda --adapt-every 0 -p 0 -n 64 -r 2 --no-roofline --parallel 1 --expert-cache 25%"
timeout 40 /tmp/b/strata bench $a > $OUT/full25-new.txt 2>&1
grep -E "direct reads|tg64" $OUT/full25-new.txt
[ $(left) -gt 50 ] && ROUNDS=3 ARM_TIMEOUT=60 timeout $(( $(left) - 10 )) scripts/bench-arms /tmp/b/strata "$a" \
  old=BIN=/tmp/b/strata.old new=- 2>&1 | tee $OUT/arms.txt | tail -4
st done
