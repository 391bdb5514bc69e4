// The shape of a fused q|k|v + one-token attention launch (thread block clusters), against the two launches
// the decode chain runs now, with bare kernels of the same reads and about the same math.
// Why: a fully resident decode layer is ~33 us on an H100 (docs/gpu.md), q|k|v 6.0 and attention 6.6 of it;
// both are latency, not bytes (5.9 MB of q|k|v weights is ~1.8 us at the HBM's rate). One cluster a group of
// query heads could compute its q, k and v rows, meet at a cluster barrier, and run the group's attention
// from distributed shared memory, saving a launch and a trip through global memory. Before the formats' dot
// products are written for such a kernel, this measures whether the shape pays: us per layer of
//   pair:    qkv_kernel (320 blocks, 16 rows each) then attn_kernel (a block a query head and 64 positions),
//            then, past 64 positions, combine_kernel (as the chain: a tile of 64, then a combine)
//   cluster: fused_kernel (8 clusters of CS blocks: cluster c = KV group c / 2, query heads 4 (c % 2) .. +4)
// for CS 4, 8 and 16 (16 where the device allows a non-portable cluster size), at several context lengths.
// Geometry of Qwen3-30B-A3B: n_embd 2048, 32 query heads and 4 KV heads of 128, Q4_0-sized rows (1152 bytes;
// the "dot" is an int8 dp4a over the nibbles, as the q8 kernels do, without the format's scales), f16 KV cache.
// Layers are captured 48 to a CUDA graph (no PDL), each layer its own weights (the L2 holds little of them).
// The two shapes compute the same outputs up to the order of sums: the largest difference is printed.
//
// Usage: bench_cluster_attn_shape [--reps 20] [--layers 48]
#include <cuda_fp16.h>

#include <cmath>
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_main.h"
#include "cuda/cluster_launch.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "event_timer.cuh"

namespace {

using namespace strata;
using namespace strata::cuda;
namespace cg = cooperative_groups;

constexpr int kEmbd = 2048, kHead = 128, kHq = 32, kHkv = 4;
constexpr int kRows = kHq * kHead + 2 * kHkv * kHead;  // 5120: q rows, then k, then v
constexpr int kRowBytes = kEmbd / 32 * 18;             // 1152 (Q4_0)
constexpr int kRowWords = kRowBytes / 16;              // 72 uint4: 64 of nibbles, 8 standing for the scales
constexpr int kThreads = 256;                          // 8 warps, every kernel
constexpr int kWarps = kThreads / 32;
constexpr int kQkvRowsPerBlock = 16;                   // pair: 320 blocks
constexpr int kGroupHeads = 4;                         // query heads a cluster
constexpr int kClusterRows = kGroupHeads * kHead + 2 * kHead;  // 768
constexpr float kScale = 0.08838834764f;               // 1 / sqrt(128)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One row's "dot" with the int8 activations act (smem: [kEmbd / 4] packed), by one warp. row: [kRowWords].
__device__ __forceinline__ float row_dot(const uint4* __restrict__ row, const int* act, int lane) {
  int sum = 0;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int w = lane + 32 * k;
    if (w >= kRowWords) break;
    const uint4 x = __ldg(row + w);
    const unsigned xs[4] = {x.x, x.y, x.z, x.w};
    if (w < 64) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum = __dp4a(int(xs[i] & 0x0f0f0f0fu), act[w * 8 + i], sum);
        sum = __dp4a(int((xs[i] >> 4) & 0x0f0f0f0fu), act[w * 8 + 4 + i], sum);
      }
    } else {
      sum += __popc(xs[0] ^ xs[1] ^ xs[2] ^ xs[3]);
    }
  }
  return warp_sum(float(sum)) * 1e-3f;
}

