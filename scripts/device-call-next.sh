#!/usr/bin/env bash
# Owed since session 51 (bench/results/2026-12-07-gpu-session51-h100.md). Session 52 ran only the new tests
# (all passed on an H100, bench/results/2026-12-07-gpu-session52-h100.md); the A/Bs below are still owed.
#  1. STRATA_CUDA_ATTN_DECODE_TILES (ops::set_attn_decode_tiles, built without a GPU): a one-token decode's split
#     walks at least N K/V tiles, so contexts up to N x 64 positions take one split and no combine launch. The H100
#     trace put the combine at a ~5.2 us step a layer past 64 positions, and the headline (bench/gpu_bench.sh
#     against llama.cpp) is tg128: positions 65-128 pay it. Its test (GpuAttention.DecodeTilesASplit) with the
#     others below, then tg128 (N 1 against 2) and tg512 (1, 2, 4, 8), then the attention and model tests with
#     the switches on for the whole process while time lasts.
#     With it, STRATA_CUDA_ATTN_CLUSTER_MERGE=1 (ops::set_attn_cluster_merge, also built without a GPU): the splits'
#     blocks (2-8) run as one cluster and merge their states themselves with the combine's bits
#     (GpuOpsFused.PrepAttentionEqualsPrepThenAttention, GpuAttention.DecodeClusterMerge), as arms of the same A/B.
#  2. GpuOps.SampleClusterPicksUnderJitter ran once (1440 picks equal); again with the sampler tests.
#  3. STRATA_CUDA_SAMPLE_DEEP_WARP=1 (ops::set_sample_deep_warp, session 52, built without a GPU): the deep search's
#     bin pick by warp 0 instead of thread 0's walk of 256 bins. Its tests (GpuOps.SampleDeepWarp*: the same picks
#     as thread 0's), then an A/B of sampled decode over the whole vocabulary (top-k off), where it would show.
#  4. If time is left: ncu on one whole-vocabulary sampler launch (clusters of 8 against one block), where the
#     ~0.12 ms of a whole-vocabulary draw that does not shrink with more blocks goes.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first="GpuAttention.*:GpuOpsFused.*:GpuOps.Sample*:DecodeChainGpu.*"  # (GpuOps.SampleDeepWarp* among them)
STRATA_STREAM_CHECK=1 timeout 120 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
base="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 --no-roofline --tg-mode chain"
ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$base -r 2 -n 128" tiles-1=- \
  tiles-2=STRATA_CUDA_ATTN_DECODE_TILES=2 merge=STRATA_CUDA_ATTN_CLUSTER_MERGE=1 > $OUT/arms-tg128.txt 2>&1
echo "tg128 (greedy, chained):" | tee -a $OUT/log.txt; tail -5 $OUT/arms-tg128.txt | tee -a $OUT/log.txt
draw_all="--tg-temp 0.8 --tg-top-k 0 --tg-top-p 1 --tg-min-p 0"  # over the whole vocabulary
if [ $(left) -gt 150 ]; then
  ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$base -r 2 -n 64 $draw_all" deep-thread=- \
    deep-warp=STRATA_CUDA_SAMPLE_DEEP_WARP=1 > $OUT/arms-deep-warp.txt 2>&1
  echo "tg64 whole-vocabulary draw:" | tee -a $OUT/log.txt; tail -4 $OUT/arms-deep-warp.txt | tee -a $OUT/log.txt
fi
if [ $(left) -gt 170 ]; then
  ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$base -r 1 -n 512" tiles-1=- \
    tiles-2=STRATA_CUDA_ATTN_DECODE_TILES=2 tiles-4=STRATA_CUDA_ATTN_DECODE_TILES=4 \
    tiles-8=STRATA_CUDA_ATTN_DECODE_TILES=8 merge=STRATA_CUDA_ATTN_CLUSTER_MERGE=1 \
    merge-tiles-2="STRATA_CUDA_ATTN_CLUSTER_MERGE=1 STRATA_CUDA_ATTN_DECODE_TILES=2" > $OUT/arms-tg512.txt 2>&1
  echo "tg512 (greedy, chained):" | tee -a $OUT/log.txt; tail -8 $OUT/arms-tg512.txt | tee -a $OUT/log.txt
fi
# The attention and model tests with each switch on for the whole process (their figures are set for the defaults).
whole="GpuAttention.*:GpuOpsFused.*:DecodeChainGpu.*:Qwen3MoeGpuGraphs.*:Qwen3MoeGpuAll.*"
for sw in STRATA_CUDA_ATTN_DECODE_TILES=2 STRATA_CUDA_ATTN_CLUSTER_MERGE=1; do
  [ $(left) -gt 75 ] || break
  f=$OUT/tests-${sw%%=*}.txt
  env $sw STRATA_STREAM_CHECK=1 timeout 65 $T --gtest_filter="$whole" > $f 2>&1
  echo "rc=$?" >> $f
  st "tests, $sw: $(grep -E '^\[  FAILED|PASSED|rc=' $f | tr '\n' ' ')" | tee -a $OUT/log.txt
done
ncu_run() {  # NAME SECTIONS... (env set by the caller)
  local name=$1; shift
  STRATA_CUDA_GRAPHS=0 timeout 80 ncu --clock-control none --kernel-name sample_kernel --launch-skip 4 --launch-count 1 "$@" \
    /tmp/b/strata bench $base -n 8 --warmup 0 -r 1 $draw_all > $OUT/ncu-$name.txt 2>&1
  echo "ncu $name: rc=$? $(grep -E 'Duration|Registers Per|Cluster Size' $OUT/ncu-$name.txt | tr -s ' ' | tr '\n' ' ')" \
    | tee -a $OUT/log.txt
}
if [ $(left) -gt 170 ]; then
  STRATA_CUDA_SAMPLE_CLUSTER=1 ncu_run one-block --section SpeedOfLight --section LaunchStats
  ncu_run cluster8 --section SpeedOfLight --section LaunchStats --section WarpStateStats --section SourceCounters
fi
st benches | tee -a $OUT/log.txt
