#!/usr/bin/env bash
# For the session after 41, first device call. Session 41 made three defaults from arms run with switches
# (bench/results/2026-12-06-gpu-session41-h100.md) that never ran together as a default build:
#   * moe_down's slots kernel for one-token calls (STRATA_CUDA_Q8_DOWN: term / slots force either);
#   * the persistent tensor-core matvec for 4..7 tokens (STRATA_CUDA_Q8_MMA=3; 1 was the default);
#   * the matvec's cp.async staging and the deep sampler (tests passed, arms measured).
# Steps: the build and the model / q8 GPU tests (stream checker on); strata bench --parallel arms on the
# 48-layer Q4_0 file, the defaults against the old settings, alternating (P = 1: down slots vs term; P = 4,
# 6: mma 3 vs 1; P = 2, 8 for scale); the rest of the GPU suite; the arms again. LIMIT=S (default 585) bounds
# every step (a fresh H100 built in 190-264 s in session 41).
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
first='Qwen3MoeGpu*:CudaQ8Moe.*:CudaQ8Matvec.*:CudaFoldedRouter.*:GpuOps.Sample*'
TESTS=$first TESTS_OUT=tests-first.txt bash scripts/device-call-suite.sh || exit 1  # the build, those tests
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
arm() {  # P DOWN(default|term) MMA(default|1)
  local env=()
  [ "$2" = term ] && env+=(STRATA_CUDA_Q8_DOWN=term)
  [ "$3" = 1 ] && env+=(STRATA_CUDA_Q8_MMA=1)
  env "${env[@]}" /tmp/b/strata bench -m "$f" --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 -r 2 \
    --parallel $1 --no-roofline 2>&1 | grep -E "^tg" | sed "s/^/P=$1 down=$2 mma=$3 /"
}
round() {
  for a in "1 default default" "1 term default" "4 default default" "4 default 1" "6 default default" \
           "6 default 1" "2 default default" "8 default default"; do
    [ $(left) -gt 15 ] || return
    timeout $(left) bash -c "$(declare -f arm); f=$f; arm $a"
  done
}
round 2>&1 | tee $OUT/parallel.txt
st "round 1"
[ $(left) -gt 60 ] && STRATA_STREAM_CHECK=1 GTEST_FILTER="-$first" timeout $(( $(left) - 10 )) \
  /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "the rest of the suite"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
round 2>&1 | tee -a $OUT/parallel.txt
st done
