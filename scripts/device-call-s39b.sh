#!/usr/bin/env bash
# Session 39, second device call (on the warm machine after scripts/device-call-suite.sh built /tmp/b): where a
# decode step of several sequences spends its time.
#   0. bench/cuda_matvec: the tensor-core q8 matvec (STRATA_CUDA_Q8_MMA, session 39) against dp4a at n = 2..8;
#   1. strata bench --parallel P (P = 1, 2, 4, 8) on the 48-layer Q4_0 file fully resident: tok/s in all,
#      and P = 8 with STRATA_CUDA_Q8_MMA 0 / 1 alternating;
#   2. per-kernel GPU time of a decode step of 8 (scripts/device-profile, PAR=8, 4 layers, Q4_0) and of 1;
#   3. the server arms of scripts/device-call-next.sh where time is left (greedy 1 / 8, mixed rules).
# The device tool: run "bash scripts/device-call-s39b.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
[ -f /tmp/b/env.sh ] || { echo "no build in /tmp/b: run scripts/device-call-suite.sh first"; exit 1; }
. /tmp/b/env.sh
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file $f"
[ -x /tmp/b/bench/cuda_matvec ] || (cd /tmp/b && ninja cuda_matvec > /dev/null 2>&1)
timeout 120 /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec.txt 2>&1; grep -E "^\| (q4_0|q6_K|q4_K) .* \| [248] \|" $OUT/cuda_matvec.txt | head -40
st "cuda_matvec"
for arm in "1 1" "2 1" "4 1" "8 1" "8 0" "8 1" "8 0" "1 1"; do
  set -- $arm
  STRATA_CUDA_Q8_MMA=$2 /tmp/b/strata bench -m "$f" --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 -r 2 \
    --parallel $1 --no-roofline 2>&1 | grep -E "^tg" | sed "s/^/P=$1 mma=$2 /"
done | tee $OUT/parallel.txt
st "parallel sweep"
for p in 8 1; do
  PAR=$p LAYERS=4 TG=4 FORMAT=Q4_0 STRATA_BIN=/tmp/b/strata OUT=$OUT/prof$p NCU_CACHE=none \
    timeout 150 scripts/device-profile 2>&1 | head -40 | tee $OUT/profile-par$p.txt
  st "profile PAR=$p"
done
left=$(( 585 - ($(date +%s) - t0) ))
[ $left -gt 120 ] && timeout $left python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 1 \
  g1=n=1,req.temperature=0 g8=req.temperature=0 \
  mix8-host=mix=1,STRATA_DEVICE_MIXED_SAMPLING=0 mix8-dev=mix=1,STRATA_DEVICE_MIXED_SAMPLING=1 2>&1 | tee $OUT/serve_arms.txt
st done
