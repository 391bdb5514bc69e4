#!/usr/bin/env bash
# For the session after 40, first device call. Off by default until they run here (all built without a GPU):
#   * session 39: the persistent, double-buffered tensor-core q8 matvec (STRATA_CUDA_Q8_MMA=2; mode 1, the
#     default, is the tile kernel for n >= 8); the fused router for batches of up to 8 tokens
#     (STRATA_CUDA_FUSED_ROUTER_TOKENS=8 with the warp-parallel routing, STRATA_CUDA_ROUTE_PARALLEL=1: its test
#     passed in session 40); the deep sampler (serve arms in scripts/device-call-next2.sh);
#   * session 40: gate_up's pairs grouped by expert (STRATA_CUDA_GATE_UP_GROUPED=1); the staged matvec's
#     cp.async copy (STRATA_CUDA_MATVEC_ASYNC_STAGE=1: its test passed in session 40).
# Steps: the build and the tests that never ran on a GPU (stream checker on); strata bench --parallel arms on
# the 48-layer Q4_0 file, in order of what they decide (P = 8 with grouping / the fused router for 8 / mode
# 2; P = 1 with the async stage; P = 2, 4); the rest of the GPU suite; bench/cuda_matvec (mode 2, and dp4a with
# the async stage); the arms again. Flip a default only where its tests pass and its arms win.
# LIMIT=S (default 585): every step stops S seconds after the start (pass less where less device time is left:
# a fresh H100 took 192 s to build in session 40).
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# The tests that never ran on a GPU first, then the arms, then the rest of the suite (session 40's one call
# was killed inside the whole suite, before any arm: a slow build, 192 s, and little device time).
first='CudaQ8Matvec.TensorCoreModes:CudaQ8Moe.*:Qwen3MoeGpuBatch.*:GpuOpsFused.*Route*:GpuOps.Sample*'
TESTS=$first TESTS_OUT=tests-first.txt bash scripts/device-call-suite.sh || exit 1  # the build, those tests
. /tmp/b/env.sh
grep -E "^\[       OK|^\[  FAILED|grouped gate_up" $OUT/tests-first.txt | head -60
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
arm() {  # P MMA_MODE ROUTE_PARALLEL ROUTER_TOKENS [GATE_UP_GROUPED [MATVEC_ASYNC_STAGE]]
  STRATA_CUDA_Q8_MMA=$2 STRATA_CUDA_ROUTE_PARALLEL=$3 STRATA_CUDA_FUSED_ROUTER_TOKENS=$4 \
  STRATA_CUDA_GATE_UP_GROUPED=${5:-0} STRATA_CUDA_MATVEC_ASYNC_STAGE=${6:-0} /tmp/b/strata bench -m "$f" \
    --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 -r 2 --parallel $1 --no-roofline 2>&1 |
    grep -E "^tg" | sed "s/^/P=$1 mma=$2 route_par=$3 router_tokens=$4 grouped=${5:-0} async=${6:-0} /"
}
round() {  # the arms in order of what they decide first
  for a in "8 1 0 2" "8 1 0 2 1" "8 1 1 8" "8 2 0 2" "1 1 0 2" "1 1 0 2 0 1" "2 0 0 2" "2 0 0 2 1" "2 2 0 2" "4 1 0 2" \
           "4 2 0 2" "8 0 0 2"; do
    left=$(( ${LIMIT:-585} - ($(date +%s) - t0) )); [ $left -gt 15 ] || return
    timeout $left bash -c "$(declare -f arm); f=$f; arm $a"
  done
}
round 2>&1 | tee $OUT/parallel.txt
st "round 1"
left=$(( ${LIMIT:-585} - ($(date +%s) - t0) - 10 ))
[ $left -gt 30 ] && STRATA_STREAM_CHECK=1 GTEST_FILTER="-$first" timeout $left /tmp/b/tests/strata_cuda_tests \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "the rest of the suite"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
[ $(( ${LIMIT:-585} - ($(date +%s) - t0) )) -gt 120 ] && (cd /tmp/b && ninja cuda_matvec > /dev/null 2>&1) &&
for m in 2 a; do
  [ $m = a ] && export STRATA_CUDA_MATVEC_ASYNC_STAGE=1 && m=0  # the staged rows by cp.async, dp4a only
  STRATA_CUDA_Q8_MMA=$m timeout 40 /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec-mode$m.txt 2>&1
  echo "mode $m:"; grep -A200 "dp4a us/call" $OUT/cuda_matvec-mode$m.txt |
    grep -E "^\| (q4_0|q6_K|q4_K) .* \| [1248] \|" | cut -d'|' -f2-5,11-12 | head -40
done; unset STRATA_CUDA_MATVEC_ASYNC_STAGE
st cuda_matvec
round 2>&1 | tee -a $OUT/parallel.txt
st done
