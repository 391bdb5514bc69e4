#!/usr/bin/env bash
# Why racecheck runs past its limits on the sampler probes (session 51: GpuOps.SampleClusterRacecheckProbe and
# GpuOps.SampleDeepAggRacecheckProbe, 16 and 8 launches of 4099 values, 9-10 ms natively, past 90 s each under
# racecheck). Slowness or a hang under the tool? In order:
#  1. the deep-agg probe with one block a row (STRATA_CUDA_SAMPLE_CLUSTER=1): no cluster in it;
#  2. the cluster probe with only the first sample_kernel launch checked (the rest run natively);
#  3. the next few launches one at a time, while time lasts;
#  4. synccheck (invalid barrier use) on the cluster probe.
# The device tool: run "bash scripts/device-call-racecheck.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata_cuda_tests
rc_line() { echo "$(grep -E 'RACECHECK SUMMARY|SYNCCHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|rc=' $1 | tr '\n' ' ')"; }
san() {  # NAME SECONDS ARGS...: one compute-sanitizer run, its time and summary into the log
  local name=$1 secs=$2; shift 2
  local s=$(date +%s)
  timeout $secs compute-sanitizer "$@" > $OUT/$name.txt 2>&1
  echo "rc=$?" >> $OUT/$name.txt
  st "$name ($(( $(date +%s) - s )) s): $(rc_line $OUT/$name.txt)" | tee -a $OUT/log.txt
}
probe=GpuOps.SampleClusterRacecheckProbe
STRATA_CUDA_SAMPLE_CLUSTER=1 san deepagg-one-block 80 --tool racecheck $T --gtest_filter=GpuOps.SampleDeepAggRacecheckProbe
san cluster-launch0 80 --tool racecheck --kernel-name kns=sample_kernel --launch-count 1 $T --gtest_filter=$probe
for k in 1 2 3; do
  [ $(left) -gt 150 ] || break
  san cluster-launch$k 60 --tool racecheck --kernel-name kns=sample_kernel --launch-skip $k --launch-count 1 \
    $T --gtest_filter=$probe
done
[ $(left) -gt 70 ] && san cluster-synccheck 60 --tool synccheck $T --gtest_filter=$probe
st done | tee -a $OUT/log.txt
