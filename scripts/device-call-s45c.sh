#!/usr/bin/env bash
# Session 45, third call: call 2 found the device pick slower than bringing the logits back (582.5 against
# 601.2 tok/s): the sampler's greedy branch reads the 152k-value row with one block. ops::argmax_wide spreads
# it over ~75 blocks. Steps: build; its test and the chain / sampling tests with the stream checker; tg64
# on the 48-layer Q4_0 file, alternating: logits back, device pick, chained, and the device pick with the
# old one-block kernel (STRATA_CUDA_WIDE_ARGMAX=0), with and without the sampler's batched row loads
# (STRATA_CUDA_SAMPLE_BATCH); then strata run greedy and sampled. Few files under $OUT (the tool returns 8).
# The device tool: run "bash scripts/device-call-s45c.sh", carry [".carry/deps", ".carry/fx"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/log.txt 2>&1
timeout 300 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built | tee -a $OUT/log.txt
. /tmp/b/env.sh
T=/tmp/b/tests/strata_cuda_tests
STRATA_STREAM_CHECK=1 timeout 150 $T --gtest_filter='GpuOps.Argmax*:GpuOps.CopyI32MatchesCpu:DecodeChainGpu.*:SamplingBansGpu.*:LogitsInPlaceGpu.*:*Sampl*' \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fx/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline"
for r in 1 2 3; do
  for arm in logits pick chain pick-one pick-one-unbatched; do
    mode=$arm; env=""
    [ $arm = pick-one ] && { mode=pick; env="STRATA_CUDA_WIDE_ARGMAX=0"; }
    [ $arm = pick-one-unbatched ] && { mode=pick; env="STRATA_CUDA_WIDE_ARGMAX=0 STRATA_CUDA_SAMPLE_BATCH=0"; }
    v=$(env $env timeout 120 /tmp/b/strata bench $args --tg-mode $mode 2>&1 | tee -a $OUT/bench.txt | awk '/^tg/ {print $2; exit}')
    echo "round $r $arm ${v:-failed}" | tee -a $OUT/log.txt
  done
done
st bench | tee -a $OUT/log.txt
# strata run (generate) on the same file: greedy and the default sampler (T 0.8, top-k 40, top-p 0.95,
# min-p 0.05), chained and not; 128 tokens, end-of-generation ignored; its timing line.
for r in 1 2; do
  for arm in greedy-chain sample-chain sample-chain-unbatched sample-plain; do
    env=""; samp="--temp 0"
    [[ $arm == *plain ]] && env="STRATA_DECODE_CHAIN=0"
    [[ $arm == *unbatched ]] && env="STRATA_CUDA_SAMPLE_BATCH=0"
    [[ $arm == sample* ]] && samp="--temp 0.8 --seed 1"
    v=$(env $env timeout 120 /tmp/b/strata run -m $m --backend cuda --adapt-every 0 --expert-cache 100% -p "Once upon a time" \
        -n 128 --ignore-eos $samp 2>&1 >/dev/null | grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)')
    echo "run $r $arm ${v:-failed}" | tee -a $OUT/log.txt
  done
done
st run | tee -a $OUT/log.txt
