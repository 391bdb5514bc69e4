#!/usr/bin/env bash
# One device call: llama.cpp's CUDA build against strata on Q2_K, IQ4_XS and Q3_K_M files of the 48-layer
# Qwen3-30B-A3B geometry (bench/gpu_bench.sh's llama section: fully resident pp and tg, and llama.cpp with the
# experts of 36 layers on the CPU against strata at 25%), now that the low-bit int8 decode kernels are
# strata's default (session 35). The Q4_0_X8 A/B this script held before was measured in sessions 34-35.
# LLAMA_FORMATS="Q4_0 Q2_K IQ4_XS" (session 36) picks other files.
# Prepared HERE: scripts/device-deps (.carry/deps), scripts/llama-cuda-pack (.carry/llama), and the Qwen2
# vocabulary in .carry/fx/vocab/ (cp ../shared/fixtures/vocab/ggml-vocab-qwen2.gguf). Then the device tool:
#   run "bash scripts/device-call-llama-low-bit.sh", carry [".carry/deps", ".carry/fx", ".carry/llama"]
#   (~40 MiB with the tree). Build ~200 s (the llama driver builds beside it); the llama section gets what
#   is left of 575 s. Results in $OUT.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git diff --stat; } > $OUT/env.txt 2>&1
(bench/llama/build-llama-decode .carry/llama /tmp/ld > $OUT/llama_build.txt 2>&1) &
lb=$!
timeout 450 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
wait $lb; st "llama build"; tail -1 $OUT/llama_build.txt
left=$(( 575 - ($(date +%s) - t0) ))
MODELS=llama LLAMA=/tmp/ld LLAMA_FORMATS="${LLAMA_FORMATS:-Q2_K IQ4_XS Q3_K_M}" timeout $left bench/gpu_bench.sh /tmp/b/strata > $OUT/llama.txt 2>&1
st "llama section (limit $left s)"; grep -vE "^strata: cuda" $OUT/llama.txt | tail -25
