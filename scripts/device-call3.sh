#!/usr/bin/env bash
# One device call: build, GPU tests, kernel benches, decode profile, short engine arms. Results: $OUT/results.tgz
set -uo pipefail
R=/tmp/r; mkdir -p $R
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
OUT=$R STEPS=tests scripts/device-gpu-run .carry/deps /tmp/b > $R/run.log 2>&1
. /tmp/b/env.sh
grep -E "^\[  FAILED|PASSED|rc=" $R/tests.txt
for b in cuda_matvec bench_attn_prep; do timeout 90 /tmp/b/bench/$b > $R/$b.txt 2>&1; echo "$b rc=$?"; done
STRATA_BIN=/tmp/b/strata LAYERS=4 TG=8 timeout 200 scripts/device-profile > $R/profile.txt 2>&1; head -20 $R/profile.txt
syn=/tmp/syn48.gguf
/tmp/b/strata mkmodel -o $syn --preset qwen3-30b-a3b --layers 48 --repeat-layers --format Q4_K --vocab-from .carry/fix/vocab/ggml-vocab-qwen2.gguf > /dev/null
for a in "100% -p 512 -n 128" "25% -p 0 -n 64"; do set -- $a
  timeout 120 /tmp/b/strata bench -m $syn --backend cuda --expert-cache $1 --adapt-every 0 ${@:2} 2>&1 | grep -v '^$' | tee -a $R/bench.txt | tail -12; done
STRATA_CUDA_GRAPHS=0 timeout 60 /tmp/b/strata bench -m $syn --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 2>&1 | grep -v '^$' | tee -a $R/bench.txt | tail -6
tar -C /tmp -czf $OUT/results.tgz r
