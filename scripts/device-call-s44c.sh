#!/usr/bin/env bash
# Session 44: compute-sanitizer (memcheck, then racecheck) on the GPU tests of the kernels and copies added
# since session 35's last sanitizer run: the dense Q6_K_X8 products (session 42), Q6_K_P down (42-43), the
# slot copies that move the layer's expert (43), the async-staged matvec (40), Q4_0_X8 experts and the
# MoE fetch paths. The device tool: run "bash scripts/device-call-s44c.sh", carry [".carry/deps", ".carry/fix"].
# LIMIT=S (default 360) bounds the call; each tool gets its share, and its log keeps what it reached.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-360} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1; } > $OUT/env.txt 2>&1
timeout 240 scripts/device-build . /tmp/b .carry/deps strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built
. /tmp/b/env.sh
kern='CudaQ8Matvec.DenseQ6KX8SameBitsAsQ6_K:CudaQ8Matvec.AsyncStageSameBits:CudaQ8Moe.Q4KGateUpQ6KPDown*:CudaQ8Moe.AllQ40X8*:CudaMoe.*'
model='ExpertCacheGpu.*:Q6_KPGpu.*:Q6_KX8Gpu.*'
run() {  # tool filter seconds log
  { timeout $3 compute-sanitizer --tool $1 --error-exitcode 9 /tmp/b/tests/strata_cuda_tests \
      --gtest_filter="$2" --gtest_brief=1; echo "rc=$?"; } > $OUT/$4 2>&1
  st "$4 ($3 s): $(grep -E 'ERROR SUMMARY|rc=|tests ran|PASSED|FAILED' $OUT/$4 | tr '\n' ' ')"
}
run memcheck "$kern" $(( $(left) * 45 / 100 )) memcheck-kernels.txt
run racecheck "CudaQ8Matvec.DenseQ6KX8SameBitsAsQ6_K:CudaQ8Moe.Q4KGateUpQ6KPDown:CudaMoe.DirectFetchCopiesTheExpertNotTheSlot" \
  $(( $(left) * 50 / 100 )) racecheck-kernels.txt
[ $(left) -gt 30 ] && run memcheck "$model" $(( $(left) - 10 )) memcheck-model.txt
st done
