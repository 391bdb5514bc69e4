#!/bin/bash
# The GPU backend on the synthetic Qwen3-30B-A3B-geometry model (Q4_K) and on the demo model: decode
# and prefill tok/s with the expert cache at 100% and 25% of the experts, the hit rates and the bytes
# moved, and the CPU backend on the same files in the same run for the ratio.
#   bench/gpu_bench.sh [STRATA_BINARY | BUILD_DIR]   (env: LAYERS=48, WORK=/tmp, THREADS=0 (all cores),
#                                                     PP=512, TG=128, STRATA_FIXTURES_DIR for the real vocab,
#                                                     MODELS=30b,demo: the sections to run; add "next" for
#                                                     qwen3next, NEXT_LAYERS=24; "llama" with LLAMA=DIR
#                                                     for llama.cpp's CUDA build beside strata)
# The qwen3next section (MODELS=next, alone about 5 minutes): a synthetic Qwen3-Next-80B-A3B-geometry file
# (n_embd 2048, 512 experts / 10 used + shared expert, GDN 16 key / 32 value heads of 128, attention
# 16 / 2 heads of 256, every 4th layer attends) with NEXT_LAYERS layers (default 24 of the real 48: ~22 GB
# at Q4_K, so the file, the pinned expert copy and 100% resident slots fit a 128 GiB / H200 box), cuda at
# 100% and 25% of the experts resident, and the CPU arm.
# The llama section (MODELS=llama, LLAMA=DIR: the OUT of bench/llama/build-llama-decode, which has
# llama_decode and lib/): llama.cpp's prebuilt CUDA build and strata on the same 30B-A3B-geometry files at
# Q4_0 (the issue's llama.cpp reference format) and Q4_K, alternating: fully resident pp and tg, and
# llama.cpp with the experts of CPU_MOE_LAYERS (default 36) of the layers on the CPU against strata at 25%;
# then the ratios strata / llama.cpp. About 2 minutes after the files exist. LLAMA_FORMATS="Q2_K Q3_K_M IQ4_XS"
# (any `strata mkmodel --format`) runs other file types instead.
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
models=",${MODELS:-30b,demo},"
next_layers="${NEXT_LAYERS:-24}"
next="$work/syn-next80b-l$next_layers-q4k.gguf"

echo "== $(date -u +%FT%TZ) commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
echo "cores $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB, disk free $(df -BG "$work" | awk 'NR==2 {print $4}')"

vocab=""
for v in "${STRATA_FIXTURES_DIR:-/nonexistent}/vocab/ggml-vocab-qwen2.gguf" \
         "$here/../../shared/fixtures/vocab/ggml-vocab-qwen2.gguf" "$here/../shared/fixtures/vocab/ggml-vocab-qwen2.gguf"; do
  [ -f "$v" ] && vocab="--vocab-from $v" && break
done
[ -z "$vocab" ] && vocab="--vocab 151936"
# mkmodel FILE PRESET LAYERS [FORMAT]: writes FILE once (--repeat-layers: quantizes one layer of each kind,
# copies it); FORMAT default Q4_K.
mkmodel() {
  [ -f "$1" ] && return 0
  local t0=$(date +%s)
  "$strata" mkmodel -o "$1" --preset "$2" --layers "$3" --repeat-layers --format "${4:-Q4_K}" $vocab \
    || { echo "mkmodel $2 failed"; return 1; }
  echo "mkmodel $2: $3 layers in $(( $(date +%s) - t0 )) s, $(du -h "$1" | cut -f1)"
}

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
if [[ $models == *,30b,* ]] && mkmodel "$syn" qwen3-30b-a3b "$layers"; then
  echo "======== $(basename "$syn")"
  arm "cuda 100%" 90 -m "$syn" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg"
  STRATA_CUDA_GRAPHS=0 arm "cuda 100% graphs off" 60 -m "$syn" --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n "$tg"
  arm "cuda 25%" 90 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n "$tg"
  arm "cuda 25% prefill-stream auto" 60 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n 0 \
    --prefill-stream auto
  STRATA_POOL_SPIN_US=0 arm "cuda 25% pool spin off" 60 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n "$tg"
  arm "cuda 25% adapt" 60 -m "$syn" --backend cuda --expert-cache 25% --adapt-every 32 -p 0 -n "$tg"
  arm "cpu" 60 -m "$syn" --backend cpu -p 64 -n 32