// The online softmax of NH query heads over a list of positions, a warp's share. q: smem [NH][kHead]; the
// lane's dims are 4 lane .. + 4. kc, vc: [P][kHead] f16 (the KV head's cache); position P is the new token,
// its k and v in smem (knew, vnew: [kHead]).
template <int NH>
struct Softmax {
  float m[NH], l[NH], acc[NH][4];
  __device__ void init() {
#pragma unroll
    for (int h = 0; h < NH; ++h) {
      m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[h][j] = 0.0f;
    }
  }
  // Positions p0, p0 + step, ... up to p_end (inclusive), kBatch of them loaded before any is used (why: the
  // softmax is a chain, the loads are not; one at a time, a warp waited a memory latency a position).
  static constexpr int kBatch = 4;
  __device__ void run(const float* q, const __half* kc, const __half* vc, const float* knew, const float* vnew,
                      int p0, int step, int p_end, int P, int lane) {
    for (int p = p0; p <= p_end; p += kBatch * step) {
      uint2 kb[kBatch], vb[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int pi = p + i * step;
        if (pi < P && pi <= p_end) {
          kb[i] = *reinterpret_cast<const uint2*>(kc + size_t(pi) * kHead + 4 * lane);
          vb[i] = *reinterpret_cast<const uint2*>(vc + size_t(pi) * kHead + 4 * lane);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int pi = p + i * step;
        if (pi > p_end) break;
        float k[4], v[4];
        if (pi < P) {
          const __half2* k2 = reinterpret_cast<const __half2*>(&kb[i]);
          const __half2* v2 = reinterpret_cast<const __half2*>(&vb[i]);
          k[0] = __low2float(k2[0]), k[1] = __high2float(k2[0]), k[2] = __low2float(k2[1]), k[3] = __high2float(k2[1]);
          v[0] = __low2float(v2[0]), v[1] = __high2float(v2[0]), v[2] = __low2float(v2[1]), v[3] = __high2float(v2[1]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) k[j] = knew[4 * lane + j], v[j] = vnew[4 * lane + j];
        }
        add(q, k, v, lane);
      }
    }
  }
  __device__ void add(const float* q, const float (&k)[4], const float (&v)[4], int lane) {
#pragma unroll
    for (int h = 0; h < NH; ++h) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) s += q[h * kHead + 4 * lane + j] * k[j];
      s = warp_sum(s) * kScale;
      const float mn = fmaxf(m[h], s), c = __expf(m[h] - mn), e = __expf(s - mn);
      l[h] = l[h] * c + e;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[h][j] = acc[h][j] * c + e * v[j];
      m[h] = mn;
    }
  }
};

// n softmax partials of one dim (partial i: its maximum m(i), sum l(i) and accumulator a(i), both at m(i); -inf
// for one that saw no position) merged at their common maximum: {mx, L, A}, L and A at mx (the value: A / L).
// Every merge here goes through it: a block's warps, the pair's splits, a cluster's blocks.
struct Merged {
  float mx, L, A;
};
template <typename Mf, typename Lf, typename Af>
__device__ __forceinline__ Merged merge_partials(int n, Mf m, Lf l, Af a) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, m(i));
  float L = 0.0f, A = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float mi = m(i), c = mi == -INFINITY ? 0.0f : __expf(mi - mx);
    L += l(i) * c;
    A += a(i) * c;
  }
  return {mx, L, A};
}

__device__ __forceinline__ void load_act(const int* act_g, int* act) {
  for (int i = threadIdx.x; i < kEmbd / 4; i += kThreads) act[i] = act_g[i];
}

// ---- pair. qkv: [kRows] f32 out. w: [kRows][kRowWords] uint4. act_g: [kEmbd / 4].
__global__ void __launch_bounds__(kThreads) qkv_kernel(const uint4* __restrict__ w, const int* __restrict__ act_g,
                                                       float* __restrict__ qkv) {
  __shared__ int act[kEmbd / 4];
  load_act(act_g, act);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < kQkvRowsPerBlock; i += kWarps) {
    const int r = blockIdx.x * kQkvRowsPerBlock + i;
    const float y = row_dot(w + size_t(r) * kRowWords, act, lane);
    if (lane == 0) qkv[r] = y;
  }
}

// Positions a split of the pair's attention (the decode chain's tile: one split up to 64 positions).
constexpr int kSplitPositions = 64;
int pair_splits(int P) { return (P + 1 + kSplitPositions - 1) / kSplitPositions; }

