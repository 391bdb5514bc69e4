#!/usr/bin/env bash
# The least of scripts/device-call-next.sh, for a session with little device time left: the build, the tests of
# the code built without a GPU (session 51's decode tiles and cluster merge, session 52's deep warp pick, the
# cluster sampler's jitter test), then while time lasts one round of the tg128 A/B (1 tile / 2 tiles / merge)
# and of the whole-vocabulary draw (deep pick by thread 0 / warp 0). LIMIT=S (default 280).
# The device tool: run "bash scripts/device-call-lean.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
LIMIT=${LIMIT:-280}
. scripts/device-call-start strata strata_cuda_tests
new="GpuAttention.DecodeTilesASplit:GpuAttention.DecodeClusterMerge:GpuOpsFused.PrepAttentionEqualsPrepThenAttention"
new+=":GpuOps.SampleDeepWarp*:GpuOps.SampleClusterPicksUnderJitter:GpuAttention.DecodeQwen3"
STRATA_STREAM_CHECK=1 timeout 60 $T --gtest_filter="$new" > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
[ $(left) -gt 100 ] || exit 0
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
st "model" | tee -a $OUT/log.txt
base="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 --no-roofline --tg-mode chain"
ROUNDS=1 ARM_TIMEOUT=40 scripts/bench-arms /tmp/b/strata "$base -r 2 -n 128" tiles-1=- \
  tiles-2=STRATA_CUDA_ATTN_DECODE_TILES=2 merge=STRATA_CUDA_ATTN_CLUSTER_MERGE=1 > $OUT/arms-tg128.txt 2>&1
echo "tg128 (greedy, chained):" | tee -a $OUT/log.txt; tail -5 $OUT/arms-tg128.txt | tee -a $OUT/log.txt
[ $(left) -gt 45 ] || exit 0
draw_all="--tg-temp 0.8 --tg-top-k 0 --tg-top-p 1 --tg-min-p 0"  # over the whole vocabulary
ROUNDS=1 ARM_TIMEOUT=30 scripts/bench-arms /tmp/b/strata "$base -r 1 -n 64 $draw_all" deep-thread=- \
  deep-warp=STRATA_CUDA_SAMPLE_DEEP_WARP=1 > $OUT/arms-deep-warp.txt 2>&1
echo "tg64 whole-vocabulary draw:" | tee -a $OUT/log.txt; tail -4 $OUT/arms-deep-warp.txt | tee -a $OUT/log.txt
st done | tee -a $OUT/log.txt
