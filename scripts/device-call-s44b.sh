#!/usr/bin/env bash
# Session 44, second device call: llama.cpp's CUDA build against strata in the same call on the 48-layer
# 30B-A3B-geometry Q4_0 file (the format: fully resident pp and tg, and llama.cpp with the experts
# of 36 layers on the CPU against strata at 25%), then the Q4_K_M file with what is left. The headline
# ratio's llama.cpp figure (269.5 tok/s) was session 36's, on another H100.
# Prepared HERE: scripts/device-deps (.carry/deps), scripts/llama-cuda-pack (.carry/llama), the Qwen2
# vocabulary in .carry/fx/vocab/. The device tool:
#   run "bash scripts/device-call-s44b.sh", carry [".carry/deps", ".carry/fx", ".carry/llama"]
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } > $OUT/env.txt 2>&1
(bench/llama/build-llama-decode .carry/llama /tmp/ld > $OUT/llama_build.txt 2>&1) &
lb=$!
timeout 300 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
wait $lb; st "llama build"; tail -1 $OUT/llama_build.txt
left=$(( ${LIMIT:-560} - ($(date +%s) - t0) ))
MODELS=llama LLAMA=/tmp/ld LLAMA_FORMATS="${LLAMA_FORMATS:-Q4_0 Q4_K_M}" timeout $left bench/gpu_bench.sh /tmp/b/strata > $OUT/llama.txt 2>&1
st "llama section (limit $left s)"; grep -vE "^strata: cuda" $OUT/llama.txt | tail -25
