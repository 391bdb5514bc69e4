#!/usr/bin/env bash
# Owed since session 50 (bench/results/2026-12-07-gpu-session50-h100.md). That session made clusters of 8 the
# device sampler's default (STRATA_CUDA_SAMPLE_CLUSTER=8: a whole-vocabulary draw 531 tok/s against 384 with one
# block, top-k 40 and greedy unchanged), but two checks were left:
#  - racecheck ran past its limits on the cluster and deep-agg tests (even the 4099-value ones): the probes
#    GpuOps.SampleClusterRacecheckProbe and GpuOps.SampleDeepAggRacecheckProbe are a few launches each;
#  - batches of many rows (sample_rows in server steps, strata bench --parallel): each row's 8 blocks also take
#    SMs, where the rows alone might fill them. The A/B below (1 against 8, top-k 40 and top-k off, 16 and 64
#    sequences) says whether the default should fall back to fewer blocks a row for large batches.
# Then ncu on one whole-vocabulary sampler launch (clusters of 8 against one block: where the ~0.2 ms over a
# top-k 40 step goes), the greedy and sampled single-sequence figures, and the sampler tests (with the probes).
# A second call on the warm machine: scripts/device-call-trace.sh (the per-kernel decode breakdown).
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first="GpuOps.Argmax*:GpuOps.Sample*:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*:WarpMergeHost.*:MassPiecesHost.*"
STRATA_STREAM_CHECK=1 timeout 150 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
for t in GpuOps.SampleClusterRacecheckProbe GpuOps.SampleDeepAggRacecheckProbe; do
  [ $(left) -gt 330 ] || break
  timeout 90 compute-sanitizer --tool racecheck $T --gtest_filter=$t > $OUT/racecheck-$t.txt 2>&1
  echo "rc=$?" >> $OUT/racecheck-$t.txt
  st "racecheck $t: $(grep -E 'RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/racecheck-$t.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
done
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
base="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 --no-roofline --tg-mode chain"
draw_all="--tg-temp 0.8 --tg-top-k 0 --tg-top-p 1 --tg-min-p 0"  # over the whole vocabulary
arms_par() {  # P: clusters of 8 against one block at --parallel P, top-k 40 and over the whole vocabulary
  for rule in "--tg-temp 0.8" "$draw_all"; do
    [ $(left) -gt 120 ] || return
    local f=$OUT/arms-par$1-$(echo $rule | wc -w).txt
    ROUNDS=2 ARM_TIMEOUT=90 scripts/bench-arms /tmp/b/strata "$base -r 2 -n 32 --parallel $1 $rule" \
      cluster8=- one-block="STRATA_CUDA_SAMPLE_CLUSTER=1" > $f 2>&1
    echo "parallel $1, $rule:" | tee -a $OUT/log.txt
    tail -3 $f | tee -a $OUT/log.txt
  done
}
arms_par 64
# Where the whole-vocabulary draw's ~0.2 ms (over a top-k 40 step) goes with clusters of 8: ncu on one sampler
# launch (graphs off), its duration with 8 and with 1, and for 8 the warp stalls and the hottest source lines.
ncu_run() {  # NAME SECTIONS... (env set by the caller)
  local name=$1; shift
  STRATA_CUDA_GRAPHS=0 timeout 90 ncu --clock-control none --kernel-name sample_kernel --launch-skip 4 --launch-count 1 "$@" \
    /tmp/b/strata bench $base -n 8 --warmup 0 -r 1 $draw_all > $OUT/ncu-$name.txt 2>&1
  echo "ncu $name: rc=$? $(grep -E 'Duration|Registers Per|Cluster Size' $OUT/ncu-$name.txt | tr -s ' ' | tr '\n' ' ')" \
    | tee -a $OUT/log.txt
}
if [ $(left) -gt 150 ]; then
  STRATA_CUDA_SAMPLE_CLUSTER=1 ncu_run one-block --section SpeedOfLight --section LaunchStats
  ncu_run cluster8 --section SpeedOfLight --section LaunchStats --section WarpStateStats --section SourceCounters
fi
for rule in "" "--tg-temp 0.8" "$draw_all"; do
  [ $(left) -gt 40 ] || break
  v=$(timeout 60 /tmp/b/strata bench $base -r 2 -n 64 $rule 2>&1 | awk '/^tg/ {print $2; exit}')
  echo "chain ${rule:-greedy}: ${v:-failed}" | tee -a $OUT/log.txt
done
arms_par 16
st benches | tee -a $OUT/log.txt
