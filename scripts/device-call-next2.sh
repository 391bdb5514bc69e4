#!/usr/bin/env bash
# For the session after 40 (written in session 39), second device call (the warm machine after scripts/device-call-next.sh built
# /tmp/b): the device sampler's deep search (STRATA_CUDA_SAMPLE_DEEP, session 39, off by default; its test
# GpuOps.SampleDeepMatchesCpuSampler ran in the first call's suite) on `strata serve` with the 48-layer Q4_0
# file: 8 requests at 8 temperatures drawing over the whole vocabulary (top_k off: the random-weight file's
# flat logits put the draw ~tens of thousands of ranks deep), deep off / on, and 8 greedy requests for scale.
# First the ncu count of the experts' DRAM bytes (below), then the serve arms until LIMIT (330) s.
# The device tool: run "bash scripts/device-call-next2.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
[ -f /tmp/b/env.sh ] || { echo "no build in /tmp/b: run scripts/device-call-next.sh first"; exit 1; }
. /tmp/b/env.sh
# How many DRAM bytes the routed experts' kernels read in a decode step of 8 (and of 1, for scale): whether L2
# already serves the ~12 pairs of 64 whose expert another token of the step also picked (random routing: ~52
# distinct experts of 128), i.e. what grouping gate_up's pairs by expert could save. 4-layer Q4_0 file,
# graphs off, ncu's default cache flush between kernels (so only reuse inside one kernel counts).
m4=/tmp/prof-l4-Q4_0.gguf
[ -f $m4 ] || /tmp/b/strata mkmodel -o $m4 --preset qwen3-30b-a3b --layers 4 --repeat-layers --format Q4_0 \
  --vocab-from .carry/fix/vocab/ggml-vocab-qwen2.gguf > /dev/null
for cfg in "8 0" "8 1" "1 0"; do
  set -- $cfg; par=$1
  STRATA_CUDA_GATE_UP_GROUPED=$2 STRATA_CUDA_GRAPHS=0 timeout 100 ncu --clock-control none --kernel-name regex:"gate_up|down_kernel" --launch-skip 24 \
    --launch-count 8 --metrics dram__bytes_read.sum,gpu__time_duration.sum --csv /tmp/b/strata bench -m $m4 \
    --backend cuda --expert-cache 100% --adapt-every 0 -p 0 -n 6 -r 1 --parallel $par --no-roofline --warmup 0 \
    2>/dev/null | grep '^"' > $OUT/ncu-experts-par$par-g$2.csv
  echo "P=$par grouped=$2:"; python3 - $OUT/ncu-experts-par$par-g$2.csv <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'  {r["Kernel Name"].split("(")[0][:60]:60s} {r["Metric Name"]:28s} {r["Metric Value"]:>14s} {r["Metric Unit"]}')
PY
done
st ncu
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
timeout $(( ${LIMIT:-330} - ($(date +%s) - t0) )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 2 \
  g8=req.temperature=0 mix8-deep0=mix=1,STRATA_CUDA_SAMPLE_DEEP=0 mix8-deep1=mix=1,STRATA_CUDA_SAMPLE_DEEP=1 \
  2>&1 | tee $OUT/serve_arms.txt
st done
