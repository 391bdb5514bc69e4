#!/usr/bin/env bash
# Owed since session 49 (bench/results/2026-12-07-gpu-session49-h100.md). That session made the deep search's
# warp-aggregated atomics the default (a whole-vocabulary draw: 386 tok/s against 297), but such a draw is still
# ~0.9 ms a token over a top-k 40 one (596): one block's ~10 passes over 152k values, instruction-bound on one
# SM. Built after its device time was spent: STRATA_CUDA_SAMPLE_CLUSTER=N, a cluster of N blocks a row that
# split the passes and merge through distributed shared memory (cuda/ops.cuh says how), 1 until this runs.
# This call: build; the sampler tests with the stream checker (cluster tests included), then the same with
# STRATA_CUDA_SAMPLE_CLUSTER=8 for the whole process; racecheck/memcheck on the small cluster and deep-agg tests
# (racecheck ran past its limit at the real vocabulary); the chained decode at top-k off with clusters of 1, 2,
# 4, 8, and at top-k 40 with 1 and 8 (the default path, its blocks redundant); the server's one request
# (top-k off) with 1 and 8; the rest of the GPU suite as far as LIMIT goes. Also bench_cluster_attn_shape:
# bare kernels of a fused q|k|v + attention launch against the two launches (the greedy chain's lead).
# If the tests pass and a cluster wins: make it the default (ops_sample.cu g_sample_cluster), README row, docs.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests bench_cluster_attn_shape
first='GpuOps.Argmax*:GpuOps.Sample*:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*:WarpMergeHost.*:MassPiecesHost.*'
STRATA_STREAM_CHECK=1 timeout 150 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
grep -E '^\[(sample|prefilter|deep agg|cluster)\]' $OUT/tests.txt | sort | uniq -c | tee -a $OUT/log.txt
STRATA_CUDA_SAMPLE_CLUSTER=8 STRATA_STREAM_CHECK=1 timeout 120 $T --gtest_filter="$first:-GpuOps.SampleCluster*" \
  > $OUT/tests-cluster8.txt 2>&1
echo "rc=$?" >> $OUT/tests-cluster8.txt
st "tests, cluster 8: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-cluster8.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
# The fused q|k|v + attention shape (docs/gpu.md, session 49's lead for the greedy chain): bare kernels.
timeout 60 /tmp/b/bench/bench_cluster_attn_shape > $OUT/cluster-attn-shape.txt 2>&1; echo "rc=$?" >> $OUT/cluster-attn-shape.txt
cat $OUT/cluster-attn-shape.txt | tee -a $OUT/log.txt
for run in "memcheck GpuOps.SampleClusterPicksAsOneBlockSmall" "racecheck GpuOps.SampleClusterPicksAsOneBlockSmall" \
           "racecheck GpuOps.SampleDeepAggPicksAsOneAtomicAKeySmall"; do
  set -- $run
  [ $(left) -gt 300 ] || break
  timeout 60 compute-sanitizer --tool $1 $T --gtest_filter=$2 > $OUT/$1-$2.txt 2>&1; echo "rc=$?" >> $OUT/$1-$2.txt
  st "$1 $2: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/$1-$2.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
done
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline --tg-mode chain"
ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8 --tg-top-k 0 --tg-top-p 1 --tg-min-p 0" \
  one-block=- cluster2="STRATA_CUDA_SAMPLE_CLUSTER=2" cluster4="STRATA_CUDA_SAMPLE_CLUSTER=4" \
  cluster8="STRATA_CUDA_SAMPLE_CLUSTER=8" > $OUT/arms-topk0.txt 2>&1
tail -6 $OUT/arms-topk0.txt | tee -a $OUT/log.txt
ROUNDS=3 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8" \
  one-block=- cluster8="STRATA_CUDA_SAMPLE_CLUSTER=8" > $OUT/arms-topk40.txt 2>&1
tail -4 $OUT/arms-topk40.txt | tee -a $OUT/log.txt
v=$(timeout 60 /tmp/b/strata bench $args 2>&1 | awk '/^tg/ {print $2; exit}')
echo "chain greedy: ${v:-failed}" | tee -a $OUT/log.txt
st benches | tee -a $OUT/log.txt
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 100 )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$m" \
    "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 1 256 2 \
    cluster8=STRATA_CUDA_SAMPLE_CLUSTER=8 one-block=STRATA_CUDA_SAMPLE_CLUSTER=1 > $OUT/serve.txt 2>&1
  tail -3 $OUT/serve.txt | tee -a $OUT/log.txt
  st serve | tee -a $OUT/log.txt
fi
if [ $(left) -gt 60 ]; then
  STRATA_STREAM_CHECK=1 timeout $(( $(left) - 10 )) $T --gtest_filter="-$first" --gtest_brief=1 > $OUT/tests-rest.txt 2>&1
  echo "rc=$?" >> $OUT/tests-rest.txt
  st "rest: $(grep -E '^\[  FAILED|PASSED|tests ran|rc=' $OUT/tests-rest.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
fi
