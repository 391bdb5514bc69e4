#!/usr/bin/env bash
# One device call: q|k stacked apart from a v of another type (STRATA_CUDA_QK_STACK, session 36, built without
# a GPU and off by default): its GPU test with the stream checker, then tg64 fully resident on a 48-layer
# Qwen3-30B-A3B-geometry Q4_K_M file (v Q6_K in half the layers), the switch 0 against 1, alternating. If the
# test passes and 1 wins, make it the default (g_qk_stack in src/cuda/model_common.cpp, README's row).
# The device tool: run "bash scripts/device-call-qk-stack.sh", carry [".carry/deps", ".carry/fx"].
# Also bench/cuda/cuda_matvec with the driver's shared-memory carveout for the staged matvec kernels and with
# STRATA_CUDA_MATVEC_CARVEOUT=100 (the Q6_K output product), and a third tg arm with that carveout.
# About 540 s on a fresh machine (build ~180 s, the test ~40 s, the file ~30 s, matvec ~50 s, the arms ~220 s);
# the arms get what is left of 585 s.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 585 - ($(date +%s) - t0) )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
timeout 400 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 120 /tmp/b/tests/strata_cuda_tests --gtest_filter='QkStackGpu.*:Q4_0X8Gpu.*' > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=|qk stack \]" $OUT/tests.txt | head -20
f=$(scripts/device-model-30b /tmp/b/strata Q4_K_M .carry/fx/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file: $(tail -n1 $OUT/mkmodel.txt 2>/dev/null)"
# The Q6_K output product (68% of the read roofline in session 36, 86-94% for the 16-byte aligned formats):
# does a shared-memory carveout of 100% for the staged matvec kernels (more staged blocks an SM) help it?
for c in driver 100; do
  if [ $c = driver ]; then timeout 40 /tmp/b/bench/cuda_matvec > $OUT/matvec_$c.txt 2>&1
  else STRATA_CUDA_MATVEC_CARVEOUT=$c timeout 40 /tmp/b/bench/cuda_matvec > $OUT/matvec_$c.txt 2>&1; fi
  echo "matvec carveout $c: $(grep -E '^\| q6_K \| output 151936x2048 \| 1 \|' $OUT/matvec_$c.txt | tail -1)"
done
st "matvec"
ROUNDS=3 ARM_TIMEOUT=60 timeout $(( $(left) - 5 )) scripts/bench-arms /tmp/b/strata \
  "-m $f --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" \
  three=STRATA_CUDA_QK_STACK=0 qk-stack=STRATA_CUDA_QK_STACK=1 \
  qk-stack+carveout="STRATA_CUDA_QK_STACK=1 STRATA_CUDA_MATVEC_CARVEOUT=100" > $OUT/arms_100.txt 2>&1
st "100% arms"; tail -6 $OUT/arms_100.txt
