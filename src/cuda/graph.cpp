// CUDA graph capture and replay (see graph.h).
#include "cuda/graph.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/cuda_check.cuh"

namespace strata::cuda {

bool graphs_enabled_by_env() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_GRAPHS");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return on;
}

Graph::~Graph() { release(); }

Graph::Graph(Graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)), nodes_(std::exchange(o.nodes_, 0)) {}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    release();
    exec_ = std::exchange(o.exec_, nullptr);
    nodes_ = std::exchange(o.nodes_, 0);
  }
  return *this;
}

void Graph::release() {
  // Unchecked like cudaFree in DeviceBuffer::release: a destructor may run after the context is gone.
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  nodes_ = 0;
}

Graph Graph::capture(const Stream& s, const std::function<void()>& enqueue) {
  const cudaStream_t st = s.handle();
  CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    enqueue();
  } catch (...) {
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    if (g != nullptr) CUDA_CHECK(cudaGraphDestroy(g));
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(st, &g));
  Graph out;
  CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &out.nodes_));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  CUDA_CHECK(cudaGraphDestroy(g));
  CUDA_CHECK(err);
  out.exec_ = exec;
  return out;
}

void Graph::launch(const Stream& s) const { CUDA_CHECK(cudaGraphLaunch(exec_, s.handle())); }

}  // namespace strata::cuda
