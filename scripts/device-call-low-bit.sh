#!/usr/bin/env bash
# One device call (session 33's plan, written without a GPU): the low-bit formats' int8 decode kernels
# (Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ2_*, IQ3_*, IQ1_*; STRATA_CUDA_Q8_LOW_BIT, off by default). The build; their tests (host runs,
# GPU kernels against the CPU references, the fixtures' KL with them on and off); bench/cuda/cuda_matvec (each
# format's int8 kernel against its f32 path, same process, per shape); tg64 with the switch off/on
# alternating on 48-layer 30B-A3B-geometry Q2_K, Q3_K_M and IQ4_XS files. llama.cpp does not fit in this call's
# carry (64 MiB): scripts/device-call-llama-low-bit.sh runs it on the same three files beside strata's default (the
# switch off), so its ratio times this call's on/off ratio is the estimate until one call runs all three.
# Prepared HERE: scripts/device-deps (.carry/deps), and the fixtures the tests read (qwen3moe models, vocab,
# formats; ~27 MiB):
#   rm -rf .carry/fxq && mkdir -p .carry/fxq/models && cp -r ../shared/fixtures/{vocab,formats} .carry/fxq/ &&
#   cp ../shared/fixtures/models/tiny-qwen3moe-A-* .carry/fxq/models/
# Then the device tool: run "bash scripts/device-call-low-bit.sh", carry [".carry/deps", ".carry/fxq"].
# Up to ~580 s on a fresh machine (build ~200 s, tests ~60-150 s, cuda_matvec <= 120 s, then per file, while
# at least 150 s are left, its writing and ~100 s of arms: Q2_K, IQ4_XS, then Q3_K_M). Results in $OUT.
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fxq
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git diff --stat; } > $OUT/env.txt 2>&1
timeout 450 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests cuda_matvec > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
mk() {  # FORMAT -> /tmp/low-FORMAT.gguf (48 layers, the layer quantized once and repeated)
  /tmp/b/strata mkmodel -o "/tmp/low-$1.gguf" --preset qwen3-30b-a3b --layers 48 --repeat-layers --format "$1" \
    --vocab-from .carry/fxq/vocab/ggml-vocab-qwen2.gguf -t 4 > "$OUT/mkmodel-$1.txt" 2>&1
}
mk Q2_K &  # (one file at a time on the disk: ~11-16 GB each)
mkp=$!
STRATA_STREAM_CHECK=1 timeout 150 /tmp/b/tests/strata_cuda_tests \
  --gtest_filter='Q8Host.*:CudaQ8.SupportedTypes:CudaQ8Matvec.LowBit*:CudaQ8Moe.*:CudaQ8Matvec.BadArgumentsAreErrors:Qwen3MoeGpuAll.FastOneTokenPassesLowBit*' \
  > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests"; grep -E "^\[  FAILED|PASSED|rc=|low-bit" $OUT/tests.txt
timeout 120 /tmp/b/bench/cuda_matvec > $OUT/cuda_matvec.txt 2>&1; st "cuda_matvec (q8 against f32 per format and shape)"
grep -E "^\| (q2_K|q3_K|iq)" $OUT/cuda_matvec.txt | grep -E "\| 1 \|" | head -60
wait $mkp
for fmt in Q2_K IQ4_XS Q3_K_M; do  # (as far as the call's 600 s allow: ~140 s a file)
  left=$(( 580 - ($(date +%s) - t0) ))
  [ "$left" -ge 150 ] || { echo "$fmt and after: no time left ($left s)"; break; }
  f=/tmp/low-$fmt.gguf
  [ -f "$f" ] || mk $fmt
  st "$fmt file: $(tail -n1 $OUT/mkmodel-$fmt.txt)"
  [ -f "$f" ] || { echo "$fmt: no file"; continue; }
  ROUNDS=2 ARM_TIMEOUT=60 timeout 130 scripts/bench-arms /tmp/b/strata "-m $f --backend cuda --adapt-every 0 --expert-cache 100% -p 0 -n 64 -r 2 --no-roofline" \
    lowoff=STRATA_CUDA_Q8_LOW_BIT=0 lowon=STRATA_CUDA_Q8_LOW_BIT=1 > $OUT/arms_$fmt.txt 2>&1
  st "$fmt arms"; tail -4 $OUT/arms_$fmt.txt
  rm -f "$f"
done
