#!/usr/bin/env bash
# Session 46, call 3 (short: the session's last device time). The sampler's bin search by a warp (pick_bin)
# and the batched row loads on by default. Build; the sampler / argmax / chain tests with the stream checker;
# ncu's duration of each sampler kernel in a sampled decode step; the sampled chained decode (T 0.8) with
# the prefilter on and off against the greedy chain, alternating.
# The device tool: run "bash scripts/device-call-s46c.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata strata_cuda_tests
first='GpuOps.Argmax*:GpuOps.Sample*:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*'
STRATA_STREAM_CHECK=1 timeout 90 $T --gtest_filter="$first" > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
grep -E '^\[(sample|prefilter)\]' $OUT/tests.txt | head -6 | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline --tg-mode chain"
ROUNDS=2 ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$args --tg-temp 0.8" prefilter=- \
  whole-row="STRATA_CUDA_SAMPLE_PREFILTER=0" > $OUT/arms-sampled.txt 2>&1
tail -5 $OUT/arms-sampled.txt | tee -a $OUT/log.txt
v=$(timeout 60 /tmp/b/strata bench $args 2>&1 | awk '/^tg/ {print $2; exit}'); echo "greedy-chain ${v:-failed}" | tee -a $OUT/log.txt
st benches | tee -a $OUT/log.txt
[ $(left) -gt 60 ] && timeout $(( $(left) - 15 )) ncu --clock-control none --kernel-name regex:'sample|argmax' \
  --launch-skip 12 --launch-count 6 --metrics gpu__time_duration.sum \
  /tmp/b/strata bench ${args/-n 64 -r 2/-n 8 -r 1} --tg-temp 0.8 > $OUT/ncu.txt 2>&1
grep -E "sample_cand_kernel|sample_kernel|gpu__time_duration" $OUT/ncu.txt | head -14 | tee -a $OUT/log.txt
st done | tee -a $OUT/log.txt