fi
if [[ $models == *,demo,* ]]; then
  echo "======== $(basename "$demo")"
  arm "cuda 100%" 30 -m "$demo" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg"
  arm "cuda 25%" 30 -m "$demo" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n "$tg"
  arm "cpu" 30 -m "$demo" --backend cpu -p "$pp" -n "$tg"
fi
if [[ $models == *,next,* ]] && mkmodel "$next" qwen3-next-80b-a3b "$next_layers"; then
  echo "======== $(basename "$next") (qwen3next, $next_layers of 48 layers)"
  arm "cuda 100%" 120 -m "$next" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg"
  arm "cuda 25%" 120 -m "$next" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n "$tg"
  arm "cuda 25% prefill-stream auto" 90 -m "$next" --backend cuda --expert-cache 25% --adapt-every 0 -p "$pp" -n 0 \
    --prefill-stream auto
  arm "cpu" 90 -m "$next" --backend cpu -p 64 -n 32
fi
if [[ $models == *,llama,* ]]; then
  llama="${LLAMA:-}"
  cpu_moe="${CPU_MOE_LAYERS:-36}"
  if [ ! -x "$llama/llama_decode" ]; then
    echo "llama: LLAMA=DIR must hold llama_decode and lib/ (bench/llama/build-llama-decode PACK DIR)"
  else
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
    export CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}"  # its PTX compiled once, then cached
    num() { sed -E "s/.*\"$2\": ?([0-9.]+).*/\1/" <<<"$1"; }
    tok() { awk -v k="$1" '$1 ~ "^"k"[0-9]+$" && $3 == "tok/s" {print $2; exit}'; }
    ratios=()
    for fmt in ${LLAMA_FORMATS:-Q4_0 Q4_K}; do
      f="$work/syn-30b-l$layers-$(tr 'A-Z' 'a-z' <<<"$fmt").gguf"
      [ "$fmt" = Q4_K ] && f="$syn"
      mkmodel "$f" qwen3-30b-a3b "$layers" "$fmt" || continue
      echo "======== $(basename "$f"): llama.cpp (CUDA) and strata"
      # (the first llama.cpp run of a machine compiles its PTX: a short run first, not counted)
      timeout 300 "$llama/llama_decode" "$f" --backends "$llama/lib" -p 16 -n 4 -r 1 > /dev/null 2>&1
      l=$(timeout 150 "$llama/llama_decode" "$f" --backends "$llama/lib" -p "$pp" -n "$tg" -r 2 2>/dev/null | grep '^{')
      echo "llama.cpp 100%: ${l:-failed}"
      s=$(timeout 150 "$strata" bench -m "$f" --backend cuda --expert-cache 100% --adapt-every 0 -p "$pp" -n "$tg" -r 2 2>&1)
      grep -E '^(pp|tg)[0-9]|hit rate' <<<"$s"
      [ -n "$l" ] && ratios+=("$(awk -v f="$fmt" -v sp="$(tok pp <<<"$s")" -v st="$(tok tg <<<"$s")" \
        -v lp="$(num "$l" pp_tok_s)" -v lt="$(num "$l" tg_tok_s)" 'BEGIN {
        printf "| %s | 100%% | pp %.1f / %.1f = %.2fx | tg %.2f / %.2f = %.2fx |", f, sp, lp, (lp > 0 ? sp / lp : 0),
               st, lt, (lt > 0 ? st / lt : 0) }')")
      [ "$fmt" = Q4_0 ] || continue
      l=$(timeout 200 "$llama/llama_decode" "$f" --backends "$llama/lib" -p 0 -n 32 -r 2 -t "$(nproc)" \
            --cpu-moe-layers "$cpu_moe" 2>/dev/null | grep '^{')
      echo "llama.cpp, experts of $cpu_moe layers on the CPU: ${l:-failed}"
      s=$(timeout 150 "$strata" bench -t "$threads" -m "$f" --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n 32 2>&1)
      grep -E '^tg[0-9]|hit rate' <<<"$s"
      [ -n "$l" ] && ratios+=("$(awk -v f="$fmt" -v c="$cpu_moe" -v st="$(tok tg <<<"$s")" -v lt="$(num "$l" tg_tok_s)" \
        'BEGIN { printf "| %s | strata 25%%, llama.cpp %d layers of experts on the CPU | | tg %.2f / %.2f = %.2fx |",
                 f, c, st, lt, (lt > 0 ? st / lt : 0) }')")
    done
    if ((${#ratios[@]})); then
      echo "| file | residency | prefill strata / llama.cpp | decode strata / llama.cpp |"
      echo "|---|---|---|---|"
      printf '%s\n' "${ratios[@]}"
    fi
  fi
fi
