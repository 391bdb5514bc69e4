#!/usr/bin/env bash
# For the session after 43, first device call. Session 43 made copies into a slot move the layer's expert
# (ExpertLayerView::expert_bytes) instead of the whole slot; its device time ran out after 16 of the GPU
# tests of that change (one failure, on the test's own line bookkeeping, fixed since). Steps: the build
# (strata, the GPU tests); the change's tests with the stream checker (the expert cache, the MoE kernels'
# direct fetch, the model-level direct-read / streaming / gated / cache-size / CPU-pool prefill tests,
# Q6_KPGpu); then the rest of the GPU suite; then, with time left, on the 48-layer Q4_K_M file: moe_down's
# slots kernel for one token of Q6_K_P down (STRATA_CUDA_Q8_DOWN=one-q6kp) against the default, alternating,
# and tg64 at 25% resident (two runs; compare with bench/results/2026-12-06-gpu-session43-h100.md).
# LIMIT=S (default 585) bounds every step.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
timeout 300 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
first='ExpertCacheGpu.*:CudaMoe.*:Qwen3MoeGpuDirect.*:Qwen3MoeGpuStreaming.*:Qwen3MoeGpuGated.*:*ExpertCacheSizesAgree*:*ChunkedPrefillWithCpuPool*:Q6_KPGpu.*'
STRATA_STREAM_CHECK=1 GTEST_FILTER=$first timeout $(( $(left) - 100 )) /tmp/b/tests/strata_cuda_tests > $OUT/tests-first.txt 2>&1
echo "rc=$?" >> $OUT/tests-first.txt
st "first tests"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests-first.txt | head -20
[ $(left) -gt 100 ] && STRATA_STREAM_CHECK=1 GTEST_FILTER="-$first" timeout $(( $(left) - 90 )) \
  /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "the rest of the suite"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -20
[ $(left) -gt 80 ] || exit 0
f=$(timeout 60 scripts/device-model-30b /tmp/b/strata Q4_K_M .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
a="-m $f --backend cuda --adapt-every 0 -p 0 -n 64 -r 2 --no-roofline --parallel 1"
# moe_down's slots kernel for one token of Q6_K_P down too (STRATA_CUDA_Q8_DOWN=one-q6kp) against the default
[ $(left) -gt 110 ] && ROUNDS=3 ARM_TIMEOUT=40 timeout $(( $(left) - 70 )) scripts/bench-arms /tmp/b/strata \
  "$a --expert-cache 100%" default=- one-q6kp=STRATA_CUDA_Q8_DOWN=one-q6kp 2>&1 | tee $OUT/arms.txt | tail -4
a="$a --expert-cache 25%"
for r in 1 2; do
  [ $(left) -gt 20 ] && timeout 30 /tmp/b/strata bench $a > $OUT/full25-$r.txt 2>&1
  grep -E "direct reads, |tg64" $OUT/full25-$r.txt
done
st done
