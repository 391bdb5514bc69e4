#!/usr/bin/env bash
# For the session after 38, first device call: every GPU test with the stream checker (session 38 built
# GpuOps.SampleRowsFollowsEachRowsRule and SamplingBansGpu.MixedRulesPickWhatEachCpuSamplerPicks without a
# GPU: per-row sampling rules, off by default behind STRATA_DEVICE_MIXED_SAMPLING), then `strata serve` on the
# 48-layer Q4_0 file fully resident, 128 tokens a request (scripts/serve-ignore-eos-ab.py), arms:
#   g1     one request, greedy             g8      8 requests, greedy (argmax on the device)
#   k8     8 requests, top_k 40            full8   8 requests drawing over the whole vocabulary (top_k off)
#   mix8-host / mix8-dev   8 requests with 8 different temperatures, STRATA_DEVICE_MIXED_SAMPLING 0 / 1
# What it answers: how much of a decode step of 8 is the forward pass (g8 against g1) and how much the pick;
# whether per-row rules pay (mix8-dev against mix8-host). Flip STRATA_DEVICE_MIXED_SAMPLING's default only
# where its tests pass and mix8-dev wins.
# The device tool: run "bash scripts/device-call-next.sh", carry [".carry/deps", ".carry/fix"].
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bash scripts/device-call-suite.sh || exit 1  # the build, every GPU test with the stream checker (its lines)
. /tmp/b/env.sh
grep -E "^\[ gpu (bans|mixed)|^\[sample\]" $OUT/tests.txt | head -12
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fix/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file $f"
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/serve-ignore-eos-ab.py /tmp/b/strata "$f" \
  "--backend cuda --expert-cache 100% --adapt-every 0 --ctx 1024" 8 128 ${ROUNDS:-1} \
  g1=n=1,req.temperature=0 g8=req.temperature=0 k8=req.top_k=40 full8=- \
  mix8-host=mix=1,STRATA_DEVICE_MIXED_SAMPLING=0 mix8-dev=mix=1,STRATA_DEVICE_MIXED_SAMPLING=1 2>&1 | tee $OUT/serve_arms.txt
st done
