#!/usr/bin/env bash
# Owed since session 46 (its device time ran out before this could run; session 47 got no machine in 16
# starts): the prefilter by warp merges
# (STRATA_CUDA_SAMPLE_MERGE, cuda/warp_merge.cuh), off by default until this has run. Build; the sampler
# tests with the stream checker, with merges off (the default) and on; memcheck and racecheck on the merge's
# tests; the sampled chained decode (strata bench --tg-mode chain --tg-temp 0.8) with the block-sort
# prefilter (the default) against the warp merges, alternating, and the greedy chain; ncu's durations of the
# sampler kernels with warm caches (--cache-control none: as in a decode step) for both. If the tests pass
# and the merges win, make them the default (ops_sample.cu g_sample_merge) and update README's row.
# Session 47 added DecodeChainGpu.BansHoldInEveryChainedStep (the server's ignore_eos in chained steps: on by
# default since session 47, not yet run on a GPU) to the first tests, the server's chained passes against step
# by step, and put the sanitizers after the benches (each part runs where LIMIT leaves it time). Then the
# rest of the GPU suite.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"] (~62 MiB with
# the tree; .carry/deps: scripts/device-deps; .carry/fix: a copy of ../shared/fixtures). LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first='GpuOps.Argmax*:GpuOps.Sample*:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*:*LogitsInPlace*'
for merge in 0 1; do
  STRATA_CUDA_SAMPLE_MERGE=$merge STRATA_STREAM_CHECK=1 timeout 90 $T --gtest_filter="$first" > $OUT/tests-m$merge.txt 2>&1
  echo "rc=$?" >> $OUT/tests-m$merge.txt
  st "tests merge=$merge: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-m$merge.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
  grep -E '^\[(sample|prefilter)\]' $OUT/tests-m$merge.txt | head -6 | tee -a $OUT/log.txt
done
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline --tg-mode chain"
ROUNDS=3 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8" block-sort=- \
  merges="STRATA_CUDA_SAMPLE_MERGE=1" > $OUT/arms-sampled.txt 2>&1
tail -5 $OUT/arms-sampled.txt | tee -a $OUT/log.txt
v=$(timeout 60 /tmp/b/strata bench $args 2>&1 | awk '/^tg/ {print $2; exit}'); echo "greedy-chain ${v:-failed}" | tee -a $OUT/log.txt
st benches | tee -a $OUT/log.txt
# Session 47: the server's decode steps chained (Scheduler::decode_all through Backend::generate) against a
# step-by-step loop (STRATA_DECODE_CHAIN=0), one request of 256 tokens at T 0.8 (top-k 40), alternating.
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 110 )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$m" \
    "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 1 256 3 \
    chain=STRATA_DECODE_CHAIN=1 step=STRATA_DECODE_CHAIN=0 > $OUT/serve-chain.txt 2>&1
  tail -4 $OUT/serve-chain.txt | tee -a $OUT/log.txt
  st serve | tee -a $OUT/log.txt
fi
for tool in memcheck racecheck; do
  [ $(left) -gt 100 ] || break
  timeout 120 compute-sanitizer --tool $tool $T --gtest_filter="$([ $tool = memcheck ] && \
    echo GpuOps.SamplePrefilterPicksAsTheWholeRow || echo GpuOps.SampleRowsFollowsEachRowsRule)" \
    > $OUT/$tool.txt 2>&1; echo "rc=$?" >> $OUT/$tool.txt
  st "$tool (merge=1 for racecheck): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/$tool.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
  export STRATA_CUDA_SAMPLE_MERGE=1  # (racecheck runs with the merges: the memcheck test runs both itself)
done
unset STRATA_CUDA_SAMPLE_MERGE
for merge in 0 1; do
  [ $(left) -gt 60 ] || break
  STRATA_CUDA_SAMPLE_MERGE=$merge timeout 50 ncu --clock-control none --cache-control none \
    --kernel-name regex:'sample' --launch-skip 12 --launch-count 6 --metrics gpu__time_duration.sum \
    /tmp/b/strata bench ${args/-n 64 -r 2/-n 8 -r 1} --tg-temp 0.8 > $OUT/ncu-m$merge.txt 2>&1
  echo "ncu merge=$merge:" | tee -a $OUT/log.txt
  grep -E "sample_cand|sample_kernel|gpu__time_duration" $OUT/ncu-m$merge.txt | sed 's/(const.*//' | head -8 | tee -a $OUT/log.txt
done
if [ $(left) -gt 60 ]; then
  STRATA_STREAM_CHECK=1 timeout $(( $(left) - 10 )) $T --gtest_filter="-$first" --gtest_brief=1 > $OUT/tests-rest.txt 2>&1
  echo "rc=$?" >> $OUT/tests-rest.txt
  st "rest: $(grep -E '^\[  FAILED|PASSED|tests ran|rc=' $OUT/tests-rest.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
fi
