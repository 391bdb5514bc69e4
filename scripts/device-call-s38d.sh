#!/usr/bin/env bash
# Session 38, fourth device call: where a `strata serve` decode step of 8 sequences goes (the third call saw
# 8 concurrent ignore_eos requests at 449 tok/s in all, against 587 tok/s for one sequence's tg64): the same
# 48-layer Q4_0 file fully resident, 128 tokens a request, arms: one request greedy, 8 greedy (argmax on the
# device), 8 with top_k 40, 8 sampling the whole vocabulary (temperature 0.8, top_k off: the API's default).
# The device tool: run "bash scripts/device-call-s38d.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
timeout 400 scripts/device-build . /tmp/b .carry/deps strata > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file $f"
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 ${ROUNDS:-2} \
  g1=n=1,req.temperature=0 g8=req.temperature=0 k8=req.top_k=40 full8=- 2>&1 | tee $OUT/serve_arms.txt
st done
