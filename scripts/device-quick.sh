#!/usr/bin/env bash
# One short device call (lead's iteration loop): build, chosen GPU tests (FILTER), the q8 kernel table,
# the decode profile, and two short engine arms on the 48-layer synthetic file. Results: $OUT/results.tgz
set -uo pipefail
R=/tmp/r; rm -rf $R; mkdir -p $R
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
OUT=$R STEPS=${STEPS:-tests} FILTER=${FILTER:-*} scripts/device-gpu-run .carry/deps /tmp/b > $R/run.log 2>&1
. /tmp/b/env.sh
grep -E "^\[  FAILED|PASSED|rc=" $R/tests.txt
timeout 90 /tmp/b/bench/cuda_matvec > $R/cuda_matvec.txt 2>&1; echo "cuda_matvec rc=$?"
STRATA_BIN=/tmp/b/strata LAYERS=4 TG=8 timeout 200 scripts/device-profile > $R/profile.txt 2>&1; head -16 $R/profile.txt
syn=/tmp/syn48.gguf
/tmp/b/strata mkmodel -o $syn --preset qwen3-30b-a3b --layers 48 --repeat-layers --format Q4_K --vocab-from .carry/fix/vocab/ggml-vocab-qwen2.gguf > /dev/null
for a in "100% -p 512 -n 64" "25% -p 0 -n 32"; do set -- $a
  timeout 120 /tmp/b/strata bench -m $syn --backend cuda --expert-cache $1 --adapt-every 0 ${@:2} 2>&1 | grep -v '^$' | tee -a $R/bench.txt | grep -E "^tg|^pp|host work"; done
tar -C /tmp -czf $OUT/results.tgz r
