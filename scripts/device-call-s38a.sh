#!/usr/bin/env bash
# Session 38, first device call: the build (strata, the GPU tests, cuda_matvec), every GPU test with the
# stream-order checker (session 37 changed both CUDA models' forward entry: check_logits_target, logits in
# place; QkStackGpu and LogitsInPlaceGpu had never run), cuda_matvec with and without
# STRATA_CUDA_MATVEC_CARVEOUT=100 (the Q6_K output product), and the two benchmark files (Q4_K_M, Q4_0) for
# the second call (scripts/device-call-s38b.sh) on the same warm machine.
# The device tool: run "ln -sfn fix .carry/fx; bash scripts/device-call-s38a.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
timeout 400 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 300 /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
grep -E "^\[ gpu fast (chunked|one-token)[^]]*, all \]|qk stack \]|^  mean" $OUT/tests.txt | head -20
for c in driver 100; do
  if [ $c = driver ]; then timeout 40 /tmp/b/bench/cuda_matvec > $OUT/matvec_$c.txt 2>&1
  else STRATA_CUDA_MATVEC_CARVEOUT=$c timeout 40 /tmp/b/bench/cuda_matvec > $OUT/matvec_$c.txt 2>&1; fi
  echo "matvec carveout $c: $(grep -E '^\| q6_K \| output 151936x2048 \| 1 \|' $OUT/matvec_$c.txt | tail -1)"
done
st "matvec"
for fmt in Q4_K_M Q4_0; do
  [ $(( $(date +%s) - t0 )) -lt 540 ] || { st "no time for the $fmt file"; break; }
  f=$(timeout $(( 585 - ($(date +%s) - t0) )) scripts/device-model-30b /tmp/b/strata $fmt .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel_$fmt.txt)
  st "file $f: $(ls -la $f 2>&1 | awk '{print $5}')"
done
