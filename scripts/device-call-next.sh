#!/usr/bin/env bash
# For the session after 42, first device call. Session 42 built Q6_K expert down matrices padded as Q6_K_P
# (quant/q6_k_p.h, STRATA_CUDA_Q6_K_P_DOWN, off by default) after its device time was spent, and removed the
# fused routers' warp-parallel routing (route_in_last_block is session 38's again); neither ran on a GPU.
# Steps: the build (strata, the GPU tests, cuda_matvec); the tests of those paths with the stream checker
# (Q6_KPGpu: the same logits as Q6_K down at 100% and 50% resident; CudaQ8Moe with Q6_K_P down; the fused
# router tests; the host twins); tg64 on the 48-layer Q4_K_M file (24 of its layers have Q6_K down), padded
# off / on, alternating (P = 1 three rounds, P = 4 two, 25% resident two); cuda_matvec's MoE layer lines
# (Q6_K, Q6_K_P, Q4_K down); then the rest of the GPU suite. LIMIT=S (default 585) bounds every step.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
timeout 450 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
first='Q6_KPGpu.*:CudaQ8Moe.*:GpuOpsFused.*:Q8Host.*:CudaFastDotOnHost.*:CudaDequantDecodersOnHost.*'
STRATA_STREAM_CHECK=1 GTEST_FILTER=$first timeout 200 /tmp/b/tests/strata_cuda_tests > $OUT/tests-first.txt 2>&1
echo "rc=$?" >> $OUT/tests-first.txt
st "first tests"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran|\[ q6_kp \]" $OUT/tests-first.txt | head -20
f=$(timeout 150 scripts/device-model-30b /tmp/b/strata Q4_K_M .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st model
a="-m $f --backend cuda --adapt-every 0 -p 0 -n 64 -r 2 --no-roofline"
for arm in "1 100% 3" "4 100% 2" "1 25% 2"; do
  set -- $arm
  [ $(left) -gt 60 ] || break
  ROUNDS=$3 ARM_TIMEOUT=90 timeout $(( $(left) - 20 )) scripts/bench-arms /tmp/b/strata \
    "$a --expert-cache $2 --parallel $1" q6k=STRATA_CUDA_Q6_K_P_DOWN=0 q6kp=STRATA_CUDA_Q6_K_P_DOWN=1 2>&1 |
    tee -a $OUT/arms.txt | tail -4
  st "P=$1 $2"
done
[ $(left) -gt 110 ] && timeout 100 /tmp/b/bench/cuda_matvec --iters 100 > $OUT/cuda_matvec.txt 2>&1
grep -E "moe layer|moe_down alone" $OUT/cuda_matvec.txt
[ $(left) -gt 60 ] && STRATA_STREAM_CHECK=1 GTEST_FILTER="-$first" timeout $(( $(left) - 10 )) \
  /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "the rest of the suite"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -20
st done
