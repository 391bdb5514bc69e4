#!/usr/bin/env bash
# For the session after 39, first device call: session 39 built two things after its last GPU call, both off
# by default until they run here:
#   * the persistent, double-buffered tensor-core q8 matvec (STRATA_CUDA_Q8_MMA=2; mode 1, the default, is
#     the tile kernel for n >= 8, measured in session 39);
#   * the fused routers' warp-parallel routing (STRATA_CUDA_ROUTE_PARALLEL=1), which may let batches of up to
#     8 tokens take the fused router (STRATA_CUDA_FUSED_ROUTER_TOKENS=8; the default threshold is 2);
#   * the device sampler's deep search by mass (STRATA_CUDA_SAMPLE_DEEP=1; its test runs in the suite, its
#     serve arms in scripts/device-call-next2.sh on the warm machine after this call).
# Steps: every GPU test with the stream checker (CudaQ8Matvec.TensorCoreModes runs modes 1 and 2 at n = 2..16;
# GpuOpsFused.RouterRoute* / NormRouterRoute* run the routing both ways); bench/cuda_matvec with mode 2 (the
# dp4a column is timed in the same loop) and mode 1; strata bench --parallel on the 48-layer Q4_0 file:
# P = 8 / 4 / 2 with mode 0 / 1 / 2, and P = 8 with parallel routing + the fused router for 8 tokens.
# Flip a default only where its tests pass and its arms win.
# LIMIT=S (default 585): the arms stop S seconds after the start.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bash scripts/device-call-suite.sh || exit 1  # the build, every GPU test with the stream checker (its lines)
. /tmp/b/env.sh
grep -E "TensorCoreModes|AsyncStage|RouterRoute|SampleDeep|SampleMatches|CudaQ8Moe|grouped gate_up" $OUT/tests.txt | grep -E "OK|FAILED" | head -40
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