// Block (h, sp): query head h (its KV head g = h / 8), positions [sp * 64, + 64) of [0, P]. kc, vc:
// [kHkv][ctx][kHead] f16 (positions [0, P) valid; the first head of a group, split 0, writes position P).
// One split: out [kHq][kHead]; more: part [kHq][splits][2 + kHead] (m, l, acc) for combine_kernel.
__global__ void __launch_bounds__(kThreads) attn_kernel(const float* __restrict__ qkv, __half* kc, __half* vc,
                                                        int ctx, int P, float* __restrict__ out,
                                                        float* __restrict__ part) {
  __shared__ float q[kHead], knew[kHead], vnew[kHead];
  __shared__ float pm[kWarps], pl[kWarps], pacc[kWarps][kHead];
  const int h = blockIdx.x, g = h / (kHq / kHkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int d = threadIdx.x; d < kHead; d += kThreads) {
    q[d] = qkv[h * kHead + d];
    knew[d] = qkv[kHq * kHead + g * kHead + d];
    vnew[d] = qkv[kHq * kHead + kHkv * kHead + g * kHead + d];
  }
  __syncthreads();
  __half* kg = kc + size_t(g) * ctx * kHead;
  __half* vg = vc + size_t(g) * ctx * kHead;
  const int sp = blockIdx.y, n_sp = gridDim.y;
  if (h % (kHq / kHkv) == 0 && sp == 0 && P < ctx)
    for (int d = threadIdx.x; d < kHead; d += kThreads)
      kg[size_t(P) * kHead + d] = __float2half(knew[d]), vg[size_t(P) * kHead + d] = __float2half(vnew[d]);
  const int p_lo = sp * kSplitPositions, p_hi = min(P, p_lo + kSplitPositions - 1);
  Softmax<1> sm;
  sm.init();
  sm.run(q, kg, vg, knew, vnew, p_lo + warp, kWarps, p_hi, P, lane);
  if (lane == 0) pm[warp] = sm.m[0], pl[warp] = sm.l[0];
#pragma unroll
  for (int j = 0; j < 4; ++j) pacc[warp][4 * lane + j] = sm.acc[0][j];
  __syncthreads();
  float* dst = part + (size_t(h) * n_sp + sp) * (2 + kHead);
  for (int d = threadIdx.x; d < kHead; d += kThreads) {  // one split: the value; more: the block's partial
    const Merged r = merge_partials(
        kWarps, [&](int k) { return pm[k]; }, [&](int k) { return pl[k]; }, [&](int k) { return pacc[k][d]; });
    if (n_sp == 1) {
      out[h * kHead + d] = r.A / r.L;
    } else {
      dst[2 + d] = r.A;
      if (d == 0) dst[0] = r.mx, dst[1] = r.L;
    }
  }
}

// The splits' partials of head blockIdx.x merged. part: [kHq][splits][2 + kHead]; out: [kHq][kHead].
__global__ void __launch_bounds__(kHead) combine_kernel(const float* __restrict__ part, int n_sp,
                                                        float* __restrict__ out) {
  const float* p = part + size_t(blockIdx.x) * n_sp * (2 + kHead);
  const int d = threadIdx.x;
  const auto at = [&](int i, int j) { return p[size_t(i) * (2 + kHead) + j]; };
  const Merged r = merge_partials(
      n_sp, [&](int i) { return at(i, 0); }, [&](int i) { return at(i, 1); }, [&](int i) { return at(i, 2 + d); });
  out[blockIdx.x * kHead + d] = r.A / r.L;
}

