#!/usr/bin/env bash
# One device call (session 37's work, built without a GPU): logits left in the workspace's pinned download
# buffer (Model::logits_in_place, Engine::decode_logits; STRATA_LOGITS_IN_PLACE=0 brings the host's copy of
# each 608 KB row back) and perplexity's rows scored on the engine's threads.
#   1. LogitsInPlaceGpu with the stream checker (the same bits as the copy, 100% and 50% resident);
#   2. tg64 fully resident on the 48-layer Qwen3-30B-A3B-geometry Q4_0 file, copy against in place,
#      alternating, and each arm's "host work" line (host us a pass: the part of the ~75 us gap between
#      tokens that the copy was);
#   3. `strata perplexity` on that file, 4 chunks of 512, fully resident: -t 1 (rows scored on one thread,
#      as before) against -t 16, and -t 16 with the copy.
# The device tool: run "bash scripts/device-call-logits.sh", carry [".carry/deps", ".carry/fx"].
# About 330 s after the build with the Q4_0 file missing (test ~30 s, file ~30 s, arms ~180 s, perplexity
# ~60 s); the build ~170 s on a fresh machine, less where /tmp/b is kept.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 585 - ($(date +%s) - t0) )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
# (on a warm machine an incremental build of /tmp/b, the folder scripts/device-call-qk-stack.sh built)
timeout 400 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 120 /tmp/b/tests/strata_cuda_tests --gtest_filter='LogitsInPlaceGpu.*' > $OUT/tests.txt 2>&1
echo "rc=$?" >> $OUT/tests.txt
st tests; grep -E "^\[  FAILED|PASSED|rc=" $OUT/tests.txt | head -20
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fx/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file: $(tail -n1 $OUT/mkmodel.txt 2>/dev/null)"
args="-m $f --backend cuda --adapt-every 0 --expert-cache 100%"
for arm in copy in-place; do  # one run each with the host-work line (bench-arms keeps only tok/s)
  v=$([ $arm = copy ] && echo 0 || echo 1)
  STRATA_LOGITS_IN_PLACE=$v timeout 60 /tmp/b/strata bench $args -p 0 -n 64 -r 1 --no-roofline > $OUT/host_$arm.txt 2>&1
  echo "$arm: $(grep -E '^tg' $OUT/host_$arm.txt | head -1) | $(grep -o 'host [0-9.]* us + waiting for the GPU [0-9.]* us' $OUT/host_$arm.txt | head -1)"
done
st "host work"
ROUNDS=3 ARM_TIMEOUT=60 timeout $(( $(left) - 90 )) scripts/bench-arms /tmp/b/strata "$args -p 0 -n 64 -r 2 --no-roofline" \
  copy=STRATA_LOGITS_IN_PLACE=0 in-place=STRATA_LOGITS_IN_PLACE=1 > $OUT/arms_100.txt 2>&1
st "100% arms"; tail -4 $OUT/arms_100.txt
for arm in "t1:1:1" "t16:16:1" "t16-copy:16:0"; do
  IFS=: read -r name t v <<< "$arm"
  [ "$(left)" -ge 25 ] || { st "no time left for perplexity $name"; break; }
  s=$(date +%s%N)
  STRATA_LOGITS_IN_PLACE=$v timeout $(( $(left) - 5 )) /tmp/b/strata perplexity $args -f tools/train_demo/heldout.txt \
    --ctx 512 --chunks 4 -t $t > $OUT/ppl_$name.txt 2>&1
  echo "perplexity $name: rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms | $(grep -E '^PPL' $OUT/ppl_$name.txt)"
done
st done
