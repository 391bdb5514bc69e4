#!/usr/bin/env bash
# Session 45, second call: chained decode (Engine::generate over ForwardOptions::chain / defer: each decode
# step launched from the previous step's picks on the device before the host takes them). Steps: build; the
# new GPU tests with the stream checker (DecodeChainGpu.*, GpuOps.CopyI32MatchesCpu) and the tests of the
# code they touch (finish_forward's sampler split: SamplingBansGpu.* with the fixture model that call 1
# lacked, the device-sampling and logits tests); memcheck on the chain tests; then tg64 on the 48-layer Q4_0
# file in three ways, alternating: logits back to the host (the default, as llama.cpp's driver), a greedy
# pick on the device (decode_sample), chained (generate, what `strata run` does now); then the rest of the
# GPU suite while time is left.
# The device tool: run "bash scripts/device-call-s45b.sh", carry [".carry/deps", ".carry/fx"]
# (.carry/fx: the Qwen2 vocabulary and models/tiny-qwen3moe-A-Q4_K_M.*). LIMIT=S (default 570) bounds it.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - t0) )); }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
timeout 300 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 ||
  { st "BUILD FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
st built
. /tmp/b/env.sh
T=/tmp/b/tests/strata_cuda_tests
first='DecodeChainGpu.*:GpuOps.CopyI32MatchesCpu:SamplingBansGpu.*:LogitsInPlaceGpu.*:*Sampl*:*Sample*'
STRATA_STREAM_CHECK=1 timeout 150 $T --gtest_filter="$first" > $OUT/tests-chain.txt 2>&1; echo "rc=$?" >> $OUT/tests-chain.txt
st "chain tests: $(grep -E '^\[  FAILED|PASSED|rc=' $OUT/tests-chain.txt | tr '\n' ' ')"
{ timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='DecodeChainGpu.*:GpuOps.CopyI32MatchesCpu' \
    --gtest_brief=1; echo "rc=$?"; } > $OUT/memcheck-chain.txt 2>&1
st "memcheck: $(grep -E 'ERROR SUMMARY|rc=' $OUT/memcheck-chain.txt | tr '\n' ' ')"
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fx/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "model $m"
args="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline"
for r in 1 2 3; do
  for mode in logits pick chain; do
    v=$(timeout 120 /tmp/b/strata bench $args --tg-mode $mode 2>&1 | tee -a $OUT/bench-$mode.txt | awk '/^tg/ {print $2; exit}')
    echo "round $r $mode ${v:-failed}" | tee -a $OUT/bench-modes.txt
  done
done
# chain with STRATA_DECODE_CHAIN=0 (generate's plain loop: the pick mode through generate)
v=$(STRATA_DECODE_CHAIN=0 timeout 120 /tmp/b/strata bench $args --tg-mode chain 2>&1 | awk '/^tg/ {print $2; exit}')
echo "chain-off ${v:-failed}" | tee -a $OUT/bench-modes.txt
st "bench"
/tmp/b/strata bench $args --tg-mode chain 2>&1 | grep -E "host work|graphs|tg" > $OUT/bench-chain-detail.txt
/tmp/b/strata bench $args --tg-mode logits 2>&1 | grep -E "host work|graphs|tg" > $OUT/bench-logits-detail.txt
st "details"
if [ $(left) -gt 40 ]; then
  STRATA_STREAM_CHECK=1 timeout $(( $(left) - 15 )) $T --gtest_filter="-$first" --gtest_brief=1 > $OUT/tests-rest.txt 2>&1
  echo "rc=$?" >> $OUT/tests-rest.txt
  st "rest: $(grep -E '^\[  FAILED|PASSED|tests ran|rc=' $OUT/tests-rest.txt | tr '\n' ' ')"
fi
