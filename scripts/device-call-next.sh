#!/usr/bin/env bash
# For the session after 44, first device call. Session 44 ran memcheck (clean) on the kernels and copies added
# since session 35 but its racecheck share ran out before the first test ended, and its llama.cpp call got no
# machine. Steps: the builds (strata, the GPU tests, llama.cpp's driver beside them); the tests of the ops
# that session 44 moved into ops_route.cu / ops_sample.cu; compute-sanitizer
# racecheck on the Q6_K_P down tests and the expert fetch (at most RACE_S seconds, default 200); then
# llama.cpp's CUDA build against strata on the 48-layer Q4_0 file in the same call (bench/gpu_bench.sh's llama
# section: fully resident pp512 / tg128, and llama.cpp with 36 layers' experts on the CPU against strata at 25%).
# Prepared HERE: scripts/device-deps (.carry/deps), scripts/llama-cuda-pack (.carry/llama), the Qwen2
# vocabulary in .carry/fx/vocab/. The device tool:
#   run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fx", ".carry/llama"] (~59 MiB).
# LIMIT=S (default 570) bounds the call.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; compute-sanitizer --version | tail -1; } > $OUT/env.txt 2>&1
(bench/llama/build-llama-decode .carry/llama /tmp/ld > $OUT/llama_build.txt 2>&1) &
lb=$!
timeout 300 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built
. /tmp/b/env.sh
wait $lb; st "llama build"; tail -1 $OUT/llama_build.txt
# Session 44 split ops.cu into ops.cu / ops_route.cu / ops_sample.cu (the same PTX): their tests first.
STRATA_STREAM_CHECK=1 timeout 90 /tmp/b/tests/strata_cuda_tests --gtest_filter='GpuOps.*:GpuAttention.*:GpuOpsFused.*:SamplingBansGpu.*' \
  > $OUT/tests-ops.txt 2>&1; echo "rc=$?" >> $OUT/tests-ops.txt
st "ops tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-ops.txt | tr '\n' ' ')"
{ timeout ${RACE_S:-200} compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/b/tests/strata_cuda_tests \
    --gtest_filter='CudaQ8Moe.Q4KGateUpQ6KPDown:CudaQ8Moe.Q4KGateUpQ6KPDownTwoByteAligned:CudaMoe.DirectFetchCopiesTheExpertNotTheSlot'; \
  echo "rc=$?"; } > $OUT/racecheck.txt 2>&1
st "racecheck: $(grep -E '^\[       OK|FAILED|ERROR SUMMARY|rc=' $OUT/racecheck.txt | tr '\n' ' ')"
MODELS=llama LLAMA=/tmp/ld LLAMA_FORMATS="${LLAMA_FORMATS:-Q4_0}" timeout $(( $(left) - 5 )) bench/gpu_bench.sh /tmp/b/strata > $OUT/llama.txt 2>&1
st "llama section"; grep -vE "^strata: cuda" $OUT/llama.txt | tail -25
