#pragma once
// The launch configuration of a kernel run in thread block clusters (sm_90), for cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters: the device sampler (ops_sample.cu), the one-token attention's cluster merge
// (attn_tile.cu) and bench_cluster_attn_shape.
#include <cuda_runtime.h>

#include <cstddef>

namespace strata::cuda {

// The attributes a configuration points at: the caller's storage, which must outlive the launch call.
struct LaunchAttrs {
  cudaLaunchAttribute a[2];
};

// grid x block threads with `smem` bytes of dynamic shared memory, on `stream`, in clusters of `cluster`
// blocks (1 x 1 x 1: no cluster attribute), with PDL's programmatic stream serialization when `pdl`
// (cuda/pdl.cuh's contract then holds for the kernel).
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, dim3 cluster, size_t smem, cudaStream_t stream,
                                                bool pdl, LaunchAttrs& attrs) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs.a[n] = cudaLaunchAttribute{};
    attrs.a[n].id = cudaLaunchAttributeClusterDimension;
    attrs.a[n].val.clusterDim.x = cluster.x, attrs.a[n].val.clusterDim.y = cluster.y;
    attrs.a[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl) {
    attrs.a[n] = cudaLaunchAttribute{};
    attrs.a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs.a[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attrs.a : nullptr;
  cfg.numAttrs = n;
  return cfg;
}

// Clusters of `cluster` blocks along x, no dynamic shared memory, no PDL.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, unsigned cluster, cudaStream_t stream,
                                                LaunchAttrs& attrs) {
  return cluster_launch_config(grid, block, dim3(cluster, 1, 1), 0, stream, false, attrs);
}

}  // namespace strata::cuda
