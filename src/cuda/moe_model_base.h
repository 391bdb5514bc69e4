#pragma once
// What the two CUDA MoE models (qwen3moe_cuda.cpp, qwen3next_cuda.cpp) share: the device, the transfer
// module, the expert cache, the forward mutex with the host-work counters, and the Model overrides that
// only read those. Each model's load() creates dev_, xfer_ and cache_ and sets weight_bytes_.
//
// Destruction: the derived model's members (its weights on the GPU, its host views) go first, then cache_
// (its pending copies use xfer_ and dev_), then xfer_, then dev_; the destructor first writes the PDL
// trace of a measuring build (cuda/pdl_trace.h) of a model whose load() completed.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/graph.h"
#include "cuda/model_common.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/pool_io.h"
#include "cuda/transfer.h"
#include "model/model.h"

namespace strata::cuda {

class CudaMoeModel : public Model {
 public:
  ~CudaMoeModel() override {
    if (dev_) dev_->make_current();
    if (loaded_ && dev_ && xfer_) dump_pdl_trace(*dev_, *xfer_);  // (measuring builds only, cuda/pdl_trace.h)
  }
  size_t weight_bytes() const override { return weight_bytes_; }
  std::string backend_name() const override { return "cuda:" + std::to_string(dev_->ordinal()); }
  bool samples_on_device() const override { return true; }
  // The workspace's pinned logits buffer (PoolIo::logits_h), which finish_forward downloads into: a
  // forward whose logits point there skips the copy to the caller's memory.
  float* logits_in_place(Workspace& ws, int64_t n_rows) const override {
    auto* io = dynamic_cast<PoolIo*>(&ws);
    if (io == nullptr || n_rows < 0) return nullptr;
    return size_t(n_rows) * size_t(hp_.n_vocab) * 4 <= io->logits_h.bytes() ? io->logits_h.as<float>() : nullptr;
  }
  DeviceBandwidth measure_device_bandwidth() const override {
    std::lock_guard<std::mutex> lock(mu_);
    dev_->make_current();
    return cuda::measure_device_bandwidth(*dev_, *xfer_);
  }
  void reset_cache_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_->reset_stats();
    work_ = HostWork::starting_now(*xfer_);
  }

 protected:
  CudaMoeModel(gguf::File file, HParams hp, const CudaOptions& opt)
      : Model(std::move(file), std::move(hp)),
        opt_(opt),
        graphs_(opt.cuda_graphs && graphs_enabled_by_env()),
        gated_(graphs_ && opt.gated_passes && gated_passes_enabled_by_env()),
        model_id_(next_model_id()) {}

  // The expert cache's report over the model's n_layer routed layers. The caller holds mu_.
  ExpertCacheReport cache_report_locked(int n_layer) const {
    return make_cache_report(*cache_, *xfer_, n_layer, hp_.n_expert, graphs_, work_);
  }
  // Scratch bytes of the grouped (prefill) MoE kernels for batches up to max_tokens over layers [0, n_layer);
  // 0 where the prefill paths are off or the batch is below their size.
  size_t grouped_scratch_bytes(int n_layer, int32_t max_tokens, bool prefill_paths) const {
    size_t bytes = 0;
    if (prefill_paths && max_tokens >= moe::kMoeGroupedMinTokens)
      for (int il = 0; il < n_layer; ++il)
        bytes = std::max(bytes, moe::moe_grouped_scratch_bytes(cache_->layer_view(il), hp_.n_expert, max_tokens,
                                                               hp_.n_expert_used));
    return bytes;
  }

  CudaOptions opt_;
  const bool graphs_;        // CUDA graphs for passes without the CPU pool (CudaOptions, STRATA_CUDA_GRAPHS)
  const bool gated_;         // gated CPU-pool passes (CudaOptions::gated_passes, STRATA_CUDA_GATED)
  const uint64_t model_id_;  // unique in the process: a workspace's graphs belong to one model
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Transfer> xfer_;
  std::unique_ptr<ExpertCache> cache_;  // after xfer_ and dev_: destroyed before them
  size_t weight_bytes_ = 0;
  mutable std::mutex mu_;  // one forward at a time (the expert cache's step protocol); stats
  mutable HostWork work_;  // since the last reset_cache_stats()
  bool loaded_ = false;    // set by the model's constructor after its load(): a failed load writes no trace

 private:
  static uint64_t next_model_id() {
    static std::atomic<uint64_t> next{1};
    return next++;
  }
};

}  // namespace strata::cuda
