#!/usr/bin/env bash
# One device call: the build and every GPU test with the stream-order checker (STRATA_STREAM_CHECK=1), and the
# decode-path KL tests' summary lines. Session 35 ran it for the first full run with the low-bit int8 kernels
# on by default (299 of 299).
# The device tool: run "bash scripts/device-call-suite.sh", carry [".carry/deps", ".carry/fix"] (the whole
# fixtures folder: the qwen3next and template tests need more than .carry/fxq). About 450 s on a fresh
# machine (build ~190 s, the suite ~200 s).
set -uo pipefail
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export STRATA_FIXTURES_DIR=$PWD/.carry/fix
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; git log --oneline -1; git status --short | head; } > $OUT/env.txt 2>&1
# AB_OLD=DIR: build with scripts/device-ab-build (also /tmp/b/strata.old from DIR's base files, for an A/B
# in a later call on the same warm machine).
if [ -n "${AB_OLD:-}" ]; then build=(scripts/device-ab-build "$AB_OLD" /tmp/b .carry/deps strata_cuda_tests)
else build=(scripts/device-build . /tmp/b .carry/deps strata strata_cuda_tests); fi
timeout 450 "${build[@]}" > $OUT/build.log 2>&1 || { st "BUILD FAILED"; tail -50 $OUT/build.log; exit 1; }
st built
. /tmp/b/env.sh
# TESTS=FILTER: only those tests (a gtest filter; '-A:B' all but those); TESTS_OUT=NAME: their output in
# $OUT/NAME (default tests.txt).
[ -n "${TESTS:-}" ] && export GTEST_FILTER=$TESTS
tests_out=$OUT/${TESTS_OUT:-tests.txt}
STRATA_STREAM_CHECK=1 timeout 330 /tmp/b/tests/strata_cuda_tests > $tests_out 2>&1; echo "rc=$?" >> $tests_out
st "tests"; grep -E "^\[  FAILED|PASSED|rc=|tests from .* ran" $tests_out | head -30
grep -E "^\[ gpu fast (chunked|one-token)[^]]*, all \]|qwen3next fast decode-sized|^  mean" $tests_out | head -40
true  # the greps above find nothing on a filtered run
