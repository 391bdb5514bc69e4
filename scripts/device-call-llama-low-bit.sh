#!/usr/bin/env bash
# One device call: llama.cpp's CUDA build against strata on Q2_K, IQ4_XS and Q3_K_M files of the 48-layer
# Qwen3-30B-A3B geometry (bench/gpu_bench.sh's llama section: fully resident pp and tg, and llama.cpp with the
# experts of 36 layers on the CPU against strata at 25%), now that the low-bit int8 decode kernels are
# strata's default (session 35). The Q4_0_X8 A/B this script held before was measured in sessions 34-35.
# LLAMA_FORMATS="Q4_0 Q2_K IQ4_XS" (session 36) picks other files. The call itself is
# scripts/device-call-llama-ratio.sh with these formats; prepare and carry what it says:
#   run "bash scripts/device-call-llama-low-bit.sh", carry [".carry/deps", ".carry/fixv", ".carry/llama"]
LIMIT="${LIMIT:-575}" LLAMA_FORMATS="${LLAMA_FORMATS:-Q2_K IQ4_XS Q3_K_M}" exec bash "$(dirname "$0")/device-call-llama-ratio.sh"
