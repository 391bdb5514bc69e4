#!/usr/bin/env bash
# One device call: does session 35's Q4_0 CPU kernel (FMA chains in registers, ~1.3-2x one core's compute
# ceiling on the dev VM) speed up the GPU backend's CPU pool? 25% resident tg32 on a 48-layer
# Qwen3-30B-A3B-geometry Q4_0 file, old kernel (BIN=strata.old) against the tree's, alternating; also the
# CPU backend alone (-t 0, 8 tokens) both ways.
# Prepare HERE (the base version of the one changed file, an untracked folder that travels with the tree):
#   mkdir -p ab_old/src/quant && git show 1bf0890:src/quant/vec_dot_x86.inc > ab_old/src/quant/vec_dot_x86.inc
# Then the device tool: run "bash scripts/device-call-q40-pool.sh", carry [".carry/deps", ".carry/fx"].
# About 450 s on a fresh machine (two builds in one folder ~250 s, the file ~30 s, the arms ~150 s).
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( 580 - ($(date +%s) - t0) )); }
[ -f ab_old/src/quant/vec_dot_x86.inc ] || { echo "ab_old/src/quant/vec_dot_x86.inc missing: see the header"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; lscpu | grep -E "Model name|^CPU\(s\)"; } > $OUT/env.txt 2>&1
# SKIP_BUILD=1: the warm machine's /tmp/b from scripts/device-call-dense-x8.sh (the same two binaries).
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x /tmp/b/strata.old ]; then st "build kept"
else timeout 450 scripts/device-ab-build ab_old /tmp/b .carry/deps > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -40 $OUT/build.log; exit 1; }
fi
st built; ls -la /tmp/b/strata /tmp/b/strata.old
. /tmp/b/env.sh
f=$(scripts/device-model-30b /tmp/b/strata Q4_0 .carry/fx/vocab/ggml-vocab-qwen2.gguf $OUT/mkmodel.txt)
st "file: $(tail -n1 $OUT/mkmodel.txt 2>/dev/null)"
ROUNDS=3 ARM_TIMEOUT=50 timeout $(( $(left) - 100 )) scripts/bench-arms /tmp/b/strata \
  "-m $f --backend cuda --adapt-every 0 --expert-cache 25% -p 0 -n 32 -r 1 --no-roofline" \
  old=BIN=/tmp/b/strata.old new=- > $OUT/arms_25.txt 2>&1
st "25% arms"; tail -4 $OUT/arms_25.txt
[ "$(left)" -ge 60 ] && ROUNDS=2 ARM_TIMEOUT=40 timeout $(( $(left) - 10 )) scripts/bench-arms /tmp/b/strata \
  "-m $f --backend cpu -p 0 -n 8 -r 1 --no-roofline" old=BIN=/tmp/b/strata.old new=- > $OUT/arms_cpu.txt 2>&1
st "cpu arms"; tail -4 $OUT/arms_cpu.txt
