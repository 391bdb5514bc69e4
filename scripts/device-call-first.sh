#!/usr/bin/env bash
# One device call holding the most important parts of both pending plans (session 34: machines came rarely,
# so the first call that runs must answer both): the build; the Q4_0_X8 GPU tests and the low-bit int8
# kernels' GPU tests (host runs, kernels against the CPU references, the fixtures' KL with the switch on/off);
# tg64 at Q4_0 with STRATA_CUDA_Q4_0_X8=0/1 alternating; then, while time is left, tg64 on a Q2_K file with
# STRATA_CUDA_Q8_LOW_BIT=0/1 alternating; cuda_matvec's low-bit rows last. llama.cpp and the other low-bit
# files stay in scripts/device-call-llama-low-bit.sh and scripts/device-call-low-bit.sh.
# Prepared HERE: .carry/deps (scripts/device-deps) and .carry/fxq (see scripts/device-call-low-bit.sh).
# The device tool: run "bash scripts/device-call-first.sh", carry [".carry/deps", ".carry/fxq"]. <= ~590 s.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 585 - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fxq
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git diff --stat; } > $OUT/env.txt 2>&1
timeout 450 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
mk() {  # FORMAT -> /tmp/m-FORMAT.gguf (48 layers, the layer quantized once and repeated)
  /tmp/b/strata mkmodel -o "/tmp/m-$1.gguf" --preset qwen3-30b-a3b --layers 48 --repeat-layers --format "$1" \
    --vocab-from .carry/fxq/vocab/ggml-vocab-qwen2.gguf -t 4 > "$OUT/mkmodel-$1.txt" 2>&1
}
(mk Q2_K) &
mkp=$!
STRATA_STREAM_CHECK=1 timeout 150 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='CudaFoldedRouter.*:*Q40X8*:*Q4_0X8*:ExpertCacheGpu.*:Q8Host.*:CudaQ8.SupportedTypes:CudaQ8Matvec.LowBit*:CudaQ8Moe.*:CudaQ8Matvec.BadArgumentsAreErrors:Qwen3MoeGpuAll.FastOneTokenPassesLowBit*' \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests"; grep -E "^\[  FAILED|PASSED|rc=|low-bit|  default|  llama" $OUT/tests.txt | head -60
wait $mkp; st "Q2_K file: $(tail -n1 $OUT/mkmodel-Q2_K.txt)"
if [ "$(left)" -ge 100 ] && [ -f /tmp/m-Q2_K.gguf ]; then
  ROUNDS=3 ARM_TIMEOUT=45 timeout $(( $(left) - 40 )) scripts/bench-arms /tmp/b/strata "-m /tmp/m-Q2_K.gguf --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" \
    lowoff=STRATA_CUDA_Q8_LOW_BIT=0 lowon=STRATA_CUDA_Q8_LOW_BIT=1 > $OUT/arms_q2k.txt 2>&1
  st "Q2_K arms"; tail -4 $OUT/arms_q2k.txt
fi
rm -f /tmp/m-Q2_K.gguf
if [ "$(left)" -ge 20 ]; then
  timeout $(( $(left) - 5 )) /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec.txt 2>&1; st "cuda_matvec"
  grep -E "^\| (q2_K|q3_K|iq)" $OUT/cuda_matvec.txt | grep -E "\| 1 \|" | head -40
fi
