#pragma once
// The launch configuration of a kernel run in thread block clusters (sm_90) along x, for cudaLaunchKernelEx
// and cudaOccupancyMaxActiveClusters: the device sampler (ops_sample.cu) and bench_cluster_attn_shape.
#include <cuda_runtime.h>

namespace strata::cuda {

// grid x block threads, in clusters of `cluster` blocks along x (no attribute for 1: a plain launch), on
// `stream`. attr: the caller's storage that the configuration points at (it must outlive the launch call).
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, unsigned cluster, cudaStream_t stream,
                                                cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cfg.attrs = cluster > 1 ? &attr : nullptr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cfg;
}

}  // namespace strata::cuda
