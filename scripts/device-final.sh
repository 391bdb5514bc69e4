#!/usr/bin/env bash
# The lead's last device call of a session: build, the GPU tests touched since the last full run, the
# CPU pool bench, and the engine arms (Qwen3-30B-A3B and Qwen3-Next-80B-A3B geometry, synthetic Q4_K).
# Results: $OUT/results.tgz. Env: TESTS (gtest filter), NEXT_LAYERS (default 12).
set -uo pipefail
R=/tmp/r; rm -rf $R; mkdir -p $R
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; tar -C /tmp -czf $OUT/results.tgz r; }  # results so far, if cut off
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
OUT=$R STEPS=tests,cpubench FILTER="${TESTS:-*}" scripts/device-gpu-run .carry/deps /tmp/b > $R/run.log 2>&1
. /tmp/b/env.sh
stamp built+tests; grep -E "^\[  FAILED|PASSED|rc=" $R/tests.txt
STRATA_CUDA_Q8=0 STRATA_STREAM_CHECK=1 timeout 30 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='AllTypes/Qwen3MoeGpu.FastDecodeSizedPassesWithinLlamaCppKl/6' > $R/q8off.txt 2>&1
grep "chunked" $R/q8off.txt
grep -E "MoeExperts|Memcpy|Pool" $R/cpubench.txt | head -30
S=/tmp/b/strata; vocab=.carry/fix/vocab/ggml-vocab-qwen2.gguf
arm() { local name=$1 lim=$2; shift 2; echo "---- $name: strata bench $*" >> $R/bench.txt
  timeout $lim $S bench -t 0 "$@" 2>&1 | grep -v '^$' >> $R/bench.txt; echo "     (exit $?)" >> $R/bench.txt; }
syn=/tmp/syn48.gguf
$S mkmodel -o $syn --preset qwen3-30b-a3b --layers 48 --repeat-layers --format Q4_K --vocab-from $vocab > /dev/null
stamp mkmodel30b
arm "30b cuda 100%" 60 -m $syn --backend cuda --expert-cache 100% --adapt-every 0 -p 512 -n 128
arm "30b cuda 25%" 60 -m $syn --backend cuda --expert-cache 25% --adapt-every 0 -p 512 -n 64
STRATA_CUDA_GRAPHS=0 arm "30b cuda 25% graphs off" 40 -m $syn --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n 32
STRATA_CUDA_Q8=0 arm "30b cuda 100% q8 off" 40 -m $syn --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64
arm "30b cpu" 40 -m $syn --backend cpu -p 0 -n 16
stamp 30b-arms
rm -f $syn
nxt=/tmp/next.gguf
$S mkmodel -o $nxt --preset qwen3-next-80b-a3b --layers ${NEXT_LAYERS:-12} --repeat-layers --format Q4_K --vocab-from $vocab > /dev/null
stamp mkmodel-next
arm "next cuda 100%" 60 -m $nxt --backend cuda --expert-cache 100% --adapt-every 0 -p 512 -n 64
arm "next cuda 25%" 60 -m $nxt --backend cuda --expert-cache 25% --adapt-every 0 -p 512 -n 32
arm "next cpu" 40 -m $nxt --backend cpu -p 0 -n 16
stamp done
grep -E "^----|^pp|^tg|host work|hit rate|exit" $R/bench.txt
stamp packed
