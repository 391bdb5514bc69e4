#!/usr/bin/env bash
# Owed since session 48 (its second call found no machine). Session 48's first call
# (bench/results/2026-12-07-gpu-session48-h100.md) found `strata serve` at 282 tok/s for one request at T 0.8
# with the API's defaults (top-k off: a draw over the whole vocabulary) against `strata bench`'s 594 at top-k
# 40: the device sampler's deep search spends ~1.8 ms a row, its shared-memory atomics serialized on one or two
# bins. This call: build; the sampler tests (the warp merges now the default; the deep search's warp-aggregated
# atomics, STRATA_CUDA_SAMPLE_DEEP_AGG, off until this runs) with the stream checker; the sampled chained decode
# with top-k off, aggregated against one atomic a key, alternating; memcheck and racecheck on the new test; the
# server's one request (top-k off) both ways; the rest of the GPU suite, as far as LIMIT goes.
# If the tests pass and the aggregation wins: make it the default (ops_sample.cu g_sample_deep_agg), README row.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first='GpuOps.Argmax*:GpuOps.Sample*:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*:WarpMergeHost.*:MassPiecesHost.*'
STRATA_STREAM_CHECK=1 timeout 120 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
grep -E '^\[(sample|prefilter|deep agg)\]' $OUT/tests.txt | sort | uniq -c | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline --tg-mode chain"
ROUNDS=3 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8 --tg-top-k 0 --tg-top-p 1 --tg-min-p 0" \
  one-atomic-a-key=- agg="STRATA_CUDA_SAMPLE_DEEP_AGG=1" > $OUT/arms-topk0.txt 2>&1
tail -4 $OUT/arms-topk0.txt | tee -a $OUT/log.txt
for mode in "--tg-temp 0.8" ""; do
  v=$(timeout 60 /tmp/b/strata bench $args $mode 2>&1 | awk '/^tg/ {print $2; exit}')
  echo "chain ${mode:-greedy}: ${v:-failed}" | tee -a $OUT/log.txt
done
st benches | tee -a $OUT/log.txt
for tool in memcheck racecheck; do
  [ $(left) -gt 100 ] || break
  timeout 120 compute-sanitizer --tool $tool $T --gtest_filter=GpuOps.SampleDeepAggPicksAsOneAtomicAKey \
    > $OUT/$tool.txt 2>&1; echo "rc=$?" >> $OUT/$tool.txt
  st "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/$tool.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
done
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 100 )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$m" \
    "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 1 256 2 \
    agg=STRATA_CUDA_SAMPLE_DEEP_AGG=1 one-atomic-a-key=STRATA_CUDA_SAMPLE_DEEP_AGG=0 > $OUT/serve.txt 2>&1
  tail -3 $OUT/serve.txt | tee -a $OUT/log.txt
  st serve | tee -a $OUT/log.txt
fi
if [ $(left) -gt 60 ]; then
  STRATA_STREAM_CHECK=1 timeout $(( $(left) - 10 )) $T --gtest_filter="-$first" --gtest_brief=1 > $OUT/tests-rest.txt 2>&1
  echo "rc=$?" >> $OUT/tests-rest.txt
  st "rest: $(grep -E '^\[  FAILED|PASSED|tests ran|rc=' $OUT/tests-rest.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
fi
