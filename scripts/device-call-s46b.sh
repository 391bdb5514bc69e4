#!/usr/bin/env bash
# Session 46, call 2: the sampler's candidate prefilter (ops_sample.cu sample_cand_kernel, on by default:
# STRATA_CUDA_SAMPLE_PREFILTER) and the wide greedy argmax on by default. Build; the sampler / argmax / chain
# tests with the stream checker; a sampled decode (strata bench --tg-mode chain --tg-temp 0.8: top-k 40,
# top-p 0.95, min-p 0.05) with the prefilter on, off, and off with the batched row loads
# (STRATA_CUDA_SAMPLE_BATCH=1), alternating, against the greedy chain; then memcheck and racecheck on the
# prefilter's equality test (racecheck on sample_rows' test: 2 launches, the prefilter's among them).
# The device tool: run "bash scripts/device-call-s46b.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first='GpuOps.Argmax*:GpuOps.Sample*:GpuOps.CopyI32MatchesCpu:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*:LogitsInPlaceGpu.*'
STRATA_STREAM_CHECK=1 timeout 90 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
grep -E '^\[(sample|prefilter)\]' $OUT/tests.txt | head -8 | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline --tg-mode chain"
ROUNDS=3 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8" prefilter=- \
  whole-row="STRATA_CUDA_SAMPLE_PREFILTER=0" whole-row-batched="STRATA_CUDA_SAMPLE_PREFILTER=0 STRATA_CUDA_SAMPLE_BATCH=1" \
  > $OUT/arms-sampled.txt 2>&1
tail -8 $OUT/arms-sampled.txt | tee -a $OUT/log.txt
ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args" greedy-wide=- greedy-one-block="STRATA_CUDA_WIDE_ARGMAX=0" \
  > $OUT/arms-greedy.txt 2>&1
tail -6 $OUT/arms-greedy.txt | tee -a $OUT/log.txt
st benches | tee -a $OUT/log.txt
for tool in memcheck racecheck; do
  [ $(left) -gt 50 ] || { echo "$tool: not run (time)" | tee -a $OUT/log.txt; continue; }
  timeout $(( $(left) - 20 < 150 ? $(left) - 20 : 150 )) compute-sanitizer --tool $tool \
    $T --gtest_filter="$([ $tool = memcheck ] && echo GpuOps.SamplePrefilterPicksAsTheWholeRow || echo GpuOps.SampleRowsFollowsEachRowsRule)" \
    > $OUT/$tool.txt 2>&1
  echo "rc=$?" >> $OUT/$tool.txt
  st "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/$tool.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
done
