#pragma once
// Pieces every CUDA model file shares (moved here from qwen3moe_cuda.cpp when qwen3next_cuda.cpp came):
// spans of part of a buffer for the transfer module, the layout of a forward's per-token inputs, the dense-weight record of a model on the GPU, and
// the upload of a weight from the mapped file (as stored when the type has GPU kernels; otherwise
// dequantized on the CPU and stored as F16; everything F32 in exact mode).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/ops.cuh"
#include "cuda/transfer.h"
#include "model/model.h"
#include "model/weights.h"
#include "quant/types.h"

namespace strata::cuda {

// The first `bytes` of a device / pinned buffer (transfers copy src.bytes).
DevSpan head(const DeviceBuffer& b, size_t bytes);
HostSpan head(const PinnedBuffer& b, size_t bytes);
// Bytes [offset, offset + bytes) of a buffer; the checker still sees the whole buffer.
DevSpan slice(const DeviceBuffer& b, size_t offset, size_t bytes);
HostSpan slice(const PinnedBuffer& b, size_t offset, size_t bytes);

// A dense weight on the GPU: [rows][cols] in `type` (the file's type when it has a kernel, else its
// storage type; F32 in exact mode).
struct DevWeight {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  DeviceBuffer buf;
  const float* f32() const { return static_cast<const float*>(buf.data()); }
};

// What the uploads repacked (for the load message).
struct RepackLog {
  int n = 0;
  double file_bytes = 0, gpu_bytes = 0;
  std::string types;  // "Q5_K->F16, ..."
  void add(GgmlType from, GgmlType to, size_t fb, size_t gb);
};

// Who reads a dense matrix on the GPU: any kernel (get_rows too: the file's type or its storage type), or
// only the products (quant::matmul, q8::matvec / norm_matvec / wo_router, the prefill GEMM), which also
// read Q4_0_X8 and Q6_K_X8: product_type below.
enum class Use { any, products };

// A matrix (or stack: rows = ne[1]*ne[2]*ne[3]) of the mapped file onto the GPU, on dev.compute()
// (producer = consumer = compute). exact: dequantized to F32 on the CPU.
DevWeight upload_matrix(Device& dev, Transfer& xfer, const Weight& w, const std::string& name, bool exact,
                        RepackLog& log, Use use = Use::any);
// The matrices one under the other ([sum of rows][cols]) in one buffer (e.g. q|k|v for one product).
// Needs one type on the GPU and one column count for all (same row bytes); throws strata::Error otherwise.
DevWeight upload_stacked(Device& dev, Transfer& xfer, std::initializer_list<const Weight*> ws,
                         const std::string& name, bool exact, RepackLog& log, Use use = Use::any);
// The type a weight of file_type has on the GPU: F32 in exact mode, else quant::storage_type (the file's
// type where it has kernels, F16 otherwise).
GgmlType device_type(GgmlType file_type, bool exact);
// The type of a matrix of `cols` columns that only products read (Use::products): Q4_0_X8 for Q4_0 rows of
// whole 256-value groups in fast mode while q4_0_dense_x8(), Q6_K_X8 for Q6_K rows of whole 2048-value
// groups in fast mode while q6_k_dense_x8() (the same values and sums as the file's type; 16-byte loads in
// place for the int8 decode products), else device_type.
GgmlType product_type(GgmlType file_type, int64_t cols, bool exact);
// Whether models loaded from now on keep Q4_0 product matrices as Q4_0_X8 (product_type). Default: the
// environment's STRATA_CUDA_Q4_0_X8_DENSE (0 or 1), else on. set (tests, benchmarks) wins.
void set_q4_0_dense_x8(bool on);
bool q4_0_dense_x8();
// The same for Q6_K product matrices as Q6_K_X8: STRATA_CUDA_Q6_K_X8_DENSE (0 or 1), else on.
void set_q6_k_dense_x8(bool on);
bool q6_k_dense_x8();
// Whether models loaded from now on stack q and k into one product (one matrix of their type) where v has
// another type (llama.cpp's Q4_K_M gives v Q6_K in about half the layers of a model with more than 8
// experts, q and k Q4_K): in one-token decode two launches, q|k and v, each with the attention norm inside
// (q8::norm_matvec), instead of the norm and three products. The same bits as the three products with the
// early norm off (q8::set_norm_matvec_early), within its rounding with it (tests/cuda/test_qk_stack_gpu.cpp).
// Default: the environment's STRATA_CUDA_QK_STACK (0 or 1), else on (+1.9% tg at Q4_K_M, session 38). set
// (tests, benchmarks) wins.
void set_qk_stack(bool on);
bool qk_stack();
// A matrix as it goes to the GPU ([rows][cols] of `type`, rows = every dim above ne[0]): the mapped
// file's bytes, or a copy repacked on the CPU when the GPU's type differs (dequantized bit-exactly as ggml,
// stored as F32 or F16, logged in `log`; or, for Use::products, Q4_0 / Q6_K regrouped as Q4_0_X8 / Q6_K_X8:
// the same bytes, not logged). Throws strata::Error for a type that can be neither run nor repacked.
struct HostMatrix {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;  // the mapping or `owned`
  size_t bytes = 0;
  std::vector<uint8_t> owned;
};
HostMatrix host_matrix(const Weight& w, const std::string& name, bool exact, RepackLog& log, Use use = Use::any);
// An f32 vector ([ne[0]]: norm weights, biases) onto the GPU as is.
DevWeight upload_f32(Device& dev, Transfer& xfer, const Weight& w, const std::string& name);
// n f32 values from host memory (not the file: e.g. a converted conv kernel) as a [1][n] F32 weight.
DevWeight upload_f32_values(Device& dev, Transfer& xfer, const float* values, int64_t n, const std::string& name);

// Whether a pass of n tokens takes the fast decode's int8-activation products (q8_kernels.cuh): the fast
// mode (not exact), decode-sized batches (prefill keeps the cuBLAS and grouped paths), Q8 buffers in the
// workspace, q8::enabled() (STRATA_CUDA_Q8). Why: the f32-activation products are bound by instruction
// issue, the dp4a ones by memory (q8_kernels.cuh).
// Not in passes that run the CPU pool (pool_pass): they are bound by the pool (25% resident, 48-layer
// 30B-A3B: 52.1 / 56.9 tok/s with int8 activations vs 56.8 without, run-to-run noise), and there the int8
// activations' error adds to the pool's Q8_K error: mean KL over the 8 fixtures at 25% / 0% resident
// 5.1e-2 / 5.1e-2 summed with them vs 2.0e-2 / 3.7e-2 without (bench/results/2026-11-29-gpu-session4-h200.md).
bool int8_activations(bool exact, bool pool_pass, int64_t n, bool have_q8_buffers);

// Whether the output product (final norm + the vocabulary product) of a pass of n tokens takes int8
// activations: as int8_activations, but in CPU-pool passes too. Why: it is the pass's last product, so its
// error reaches the logits alone (no routing decision follows it, unlike the layers' products above), and on
// the f32-activation kernel it is the slowest step a pool pass waits for at its end (ncu, 4-layer 30B-A3B
// geometry at 25% resident: ~144 us a token vs ~58 us for the int8 one at 100%).
bool int8_output(bool exact, int64_t n, bool have_q8_buffers);

// For a roofline (Model::measure_device_bandwidth): device memory, as a 256 MiB device-to-device copy
// through the transfer module (read + write bytes counted), and host -> device, as 64 MiB uploads from
// pinned memory; GB/s, best of 3 rounds of 4. 0 for a part whose buffers cannot be allocated (a full GPU).
// Waits for the compute stream: call between forward passes.
Model::DeviceBandwidth measure_device_bandwidth(Device& dev, Transfer& xfer);

// A measuring build's decode timeline (cuda/pdl_trace.h), read back through `xfer` on the compute stream
// and written to $STRATA_PDL_TRACE_FILE; nothing in other builds. Never throws (a model's destructor
// calls it): a failure is reported on stderr.
void dump_pdl_trace(Device& dev, Transfer& xfer) noexcept;

// The per-forward inputs of a batch of n tokens, packed in one buffer so they go up in one upload:
//   ops::KvRef refs[n]   at 0 (KvRef is a multiple of 8 bytes, so its pointers stay aligned)
//   int32 tokens[n]      after refs
//   int32 pos[n]         after tokens
//   int32 out_rows[n]    after pos (the first n_out entries: batch rows that want logits)
// Offsets depend on n only, so a graph captured for n tokens reads the same places every step.
struct StepLayout {
  size_t refs, tokens, pos, rows, bytes;
  explicit StepLayout(int64_t n)
      : refs(0),
        tokens(size_t(n) * sizeof(ops::KvRef)),
        pos(tokens + size_t(n) * 4),
        rows(pos + size_t(n) * 4),
        bytes(rows + size_t(n) * 4) {}
};
static_assert(sizeof(ops::KvRef) % 8 == 0, "the int32 arrays after refs[] must not misalign a later KvRef");

}  // namespace strata::cuda
