#!/usr/bin/env bash
# One device call (session 32's plan, refused then): the build, the Q4_0_X8 GPU tests, its A/B at Q4_0 (tg64, pp512, 25%
# resident), then llama.cpp's CUDA build against strata on Q2_K, IQ4_XS and Q3_K_M files (bench/gpu_bench.sh).
# Prepared HERE: scripts/device-deps (.carry/deps), scripts/llama-cuda-pack (.carry/llama), and the Qwen2
# vocabulary in .carry/fx/vocab/ (cp ../shared/fixtures/vocab/ggml-vocab-qwen2.gguf). Then the device tool:
#   run "bash scripts/device-call-x8-llama.sh", carry [".carry/deps", ".carry/fx", ".carry/llama"] (~40 MiB
#   with the tree). About 600 s on a fresh machine (build ~200 s); every step has its own limit, and the
#   llama section gets what is left of 575 s. Results in $OUT.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fx
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git diff --stat; } > $OUT/env.txt 2>&1
(bench/llama/build-llama-decode .carry/llama /tmp/ld > $OUT/llama_build.txt 2>&1) &
lb=$!
timeout 450 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
(/tmp/b/strata mkmodel -o /tmp/syn-30b-l48-q4_0.gguf --preset qwen3-30b-a3b --layers 48 --repeat-layers --format Q4_0 --vocab-from .carry/fx/vocab/ggml-vocab-qwen2.gguf -t 4 > $OUT/mkmodel.txt 2>&1) &
mk=$!
STRATA_STREAM_CHECK=1 timeout 120 /tmp/b/tests/strata_cuda_tests --gtest_filter='*Q40X8*:*Q4_0X8*:CudaMoe.*:CudaQ8Moe.*:CudaMoeGrouped.*:ExpertCacheGpu.*' > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests"; grep -E "^\[  FAILED|PASSED|rc=" $OUT/tests.txt
wait $mk $lb; st "mkmodel+llama build"; tail -1 $OUT/mkmodel.txt; tail -1 $OUT/llama_build.txt
ROUNDS=3 ARM_TIMEOUT=60 timeout 150 scripts/bench-arms /tmp/b/strata "-m /tmp/syn-30b-l48-q4_0.gguf --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" x8off=STRATA_CUDA_Q4_0_X8=0 x8on=STRATA_CUDA_Q4_0_X8=1 > $OUT/arms_tg.txt 2>&1
st "tg arms"; tail -5 $OUT/arms_tg.txt
METRIC=pp ROUNDS=2 ARM_TIMEOUT=60 timeout 100 scripts/bench-arms /tmp/b/strata "-m /tmp/syn-30b-l48-q4_0.gguf --backend cuda --adapt-every 0 --expert-cache 100% -p 512 -n 1 -r 3 --no-roofline" x8off=STRATA_CUDA_Q4_0_X8=0 x8on=STRATA_CUDA_Q4_0_X8=1 > $OUT/arms_pp.txt 2>&1
st "pp arms"; tail -5 $OUT/arms_pp.txt
# 25% resident at Q4_0, both arms once (the CPU pool + f32 chain; X8 changes the slots' layout)
for a in 0 1; do STRATA_CUDA_Q4_0_X8=$a timeout 60 /tmp/b/strata bench -m /tmp/syn-30b-l48-q4_0.gguf --backend cuda --expert-cache 25% --adapt-every 0 -p 0 -n 32 --no-roofline 2>&1 | grep -E "^tg|hit rate" | sed "s/^/x8=$a /"; done | tee $OUT/q40_25.txt
st "25%"
left=$(( 575 - ($(date +%s) - t0) ))
MODELS=llama LLAMA=/tmp/ld LLAMA_FORMATS="Q2_K IQ4_XS Q3_K_M" timeout $left bench/gpu_bench.sh /tmp/b/strata > $OUT/llama.txt 2>&1
st "llama section (limit $left s)"; grep -vE "^strata: cuda" $OUT/llama.txt | tail -25
