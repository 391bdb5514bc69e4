#!/usr/bin/env bash
# bench/gpu_bench.sh's llama section with stand-ins for `strata` and llama_decode: both files are made
# (Q4_0 and Q4_K), each engine runs on each, the CPU-experts pair runs on Q4_0 only, and the ratio table
# has the numbers the stand-ins printed; without LLAMA it says what is missing and runs nothing.
set -euo pipefail
bench=${STRATA_SOURCE_DIR:?}/bench/gpu_bench.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/llama/lib"
cat > "$tmp/strata" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/strata.calls"
case $1 in
  mkmodel) while [ $# -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done ;;
  bench)
    if [[ " $* " == *" 25% "* ]]; then echo "tg32            90.00 tok/s"
    elif [[ " $* " == *q4_0* ]]; then printf 'pp512         8000.00 tok/s\ntg128          500.00 tok/s\n'
    else printf 'pp512         8100.00 tok/s\ntg128          600.00 tok/s\n'; fi ;;
esac
FAKE
cat > "$tmp/llama/llama_decode" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/llama.calls"
tg=250.00; [[ $1 == *q4_0* ]] || tg=200.00
[[ " $* " == *" --cpu-moe-layers 36 "* ]] && tg=30.00
echo "rep 1 ..."
echo "{\"engine\": \"stand-in\", \"pp_tok_s\": 10000.00, \"tg_tok_s\": $tg}"
FAKE
chmod +x "$tmp/strata" "$tmp/llama/llama_decode"
out=$(MODELS=llama LLAMA="$tmp/llama" WORK="$tmp" LAYERS=2 STRATA_FIXTURES_DIR=/nonexistent "$bench" "$tmp/strata" 2>&1)
echo "$out"
[ -f "$tmp/syn-30b-l2-q4_0.gguf" ] && [ -f "$tmp/syn-30b-l2-q4k.gguf" ]
grep -q -- "--format Q4_0" "$tmp/strata.calls" && grep -q -- "--format Q4_K" "$tmp/strata.calls"
# llama.cpp: per file a warm-up and a run, and the CPU-experts run on Q4_0 only: 5 calls.
[ "$(wc -l < "$tmp/llama/llama.calls")" = 5 ] || { cat "$tmp/llama/llama.calls"; exit 1; }
[ "$(grep -c -- '--cpu-moe-layers 36' "$tmp/llama/llama.calls")" = 1 ]
grep -qF "| Q4_0 | 100% | pp 8000.0 / 10000.0 = 0.80x | tg 500.00 / 250.00 = 2.00x |" <<<"$out"
grep -qF "| Q4_K | 100% | pp 8100.0 / 10000.0 = 0.81x | tg 600.00 / 200.00 = 3.00x |" <<<"$out"
grep -qF "| Q4_0 | strata 25%, llama.cpp 36 layers of experts on the CPU | | tg 90.00 / 30.00 = 3.00x |" <<<"$out"
# Without LLAMA: a clear line, no run.
rm -f "$tmp/strata.calls"
out=$(MODELS=llama WORK="$tmp" LAYERS=2 "$bench" "$tmp/strata" 2>&1)
grep -q "LLAMA=DIR must hold llama_decode" <<<"$out"
[ ! -e "$tmp/strata.calls" ]
echo "gpu_bench llama section: ok"
