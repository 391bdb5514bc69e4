#!/bin/bash
# strata vs llama.cpp on the same GGUF file, in the same command: prefill (ppN) and decode (tgN) tok/s.
#   bench/compare.sh MODEL.gguf [THREADS] [PP] [TG] [REPS]
# llama.cpp is the prebuilt CPU build in the npm package node-llama-cpp (bench/llama, installed with
# `npm ci --prefix bench/llama` on first use; it loads offline). Prints both JSON lines and a markdown
# row with the ratios strata / llama.cpp (> 1: strata is faster) and both decodes as a share of the
# decode roofline strata's bench measured.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="$1"; threads="${2:-2}"; pp="${3:-512}"; tg="${4:-128}"; reps="${5:-1}"
strata="${STRATA:-$here/../build/strata}"
if [ ! -d "$here/llama/node_modules/node-llama-cpp" ]; then
  (cd "$here/llama" && npm ci --no-audit --no-fund >/dev/null)
fi
s_json="$("$strata" bench -m "$model" -t "$threads" -p "$pp" -n "$tg" -r "$reps" --json)"
echo "strata:    $s_json"
vocab="$(echo "$s_json" | sed -E 's/.*"n_vocab": ([0-9]+).*/\1/')"
l_json="$(node "$here/llama/llama_bench.mjs" "$model" -t "$threads" -p "$pp" -n "$tg" --reps "$reps" --vocab "$vocab")"
echo "llama.cpp: $l_json"
num() { echo "$1" | sed -E "s/.*\"$2\": ?([0-9.eE+-]+).*/\1/"; }
sp="$(num "$s_json" pp_tok_s)"; st="$(num "$s_json" tg_tok_s)"
lp="$(num "$l_json" pp_tok_s)"; lt="$(num "$l_json" tg_tok_s)"
# The decode roofline strata measured in its run (weight bytes a token reads / host read bandwidth):
# both engines' tg as a share of it.
rf="$(num "$s_json" tg_roofline_tok_s)"
awk -v sp="$sp" -v st="$st" -v lp="$lp" -v lt="$lt" -v rf="$rf" -v m="$(basename "$model")" -v t="$threads" -v pp="$pp" -v tg="$tg" 'BEGIN {
  printf "| %s | %d | pp%d %.2f / %.2f = **%.2fx** | tg%d %.2f / %.2f = **%.2fx** |", m, t, pp, sp, lp, (lp > 0 ? sp / lp : 0), tg, st, lt, (lt > 0 ? st / lt : 0)
  if (rf > 0) printf " roofline %.1f tok/s: strata %.0f%%, llama.cpp %.0f%% |", rf, 100 * st / rf, 100 * lt / rf
  printf "\n" }'
