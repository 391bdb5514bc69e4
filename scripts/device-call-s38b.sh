#!/usr/bin/env bash
# Session 38, second device call, on the machine scripts/device-call-s38a.sh warmed (its /tmp/b build and
# /tmp/m-*.gguf files; made here where missing): the A/B arms whose tests that call ran.
#   1. Q4_K_M tg64 fully resident: three products / STRATA_CUDA_QK_STACK=1 / and STRATA_CUDA_MATVEC_CARVEOUT=100;
#   2. Q4_0 tg64 fully resident: logits copied (STRATA_LOGITS_IN_PLACE=0) against in place, with each arm's
#      host-work line first;
#   3. perplexity, 4 chunks of 512 at Q4_0: -t 1 / -t 16 / -t 16 with the copy.
# The device tool: run "ln -sfn fix .carry/fx; bash scripts/device-call-s38b.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 585 - ($(date +%s) - t0) )); }
timeout 300 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
vocab=.carry/fix/vocab/ggml-vocab-qwen2.gguf
fk=$(scripts/device-model-30b /tmp/b/strata Q4_K_M $vocab $OUT/mkmodel_k.txt)
ROUNDS=3 ARM_TIMEOUT=50 timeout 200 scripts/bench-arms /tmp/b/strata \
  "-m $fk --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" \
  three=STRATA_CUDA_QK_STACK=0 qk-stack=STRATA_CUDA_QK_STACK=1 \
  qk-stack+carveout="STRATA_CUDA_QK_STACK=1 STRATA_CUDA_MATVEC_CARVEOUT=100" > $OUT/arms_qk.txt 2>&1
st "Q4_K_M arms"; tail -6 $OUT/arms_qk.txt
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 $vocab $OUT/mkmodel_0.txt)
args="-m $f --backend cuda --adapt-every 0 --expert-cache 100%"
for arm in copy in-place; do
  v=$([ $arm = copy ] && echo 0 || echo 1)
  STRATA_LOGITS_IN_PLACE=$v timeout 60 /tmp/b/strata bench $args -p 0 -n 64 -r 1 --no-roofline > $OUT/host_$arm.txt 2>&1
  echo "$arm: $(grep -E '^tg' $OUT/host_$arm.txt | head -1) | $(grep -o 'host [0-9.]* us + waiting for the GPU [0-9.]* us' $OUT/host_$arm.txt | head -1)"
done
st "host work"
ROUNDS=3 ARM_TIMEOUT=50 timeout $(( $(left) - 90 )) scripts/bench-arms /tmp/b/strata "$args -p 0 -n 64 -r 2 --no-roofline" \
  copy=STRATA_LOGITS_IN_PLACE=0 in-place=STRATA_LOGITS_IN_PLACE=1 > $OUT/arms_logits.txt 2>&1
st "Q4_0 arms"; tail -4 $OUT/arms_logits.txt
for arm in "t1:1:1" "t16:16:1" "t16-copy:16:0"; do
  IFS=: read -r name t v <<< "$arm"
  [ "$(left)" -ge 25 ] || { st "no time left for perplexity $name"; break; }
  s=$(date +%s%N)
  STRATA_LOGITS_IN_PLACE=$v timeout $(( $(left) - 5 )) /tmp/b/strata perplexity $args -f tools/train_demo/heldout.txt \
    --ctx 512 --chunks 4 -t $t > $OUT/ppl_$name.txt 2>&1
  echo "perplexity $name: rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms | $(grep -E '^PPL' $OUT/ppl_$name.txt)"
done
st done
