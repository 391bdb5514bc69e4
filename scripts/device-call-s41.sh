#!/usr/bin/env bash
# Session 41, last device call (written after its first calls: bench/results/2026-12-06-gpu-session41-h100.md).
# New, off by default until measured here (all built without a GPU):
#   * gate_up's lanes take their tasks two at a time (STRATA_CUDA_GATE_UP_TWO_TASKS=1): a one-token step's
#     gate_up read 14 MB at ~1 TB/s (ncu), and its task loop (2 tasks a lane for 2048-column Q4_0_X8 rows)
#     waited for two memory round trips;
#   * moe_down's slots-once kernel (STRATA_CUDA_Q8_DOWN=slots, an existing switch) now unrolls 8 terms a lane
#     for the formats of 8 tasks a block (Q4_0_X8: 6 terms a lane, were 4 + 2 by the loop);
#   * STRATA_CUDA_Q8_MMA=3: the persistent tensor-core kernel for 4..7 tokens, the tile kernel from 8.
# Flipped on by default this session: STRATA_CUDA_SAMPLE_DEEP, STRATA_CUDA_MATVEC_ASYNC_STAGE.
# Steps: build; the tests of what changed (stream checker on); ncu of gate_up / moe_down at P = 1 with each
# switch; strata bench arms on the 48-layer Q4_0 file (P = 1: base / two / slots / both; P = 4, 6, 8: mma 1 / 3);
# the rest of the GPU suite; the arms again. LIMIT=S bounds every step (default 560).
# The device tool: run "bash scripts/device-call-s41.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - t0) )); }
first='CudaQ8Moe.*:CudaFoldedRouter.*:CudaQ8Matvec.TensorCoreModes:CudaQ8Matvec.AsyncStageSameBits:GpuOps.Sample*'
TESTS=$first TESTS_OUT=tests-first.txt bash scripts/device-call-suite.sh || exit 1
. /tmp/b/env.sh
grep -E "^\[  FAILED|^\[  PASSED|tests from .* ran|rc=" $OUT/tests-first.txt | head -30
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
arm() {  # P TWO DOWN MMA
  local down=; [ "$3" = slots ] && down=slots
  STRATA_CUDA_GATE_UP_TWO_TASKS=$2 STRATA_CUDA_Q8_DOWN=$down STRATA_CUDA_Q8_MMA=$4 /tmp/b/strata bench -m "$f" \
    --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 64 -r 2 --parallel $1 --no-roofline 2>&1 |
    grep -E "^tg" | sed "s/^/P=$1 two=$2 down=$3 mma=$4 /"
}
round() {
  for a in "1 0 term 1" "1 1 term 1" "1 0 slots 1" "1 1 slots 1" "4 0 term 1" "4 0 term 3" "6 0 term 1" \
           "6 0 term 3" "8 0 term 1" "8 0 term 3" "8 1 slots 1"; do
    [ $(left) -gt 15 ] || return
    timeout $(left) bash -c "$(declare -f arm); f=$f; arm $a"
  done
}
round 2>&1 | tee $OUT/parallel.txt
st "round 1"
# Kernel times at P = 1 (4-layer file, graphs off, ncu's cache flush: cold L2 for every kernel).
m4=/tmp/prof-l4-Q4_0.gguf
[ -f $m4 ] || /tmp/b/strata mkmodel -o $m4 --preset qwen3-30b-a3b --layers 4 --repeat-layers --format Q4_0 \
  --vocab-from .carry/fix/vocab/ggml-vocab-qwen2.gguf > /dev/null
for cfg in "0 term" "1 slots"; do
  [ $(left) -gt 40 ] || break
  set -- $cfg; down=; [ $2 = slots ] && down=slots
  STRATA_CUDA_GATE_UP_TWO_TASKS=$1 STRATA_CUDA_Q8_DOWN=$down STRATA_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none \
    --kernel-name regex:"gate_up|down_kernel" --launch-skip 8 --launch-count 8 \
    --metrics dram__bytes_read.sum,gpu__time_duration.sum --csv /tmp/b/strata bench -m $m4 --backend cuda \
    --expert-cache 100% --adapt-every 0 -p 0 -n 6 -r 1 --parallel 1 --no-roofline --warmup 0 2>/dev/null |
    grep '^"' > $OUT/ncu-p1-two$1-$2.csv
  echo "two=$1 down=$2:"; python3 - $OUT/ncu-p1-two$1-$2.csv <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'  {r["Kernel Name"].split("(")[0][:60]:60s} {r["Metric Name"]:24s} {r["Metric Value"]:>12s} {r["Metric Unit"]}')
PY
done
st ncu
[ $(left) -gt 60 ] && STRATA_STREAM_CHECK=1 GTEST_FILTER="-$first" timeout $(( $(left) - 10 )) \
  /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "the rest of the suite"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
round 2>&1 | tee -a $OUT/parallel.txt
st done
