#!/usr/bin/env bash
# For the session after 45 (its device time ran out before this could run): the two switches built last
# in session 45, both off by default until this has run. Build; the argmax_wide / sampler / chain tests with
# the stream checker and both switches on; tg64 on the 48-layer Q4_0 file: logits back, device pick and
# chained with both on, the device pick as it is by default (one block a row, one load at a time); strata
# run sampled (T 0.8, top-k 40) with the sampler's batched loads on and off. If the tests pass and the arms
# win, make them the defaults (pool_io.cpp launch_sampler's STRATA_CUDA_WIDE_ARGMAX, ops_sample.cu's
# g_sample_batched) and update README's rows.
# Then the rest of the GPU suite with every fixture (session 45's call 2 ran it with a partial carry).
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"] (~61 MiB with
# the tree; .carry/fix: a copy of ../shared/fixtures). LIMIT=S (default 570) bounds the call.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/log.txt 2>&1
timeout 200 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built | tee -a $OUT/log.txt
. /tmp/b/env.sh
T=/tmp/b/tests/strata_cuda_tests
first='GpuOps.Argmax*:GpuOps.Sample*:GpuOps.CopyI32MatchesCpu:DecodeChainGpu.*:SamplingBansGpu.*:*Sampl*:RowScanHost.*'
STRATA_CUDA_WIDE_ARGMAX=1 STRATA_CUDA_SAMPLE_BATCH=1 STRATA_STREAM_CHECK=1 timeout 60 $T --gtest_filter="$first" \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline"
for arm in logits pick chain pick-default; do
  mode=$arm; env="STRATA_CUDA_WIDE_ARGMAX=1 STRATA_CUDA_SAMPLE_BATCH=1"
  [ $arm = pick-default ] && { mode=pick; env="STRATA_CUDA_WIDE_ARGMAX=0 STRATA_CUDA_SAMPLE_BATCH=0"; }
  v=$(env $env timeout 60 /tmp/b/strata bench $args --tg-mode $mode 2>&1 | tee -a $OUT/bench.txt | awk '/^tg/ {print $2; exit}')
  echo "$arm ${v:-failed}" | tee -a $OUT/log.txt
done
for arm in sample-chain-batched sample-chain-default; do
  env="STRATA_CUDA_SAMPLE_BATCH=1"; [[ $arm == *default ]] && env="STRATA_CUDA_SAMPLE_BATCH=0"
  v=$(env $env timeout 60 /tmp/b/strata run -m $m --backend cuda --adapt-every 0 --expert-cache 100% -p "Once upon a time" \
      -n 128 --ignore-eos --temp 0.8 --seed 1 2>&1 >/dev/null | grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)')
  echo "run $arm ${v:-failed}" | tee -a $OUT/log.txt
done
st runs | tee -a $OUT/log.txt
if [ $(left) -gt 40 ]; then
  STRATA_STREAM_CHECK=1 timeout $(( $(left) - 10 )) $T --gtest_filter="-$first" --gtest_brief=1 > $OUT/tests-rest.txt 2>&1
  echo "rc=$?" >> $OUT/tests-rest.txt
  st "rest: $(grep -E '^\[  FAILED|PASSED|tests ran|rc=' $OUT/tests-rest.txt | tr '\n' ' ')" | tee -a $OUT/log.txt
fi
