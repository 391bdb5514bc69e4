#!/usr/bin/env bash
# The greedy chain's launch shapes on an H100 (session 51). The per-SM caps, q|k|v's rows a lane group and the
# attention's heads a block were tuned on an H200 (sessions 22-26: 4.8 TB/s); the H100 reads at ~3.35 TB/s, so
# the best shape may differ. One alternating sweep at the defaults' neighbours, 48-layer Q4_0 file, tg64 chained.
# The device tool: run "bash scripts/device-call-shapes-h100.sh", carry [".carry/deps", ".carry/fix"]. LIMIT=S (570).
set -uo pipefail
. scripts/device-call-start strata
m=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf /dev/null)
st "model" | tee -a $OUT/log.txt
base="-m $m --backend cuda --adapt-every 0 --expert-cache 100% -p 0 --no-roofline --tg-mode chain -r 2 -n 64"
ROUNDS=${ROUNDS:-2} ARM_TIMEOUT=60 scripts/bench-arms /tmp/b/strata "$base" default=- \
  gate-up-3=STRATA_CUDA_GATE_UP_PER_SM=3 down-3=STRATA_CUDA_DOWN_PER_SM=3 qkv-rows-4=STRATA_CUDA_QKV_ROWS=4 \
  qkv-rows-2=STRATA_CUDA_QKV_ROWS=2 heads-2=STRATA_CUDA_ATTN_DECODE_HEADS=2 carveout-100=STRATA_CUDA_CARVEOUT=100 \
  > $OUT/arms-shapes.txt 2>&1
tail -10 $OUT/arms-shapes.txt | tee -a $OUT/log.txt
st done | tee -a $OUT/log.txt
