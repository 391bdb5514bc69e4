#!/usr/bin/env bash
# The headline ratio: llama.cpp's CUDA build against strata in the same call on the 48-layer 30B-A3B-geometry
# Q4_0 file (bench/gpu_bench.sh's llama section: fully resident pp512 and tg128, and the experts of 36 layers on
# the CPU against strata at 25%). SW="VAR=value ..." sets strata switches for the whole call (a candidate
# default measured before it becomes one); LLAMA_FORMATS (default Q4_0) other files ("Q4_0 Q4_K_M": what the
# session-44 call, device-call-s44b.sh, ran; it is in git's history; device-call-llama-low-bit.sh: the low-bit
# files).
# Prepared HERE: scripts/device-deps (.carry/deps), scripts/llama-cuda-pack (.carry/llama), the Qwen2 vocabulary
# in .carry/fixv/vocab/ (deps + llama + all of .carry/fix pass the 64 MiB a call). The device tool:
#   run "SW=... bash scripts/device-call-llama-ratio.sh", carry [".carry/deps", ".carry/fixv", ".carry/llama"]
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fixv
for kv in ${SW:-}; do export "$kv"; done
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; echo "SW=${SW:-}"
  git log --oneline -1; git diff --stat; } > $OUT/env.txt 2>&1
(bench/llama/build-llama-decode .carry/llama /tmp/ld > $OUT/llama_build.txt 2>&1) &
lb=$!
timeout 300 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
wait $lb; st "llama build"; tail -1 $OUT/llama_build.txt
left=$(( ${LIMIT:-560} - ($(date +%s) - t0) ))
MODELS=llama LLAMA=/tmp/ld LLAMA_FORMATS="${LLAMA_FORMATS:-Q4_0}" timeout $left bench/gpu_bench.sh /tmp/b/strata > $OUT/llama.txt 2>&1
st "llama section (limit $left s)"; grep -vE "^strata: cuda" $OUT/llama.txt | tail -25
