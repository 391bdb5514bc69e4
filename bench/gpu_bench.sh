#!/bin/bash
# The GPU backend on the synthetic Qwen3-30B-A3B-geometry model (Q4_K) and on the demo model: decode
# and prefill tok/s with the expert cache at 100% and 25% of the experts, the hit rates and the bytes
# moved, and the CPU backend on the same files in the same run for the ratio.
#   bench/gpu_bench.sh [STRATA_BINARY | BUILD_DIR]   (env: LAYERS=48, WORK=/tmp, THREADS=0 (all cores),
#                                                     PP=512, TG=128, STRATA_FIXTURES_DIR for the real vocab)
# Budget: about 6 minutes on an H200 box with 16 cores (the 48-layer file is ~17 GB: written once with
# --repeat-layers, which quantizes one layer and copies it; the CPU arms use shorter runs).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
arg="${1:-$here/../build-cuda}"
if [ -d "$arg" ]; then strata="$arg/strata"; else strata="$arg"; fi
layers="${LAYERS:-48}"
work="${WORK:-/tmp}"
threads="${THREADS:-0}"
pp="${PP:-512}"
tg="${TG:-128}"
syn="$work/syn-30b-l$layers-q4k.gguf"
demo="$here/../models/strata-demo-moe.gguf"

echo "== $(date -u +%FT%TZ) commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
echo "cores $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB, disk free $(df -BG "$work" | awk 'NR==2 {print $4}')"

if [ ! -f "$syn" ]; then
  vocab=""
  for v in "${STRATA_FIXTURES_DIR:-/nonexistent}/vocab/ggml-vocab-qwen2.gguf" \
           "$here/../../shared/fixtures/vocab/ggml-vocab-qwen2.gguf" "$here/../shared/fixtures/vocab/ggml-vocab-qwen2.gguf"; do
    [ -f "$v" ] && vocab="--vocab-from $v" && break
  done
  [ -z "$vocab" ] && vocab="--vocab 151936"
  t0=$(date +%s)
  "$strata" mkmodel -o "$syn" --preset qwen3-30b-a3b --layers "$layers" --repeat-layers --format Q4_K $vocab \
    || { echo "mkmodel failed"; exit 1; }
  echo "mkmodel: $layers layers in $(( $(date +%s) - t0 )) s, $(du -h "$syn" | cut -f1)"
fi

# One arm: name, timeout, then strata bench arguments. Prints the table and the expert-cache lines.
arm() {
  local name="$1" limit="$2"; shift 2
  echo "---- $name: strata bench $*"
  local t0=$(date +%s)
  timeout "$limit" "$strata" bench -t "$threads" "$@" 2>&1 | grep -v '^$'
  local rc=${PIPESTATUS[0]}
  echo "     ($name: exit $rc, $(( $(date +%s) - t0 )) s wall incl. load)"
}

# Time limits keep the whole run under ~6 minutes (scripts/device-gpu-run gives it 400 s).
echo "======== $(basename "$syn")"
arm "cuda 100%" 90 -m "$syn" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg"
STRATA_CUDA_GRAPHS=0 arm "cuda 100% graphs off" 60 -m "$syn" --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n "$tg"
arm "cuda 25%" 90 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n "$tg"
STRATA_POOL_SPIN_US=0 arm "cuda 25% pool spin off" 60 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n "$tg"
arm "cuda 25% adapt" 60 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 32 -p 0 -n "$tg"
arm "cpu" 60 -m "$syn" --backend cpu -p 64 -n 32
echo "======== $(basename "$demo")"
arm "cuda 100%" 30 -m "$demo" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg"
arm "cuda 25%" 30 -m "$demo" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n "$tg"
arm "cpu" 30 -m "$demo" --backend cpu -p "$pp" -n "$tg"
