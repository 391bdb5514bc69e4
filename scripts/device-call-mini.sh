#!/usr/bin/env bash
# For a session with ~2 minutes of device time past a machine's start (no time for a build there): a test binary
# linked HERE from the GPU op tests alone (tests/cuda/test_ops_kernels.cu and test_ops_fused.cu against this
# build's libstrata_cuda.a; the whole strata_cuda_tests packs to 46 MB, past the 64 MiB a call with the tree),
# carried as .carry/bin/strata_gpu_ops_tests.xz (scripts/carry-binary's packing). Runs the tests of the code
# built without a GPU first (session 51's decode tiles and cluster merge, session 52's deep warp pick, the
# sampler's jitter test), then the rest of those two files while time lasts.
# The device tool: run "bash scripts/device-call-mini.sh", carry [".carry/deps", ".carry/bin"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/log.txt 2>&1
. scripts/device-carried-env >> $OUT/log.txt 2>&1
T=/tmp/strata-bin/strata_gpu_ops_tests
st "unpacked" >> $OUT/log.txt
new="GpuAttention.DecodeTilesASplit:GpuAttention.DecodeClusterMerge:GpuOpsFused.PrepAttentionEqualsPrepThenAttention"
new+=":GpuOps.SampleDeepWarp*:GpuOps.SampleClusterPicksUnderJitter"
STRATA_STREAM_CHECK=1 timeout 50 $T --gtest_filter="$new" > $OUT/tests-new.txt 2>&1
echo "rc=$?" >> $OUT/tests-new.txt
st "new tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-new.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
STRATA_STREAM_CHECK=1 timeout 40 $T --gtest_filter="GpuAttention.*:GpuOpsFused.*:-$new" > $OUT/tests-rest.txt 2>&1
echo "rc=$?" >> $OUT/tests-rest.txt
st "the other attention / fused tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-rest.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
