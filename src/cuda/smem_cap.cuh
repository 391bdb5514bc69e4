#pragma once
// Shared-memory limits of a kernel and the padding that caps how many of its blocks share one SM
// (private to the CUDA layer: q8_moe.cu's gate_up, q8_norm_matvec.cu's q|k|v product).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

// The most dynamic shared memory `kern` may use on the current device: the opt-in limit per block (227 KiB
// on sm_90) less the kernel's own static shared memory, looked up once per (kernel, device).
int64_t dynamic_limit(const void* kern);

// Lets `kern` launch with up to dynamic_limit(kern) of dynamic shared memory (above 48 KiB in all a kernel
// must opt in, per device): set once per (kernel, device), the first time a launch needs it.
void allow_dynamic_bytes(const void* kern, int64_t bytes);

// The SMs of the current device.
int sm_count();

// The cap that spreads a grid of `blocks` over the SMs at `per_sm` blocks an SM at most, or 0 (no cap)
// where the grid would not fit on the GPU at once under it (it would only leave fewer blocks in flight).
// A grid no larger than the SM count is capped too: the block scheduler does not give each block an SM of
// its own, it fills the SMs the previous kernel frees first.
int spreading_cap(int64_t blocks, int per_sm);

// The dynamic shared memory with which at most `cap` blocks of `kern` (`threads` each) fit on one SM of the
// current device, or `base` if that is more, cap is 0, or no size gives exactly `cap` (e.g. registers cap
// it lower already). Found once per (kernel, device, base, cap, threads) with the occupancy calculator;
// sets the kernel's opt-in limit when it passes 48 KiB. Launch shape only: the kernel must not read the
// padding. Why: blocks launched while the previous kernel still runs (PDL) land on the first SMs it frees,
// as many as fit, and the SMs holding the most end the launch (session 22's block records).
size_t smem_for_cap(const void* kern, size_t base, int cap, int threads);

}  // namespace strata::cuda
