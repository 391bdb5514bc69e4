#!/usr/bin/env bash
# Session 51, last call: the cluster sampler's merges under shuffled block timing (GpuOps.SampleClusterPicksUnderJitter,
# set_sample_cluster_jitter), since racecheck stops with an internal error on distributed shared memory; then the
# sampler tests again, and racecheck on the one-block sampler (STRATA_CUDA_SAMPLE_CLUSTER=1) while time lasts.
# The device tool: run "LIMIT=S bash scripts/device-call-jitter.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
. scripts/device-call-start strata_cuda_tests
STRATA_STREAM_CHECK=1 timeout 60 $T --gtest_filter='GpuOps.SampleCluster*' > $OUT/jitter.txt 2>&1
echo "rc=$?" >> $OUT/jitter.txt
st "cluster tests: $(grep -E '^\[  FAILED|OK \] GpuOps.SampleClusterPicksUnderJitter|PASSED|rc=' $OUT/jitter.txt | tr '\n' ' ')" \
  | tee -a $OUT/log.txt
if [ $(left) -gt 40 ]; then
  STRATA_STREAM_CHECK=1 timeout 40 $T --gtest_filter='GpuOps.Sample*:-GpuOps.SampleCluster*' > $OUT/tests.txt 2>&1
  echo "rc=$?" >> $OUT/tests.txt
  st "other sampler tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
fi
for t in GpuOps.SampleDeepAggRacecheckProbe GpuOps.SampleRowsFollowsEachRowsRule; do
  [ $(left) -gt 35 ] || break
  STRATA_CUDA_SAMPLE_CLUSTER=1 timeout $(( $(left) - 5 )) compute-sanitizer --tool racecheck $T --gtest_filter=$t \
    > $OUT/racecheck-$t.txt 2>&1
  echo "rc=$?" >> $OUT/racecheck-$t.txt
  st "racecheck (one block) $t: $(grep -E 'RACECHECK SUMMARY|PASSED|FAILED|rc=' $OUT/racecheck-$t.txt | tr '\n' ' ')" \
    | tee -a $OUT/log.txt
done
st done | tee -a $OUT/log.txt
