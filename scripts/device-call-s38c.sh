#!/usr/bin/env bash
# Session 38, third device call: every GPU test with the stream checker after STRATA_CUDA_QK_STACK became the
# default and with the fixed SamplingBansGpu test (the first call's run had a prompt outside the tiny fixture's
# 512-token vocabulary), then `strata serve` with 8 concurrent ignore_eos requests on the 48-layer Q4_0 file,
# fully resident: STRATA_DEVICE_BANS=1 (picks on the GPU with the end-of-generation ids banned there) against 0
# (the logits come back and the CPU picks, as before), alternating.
# The device tool: run "bash scripts/device-call-s38c.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
timeout 400 scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
STRATA_STREAM_CHECK=1 timeout 300 /tmp/b/tests/strata_cuda_tests > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
st "tests"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $OUT/tests.txt | head -30
grep -E "^\[ gpu bans|^\[ gpu fast (chunked|one-token)[^]]*, all \]" $OUT/tests.txt | head -20
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file $f"
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 2 \
  device=STRATA_DEVICE_BANS=1 host=STRATA_DEVICE_BANS=0 2>&1 | tee $OUT/serve_ab.txt
st done