// ---- cluster. Cluster c (gridDim.x / CS of them): KV group g = c / 2, query heads g * 8 + 4 (c % 2) + [0, 4).
// Block b of it: rows [b * rpb, + rpb) of the cluster's 768 (q rows of its 4 heads, then the group's k and v),
// then positions b, b + CS, ... of the attention; blocks 0..3 merge head b's partials of every block.
__global__ void __launch_bounds__(kThreads) fused_kernel(const uint4* __restrict__ w, const int* __restrict__ act_g,
                                                         __half* kc, __half* vc, int ctx, int P,
                                                         float* __restrict__ out) {
  __shared__ int act[kEmbd / 4];
  __shared__ float part[kClusterRows];  // this block's rows at their cluster index (others unused)
  __shared__ float qv[kClusterRows];    // every block's rows, gathered: q [4][128], k [128], v [128]
  __shared__ float pm[kWarps][kGroupHeads], pl[kWarps][kGroupHeads], pacc[kWarps][kGroupHeads][kHead];
  __shared__ float bm[kGroupHeads], bl[kGroupHeads], bacc[kGroupHeads][kHead];  // the block's partial
  const cg::cluster_group cl = cg::this_cluster();
  const int CS = int(cl.num_blocks()), b = int(cl.block_rank());
  const int c = blockIdx.x / CS, g = c / 2, h0 = g * (kHq / kHkv) + kGroupHeads * (c % 2);
  const int rpb = kClusterRows / CS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_act(act_g, act);
  __syncthreads();
  for (int i = warp; i < rpb; i += kWarps) {
    const int r = b * rpb + i;  // the cluster's row
    const int gr = r < kGroupHeads * kHead ? h0 * kHead + r
                   : r < (kGroupHeads + 1) * kHead
                       ? kHq * kHead + g * kHead + (r - kGroupHeads * kHead)
                       : kHq * kHead + kHkv * kHead + g * kHead + (r - (kGroupHeads + 1) * kHead);
    const float y = row_dot(w + size_t(gr) * kRowWords, act, lane);
    if (lane == 0) part[r] = y;
  }
  cl.sync();
  for (int r = threadIdx.x; r < kClusterRows; r += kThreads) qv[r] = cl.map_shared_rank(part, r / rpb)[r];
  __syncthreads();
  const float* knew = qv + kGroupHeads * kHead;
  const float* vnew = knew + kHead;
  __half* kg = kc + size_t(g) * ctx * kHead;
  __half* vg = vc + size_t(g) * ctx * kHead;
  if (b == 0 && c % 2 == 0 && P < ctx)
    for (int d = threadIdx.x; d < kHead; d += kThreads)
      kg[size_t(P) * kHead + d] = __float2half(knew[d]), vg[size_t(P) * kHead + d] = __float2half(vnew[d]);
  Softmax<kGroupHeads> sm;
  sm.init();
  sm.run(qv, kg, vg, knew, vnew, b + CS * warp, CS * kWarps, P, P, lane);
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
    if (lane == 0) pm[warp][h] = sm.m[h], pl[warp][h] = sm.l[h];
#pragma unroll
    for (int j = 0; j < 4; ++j) pacc[warp][h][4 * lane + j] = sm.acc[h][j];
  }
  __syncthreads();
  // The block's partial of each head (its warps merged, kept unnormalized: m, l and acc at m).
  for (int i = threadIdx.x; i < kGroupHeads * kHead; i += kThreads) {
    const int h = i / kHead, d = i % kHead;
    const Merged r = merge_partials(
        kWarps, [&](int k) { return pm[k][h]; }, [&](int k) { return pl[k][h]; },
        [&](int k) { return pacc[k][h][d]; });
    bacc[h][d] = r.A;
    if (d == 0) bm[h] = r.mx, bl[h] = r.L;
  }
  cl.sync();
  if (b < kGroupHeads) {  // head b of the cluster: every block's partial through distributed shared memory
    const int h = b;
    for (int d = threadIdx.x; d < kHead; d += kThreads) {
      const Merged r = merge_partials(
          CS, [&](int k) { return cl.map_shared_rank(bm, k)[h]; }, [&](int k) { return cl.map_shared_rank(bl, k)[h]; },
          [&](int k) { return cl.map_shared_rank(&bacc[0][0], k)[h * kHead + d]; });
      out[(h0 + h) * kHead + d] = r.A / r.L;
    }
  }
  cl.sync();  // (no block leaves while another reads its shared memory)
}

bool launch_fused(int cs, const uint4* w, const int* act, __half* kc, __half* vc, int ctx, int P, float* out,
                  cudaStream_t s) {
  LaunchAttrs attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(dim3(unsigned(2 * kHkv * cs)), dim3(kThreads), unsigned(cs), s, attr);
  return cudaLaunchKernelEx(&cfg, fused_kernel, w, act, kc, vc, ctx, P, out) == cudaSuccess;
}

