#pragma once
// CUDA graphs (issue 7): the kernels a function enqueues on one stream, captured once and replayed with
// one cudaGraphLaunch. Why: a decode step of a 48-layer model is ~700 kernel launches of a few
// microseconds of host time each; replayed as one graph it is one API call. Free of CUDA headers.
#include <cstddef>
#include <functional>

#include "cuda/device.h"

struct CUgraphExec_st;

namespace strata::cuda {

// False when the environment sets STRATA_CUDA_GRAPHS=0 (for debugging: every kernel launched directly);
// read once per process.
bool graphs_enabled_by_env();

// An instantiated graph (cudaGraphExec_t). Move-only; destroyed with its owner.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Captures what `enqueue` enqueues on `s` and instantiates it; nothing runs. Capture mode is
  // cudaStreamCaptureModeThreadLocal: only this thread's work on `s` is captured, and a call of this
  // thread that is unsafe during capture (a synchronization, a legacy-stream copy) fails instead of
  // silently splitting the graph. `enqueue` must only launch kernels on `s`: no Transfer call (those use
  // other streams and record events), no host synchronization. If it throws, the capture is ended and
  // discarded, and the exception goes on.
  static Graph capture(const Stream& s, const std::function<void()>& enqueue);
  // Enqueues one replay on `s` (ordered after everything enqueued on s before, like a kernel).
  void launch(const Stream& s) const;
  bool valid() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }  // kernels (and other nodes) in the graph

 private:
  void release();
  CUgraphExec_st* exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace strata::cuda
