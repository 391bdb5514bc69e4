#!/usr/bin/env bash
# Session 39, last device call (a fresh machine): the tensor-core q8 matvec v2 (persistent, double-buffered)
# and the fused routers' warp-parallel routing.
#   1. build strata, strata_cuda_tests, cuda_matvec;
#   2. the GPU tests these touch, with the stream checker (q8 matvec at every format / n, the fused ops' and
#      routers' bit tests, the qwen3moe batch / all-format decode tests, Q4_0_X8 bits, sampling, qwen3next);
#   3. bench/cuda_matvec: mma against dp4a at n = 2, 4, 8;
#   4. strata bench --parallel on the 48-layer Q4_0 file: P = 8 mma 1/0, fused router threshold 2 / 8 (and 4 at
#      P = 4), P = 2 mma 1/0, alternating.
# The device tool: run "bash scripts/device-call-s39c.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
timeout 300 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 100 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='CudaQ8Matvec.*:Q8Mma*:GpuOpsFused.Router*:GpuOpsFused.NormRouter*:Qwen3MoeGpuBatch*:Q4_0X8*' \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -20
grep -E "^\[ gpu fast (chunked|one-token)[^]]*, all \]" $OUT/tests.txt | head -4
timeout 60 /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec.txt 2>&1
grep -A200 "dp4a/mma" $OUT/cuda_matvec.txt | grep -E "^\| (q4_0|q6_K|q4_K|q8_0|q5_K) .* \| [248] \|" | cut -d'|' -f2-5,11-12 | head -60
st cuda_matvec
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file $f"
arm() {  # P MMA ROUTER_TOKENS
  STRATA_CUDA_Q8_MMA=$2 STRATA_CUDA_FUSED_ROUTER_TOKENS=$3 /tmp/b/strata bench -m "$f" --backend cuda --expert-cache 100% \
    --adapt-every 0 -p 0 -n 64 -r 2 --parallel $1 --no-roofline 2>&1 | grep -E "^tg" | sed "s/^/P=$1 mma=$2 router=$3 /"
}
{ arm 8 1 2; arm 8 0 2; arm 8 1 8; arm 2 1 2; arm 2 0 2; st "round 1"
  arm 8 1 2; arm 8 0 2; arm 8 1 8; arm 1 1 2; st "round 2"; } 2>&1 | tee $OUT/parallel.txt
st done
