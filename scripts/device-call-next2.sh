#!/usr/bin/env bash
# For the session after 39, second device call (the warm machine after scripts/device-call-next.sh built
# /tmp/b): the device sampler's deep search (STRATA_CUDA_SAMPLE_DEEP, session 39, off by default; its test
# GpuOps.SampleDeepMatchesCpuSampler ran in the first call's suite) on `strata serve` with the 48-layer Q4_0
# file: 8 requests at 8 temperatures drawing over the whole vocabulary (top_k off: the random-weight file's
# flat logits put the draw ~tens of thousands of ranks deep), deep off / on, and 8 greedy requests for scale.
# The device tool: run "bash scripts/device-call-next2.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
[ -f /tmp/b/env.sh ] || { echo "no build in /tmp/b: run scripts/device-call-next.sh first"; exit 1; }
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 2 \
  g8=req.temperature=0 mix8-deep0=mix=1,STRATA_CUDA_SAMPLE_DEEP=0 mix8-deep1=mix=1,STRATA_CUDA_SAMPLE_DEEP=1 \
  2>&1 | tee $OUT/serve_arms.txt
st done