bool cluster_size_runs(int cs) {
  if (cs > 8 && cudaFuncSetAttribute(fused_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  LaunchAttrs attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(dim3(unsigned(2 * kHkv * cs)), dim3(kThreads), unsigned(cs), nullptr, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, fused_kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, layers = 48;
  if (const int rc = strata::bench::start("bench_cluster_attn_shape", argc, argv,
                                          {{"--reps", &reps, 1}, {"--layers", &layers, 1}}))
    return rc;
  Device dev(0);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  const int ctx = 4096 + 1;
  const size_t wbytes = size_t(layers) * kRows * kRowBytes, kvn = size_t(layers) * kHkv * ctx * kHead;
  std::mt19937 rng(11);
  std::vector<uint8_t> hw(wbytes);
  for (auto& x : hw) x = uint8_t(rng());
  std::vector<int> hact(size_t(layers) * kEmbd / 4);
  for (auto& x : hact) x = int(rng());
  std::vector<__half> hkv(kvn);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : hkv) x = __float2half(nd(rng));
  uint4* w = nullptr;
  int* act = nullptr;
  __half *kc = nullptr, *vc = nullptr;
  float *qkv_out = nullptr, *out_pair = nullptr, *out_fused = nullptr, *part = nullptr;
  CUDA_CHECK(cudaMalloc(&w, wbytes));
  CUDA_CHECK(cudaMalloc(&act, hact.size() * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&kc, kvn * sizeof(__half)));
  CUDA_CHECK(cudaMalloc(&vc, kvn * sizeof(__half)));
  CUDA_CHECK(cudaMalloc(&qkv_out, size_t(layers) * kRows * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out_pair, size_t(layers) * kHq * kHead * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out_fused, size_t(layers) * kHq * kHead * sizeof(float)));
  const size_t part_floats = size_t(kHq) * size_t(pair_splits(ctx - 1)) * (2 + kHead);
  CUDA_CHECK(cudaMalloc(&part, size_t(layers) * part_floats * sizeof(float)));
  CUDA_CHECK(cudaMemcpyAsync(w, hw.data(), wbytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(act, hact.data(), hact.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(kc, hkv.data(), kvn * sizeof(__half), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(vc, hkv.data(), kvn * sizeof(__half), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  auto lw = [&](int l) { return w + size_t(l) * kRows * kRowWords; };
  auto la = [&](int l) { return act + size_t(l) * kEmbd / 4; };
  auto lk = [&](__half* base, int l) { return base + size_t(l) * kHkv * ctx * kHead; };
  auto qkv = [&](int l) {
    qkv_kernel<<<kRows / kQkvRowsPerBlock, kThreads, 0, s>>>(lw(l), la(l), qkv_out + size_t(l) * kRows);
  };
  auto attn = [&](int l, int P) {
    const int n_sp = pair_splits(P);
    float* o = out_pair + size_t(l) * kHq * kHead;
    float* pp = part + size_t(l) * part_floats;
    attn_kernel<<<dim3(kHq, unsigned(n_sp)), kThreads, 0, s>>>(qkv_out + size_t(l) * kRows, lk(kc, l), lk(vc, l),
                                                               ctx, P, o, pp);
    if (n_sp > 1) combine_kernel<<<kHq, kHead, 0, s>>>(pp, n_sp, o);
  };
  std::vector<int> sizes;
  for (const int c : {4, 8, 16})
    if (cluster_size_runs(c)) sizes.push_back(c);
  std::printf("%d layers a graph, %d repetitions; us per layer. Cluster sizes that run here:", layers, reps);
  for (const int c : sizes) std::printf(" %d", c);
  std::printf("\n\n| positions | qkv | attn | pair | ");
  for (const int c : sizes) std::printf("cluster %d | ratio | max diff | ", c);
  std::printf("\n|---:|---:|---:|---:|");
  for (size_t i = 0; i < sizes.size(); ++i) std::printf("---:|---:|---:|");
  std::printf("\n");
  for (const int P : {16, 64, 256, 1024, 4096}) {
    Graph gq = Graph::capture(cs, [&] {
      for (int l = 0; l < layers; ++l) qkv(l);
    });
    Graph ga = Graph::capture(cs, [&] {
      for (int l = 0; l < layers; ++l) attn(l, P);
    });
    Graph gp = Graph::capture(cs, [&] {
      for (int l = 0; l < layers; ++l) {
        qkv(l);
        attn(l, P);
      }
    });
    const double us_q = strata::bench::time_us(s, reps, [&] { gq.launch(cs); }) / layers;
    const double us_a = strata::bench::time_us(s, reps, [&] { ga.launch(cs); }) / layers;
    const double us_p = strata::bench::time_us(s, reps, [&] { gp.launch(cs); }) / layers;
    std::printf("| %d | %.2f | %.2f | %.2f |", P, us_q, us_a, us_p);
    std::vector<float> ref(size_t(layers) * kHq * kHead), got(ref.size());
    CUDA_CHECK(cudaMemcpyAsync(ref.data(), out_pair, ref.size() * 4, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (const int c : sizes) {
      bool ok = true;
      Graph gf = Graph::capture(cs, [&] {
        for (int l = 0; l < layers; ++l)
          ok = ok && launch_fused(c, lw(l), la(l), lk(kc, l), lk(vc, l), ctx, P, out_fused + size_t(l) * kHq * kHead,
                                  s);
      });
      if (!ok) {
        std::printf(" failed | | |");
        continue;
      }
      const double us_f = strata::bench::time_us(s, reps, [&] { gf.launch(cs); }) / layers;
      CUDA_CHECK(cudaMemcpyAsync(got.data(), out_fused, got.size() * 4, cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      double diff = 0.0;
      for (size_t i = 0; i < ref.size(); ++i) diff = std::fmax(diff, std::fabs(double(ref[i]) - double(got[i])));
      std::printf(" %.2f | %.2f | %.1e |", us_f, us_f / us_p, diff);
    }
    std::printf("\n");
  }
  CUDA_CHECK(cudaFree(w));
  CUDA_CHECK(cudaFree(act));
  CUDA_CHECK(cudaFree(kc));
  CUDA_CHECK(cudaFree(vc));
  CUDA_CHECK(cudaFree(qkv_out));
  CUDA_CHECK(cudaFree(out_pair));
  CUDA_CHECK(cudaFree(out_fused));
  CUDA_CHECK(cudaFree(part));
  return 0;
}
