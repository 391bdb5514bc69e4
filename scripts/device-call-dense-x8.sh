#!/usr/bin/env bash
# One device call: Q4_0 dense matrices as Q4_0_X8 (STRATA_CUDA_Q4_0_X8_DENSE, session 36): its GPU tests
# (the same bits as Q4_0 in every product, the same logits end to end) with the stream checker, then tg64
# fully resident on a 48-layer Qwen3-30B-A3B-geometry Q4_0 file, dense X8 off against on, alternating.
# Also builds BUILD/strata.old with session 35's base CPU Q4_0 kernel for scripts/device-call-q40-pool.sh's
# A/B (run it next on the same warm machine with SKIP_BUILD=1). Prepare HERE:
#   mkdir -p ab_old/src/quant && git show 1bf0890:src/quant/vec_dot_x86.inc > ab_old/src/quant/vec_dot_x86.inc
# The device tool: run "bash scripts/device-call-dense-x8.sh", carry [".carry/deps", ".carry/fx"].
# About 500 s on a fresh machine (builds ~250 s, tests ~40 s, the file ~30 s, the arms ~150 s).
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 585 - ($(date +%s) - t0) )); }
[ -f ab_old/src/quant/vec_dot_x86.inc ] || { echo "ab_old/src/quant/vec_dot_x86.inc missing: see the header"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
timeout 400 scripts/device-ab-build ab_old /tmp/b .carry/deps strata_cuda_tests > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 120 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='Q4_0X8Gpu.*:CudaQ8Matvec.DenseQ40X8*:CudaQ8Moe.AllQ40X8*:ExpertCacheGpu.Q4_0*:CudaMoe.Q40X8*' > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=|q4_0x8 \]" $OUT/tests.txt | head -30
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fx/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file: $(tail -n1 $OUT/mkmodel.txt 2>/dev/null)"
ROUNDS=3 ARM_TIMEOUT=60 timeout $(( $(left) - 5 )) scripts/bench-arms /tmp/b/strata \
  "-m $f --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" \
  dense-q4_0=STRATA_CUDA_Q4_0_X8_DENSE=0 dense-x8=STRATA_CUDA_Q4_0_X8_DENSE=1 > $OUT/arms_100.txt 2>&1
st "100% arms"; tail -5 $OUT/arms_100.txt
