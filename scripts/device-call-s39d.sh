#!/usr/bin/env bash
# Session 39, a short device call (little device time left): is the tensor-core q8 matvec v2 (persistent,
# double-buffered) right and faster than dp4a, and is the warp-parallel routing right.
#   1. build strata_cuda_tests, cuda_matvec, strata;  2. the q8 matvec and router bit tests (stream checker);
#   3. bench/cuda_matvec (mma against dp4a at n = 2, 4, 8);  4. where time is left, --parallel 8 mma 1 / 0.
# The device tool: run "bash scripts/device-call-s39d.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
timeout 200 scripts/device-build . /tmp/b .carry/deps strata_cuda_tests cuda_matvec strata > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 60 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='CudaQ8Matvec.*:Q8MmaHost.*:GpuOpsFused.Router*:GpuOpsFused.NormRouter*' > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -20
timeout 45 /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec.txt 2>&1
grep -A200 "dp4a/mma" $OUT/cuda_matvec.txt | grep -E "^\| (q4_0|q6_K|q4_K|q8_0|q5_K) .* \| [248] \|" | cut -d'|' -f2-5,11-12 | head -60
st cuda_matvec
f=$(timeout 40 scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
for m in 1 0 1 0; do
  STRATA_CUDA_Q8_MMA=$m /tmp/b/strata bench -m "$f" --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 32 -r 2 \
    --parallel 8 --no-roofline 2>&1 | grep -E "^tg" | sed "s/^/P=8 mma=$m /"
done | tee $OUT/parallel.txt
st done
