#!/usr/bin/env bash
# Session 42's device call: Q6_K dense products regrouped as Q6_K_X8 (quant/q6_k_x8.h,
# STRATA_CUDA_Q6_K_X8_DENSE). Steps: the build (strata, the GPU tests, cuda_matvec); the tests of the changed
# paths with the stream checker (the Q6_K_X8 bit tests, the model tests, the host twins); tg64 on the 48-layer
# Q4_0 file (its output is Q6_K) with the regrouping off / on, alternating (P = 1 three rounds, P = 4 and 8
# two); cuda_matvec's int8 table (Q6_K against Q6_K_X8 at the output's shape). (The session also ran
# STRATA_CUDA_ROUTE_PARALLEL's arms at P = 2 by hand; that setting is gone since.) LIMIT=S (default 585) bounds
# every step. STAGE=2 skips the build and tests (a warm machine's second call: the arms and cuda_matvec).
# The device tool: run "bash scripts/device-call-s42.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
if [ "${STAGE:-1}" = 1 ]; then
  { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; } > $OUT/env.txt 2>&1
  timeout 450 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 ||
    { st "BUILD FAILED"; grep -E "error|Error" $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
  st built
  . /tmp/b/env.sh
  tests='*Q6_KX8*:*Q6KX8*:*Q40X8*:Q4_0X8Gpu.*:CudaQ8Matvec.*:Q8Host.*:Q8MmaHost.*:CudaFastDotOnHost.*:CudaDequantDecodersOnHost.*:CudaFoldedRouter.*:QkStack*:Qwen3MoeGpuFast*'
  STRATA_STREAM_CHECK=1 GTEST_FILTER=$tests timeout $(( $(left) - 200 )) /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1
  echo "rc=$?" >> $OUT/tests.txt
  st tests; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran|\[ q6_kx8 \]" $OUT/tests.txt | head -30
fi
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st model
args="-m $f --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 -r 2 --no-roofline"
for p in 1 4 8; do
  [ $(left) -gt 60 ] || break
  r=3; [ $p = 1 ] || r=2
  ROUNDS=$r ARM_TIMEOUT=60 timeout $(( $(left) - 20 )) scripts/bench-arms /tmp/b/strata "$args --parallel $p" \
    q6k=STRATA_CUDA_Q6_K_X8_DENSE=0 q6kx8=STRATA_CUDA_Q6_K_X8_DENSE=1 2>&1 | tee -a $OUT/arms.txt
  st "P=$p"
done
[ $(left) -gt 40 ] && timeout $(( $(left) - 10 )) /tmp/b/bench/cuda_matvec --iters 100 > $OUT/cuda_matvec.txt 2>&1
grep -E "^\| q6_K|^\| q6_kx8|rooflines" $OUT/cuda_matvec.txt | head -40
st done
