#pragma once
// Everything one sequence carries between forward passes: the KV cache of each attention layer,
// allocated up front for n_ctx tokens, and (for hybrid architectures) the recurrent state of each
// recurrent layer. The model creates it (Model::new_sequence) because only the model knows which
// layers attend and which recur; the engine, the server and the GPU backend only move it around.
//
//   layer l attends:  kv[l].k : [n_ctx][n_head_kv][head_dim]   kv[l].v : [n_ctx][n_head_kv][head_dim_v]
//   layer l recurs:   recurrent[l] : the architecture's own f32 buffers (qwen3next: conv + delta state)
// A sequence holds n_past tokens: positions [0, n_past) of every cache are valid.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/ops.h"

namespace strata {

using cpu::KvType;

struct LayerKv {
  int64_t k_row = 0, v_row = 0;  // values per position: n_head_kv * head_dim, n_head_kv * head_dim_v
  std::vector<uint8_t> k, v;     // [n_ctx][k_row], [n_ctx][v_row] in KvType; empty: not an attention layer
  bool present() const { return !k.empty(); }
};

// The recurrent state of one layer of a hybrid model, as the architecture lays it out. Fixed size:
// unlike a KV cache it does not grow with the sequence.
struct LayerRecurrent {
  std::vector<float> conv;   // e.g. [conv_kernel - 1][channels]
  std::vector<float> state;  // e.g. [n_v_head][state][state]
  bool on_device = false;    // the state lives in the backend's state (GPU), these vectors stay empty
  bool present() const { return on_device || !state.empty() || !conv.empty(); }
};

// State a backend keeps outside this object's host vectors (the GPU backend's device KV cache), owned
// by the sequence so that it lives and dies (and is parked) with it.
class BackendState {
 public:
  virtual ~BackendState() = default;
  virtual size_t memory_bytes() const = 0;  // device or pinned bytes held
};

class SequenceState {
 public:
  // attn_layers[l]: layer l has a KV cache. The recurrent part is added by the architecture.
  SequenceState(int32_t n_ctx, KvType type, const std::vector<bool>& attn_layers, int n_head_kv,
                int head_dim, int head_dim_v);
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  int32_t n_ctx() const { return n_ctx_; }
  int32_t n_past() const { return n_past_; }
  int32_t space_left() const { return n_ctx_ - n_past_; }
  KvType kv_type() const { return type_; }
  size_t memory_bytes() const;

  LayerKv& kv(int layer) { return kv_[static_cast<size_t>(layer)]; }
  const LayerKv& kv(int layer) const { return kv_[static_cast<size_t>(layer)]; }
  std::vector<LayerRecurrent>& recurrent() { return recurrent_; }

  // Address of position `pos` of layer `layer`'s K (or V) cache.
  void* k_at(int layer, int32_t pos);
  void* v_at(int layer, int32_t pos);

  // The engine advances n_past after a forward pass has written positions [n_past, n_past + n).
  void advance(int32_t n);
  // Forget everything after the first n tokens (prefix reuse). Only exact for attention-only models:
  // a recurrent state cannot be rewound, so a model with recurrent layers must start over (n = 0).
  void truncate(int32_t n);
  void reset();  // n_past = 0 and recurrent state zeroed

  // The backend's own state (nullptr on the CPU). memory_bytes() includes its bytes.
  void set_backend_state(std::unique_ptr<BackendState> s) { backend_ = std::move(s); }
  BackendState* backend_state() const { return backend_.get(); }

 private:
  int32_t n_ctx_;
  KvType type_;
  int32_t n_past_ = 0;
  std::vector<LayerKv> kv_;               // [n_layer]
  std::vector<LayerRecurrent> recurrent_; // [n_layer] (all empty for attention-only models)
  std::unique_ptr<BackendState> backend_;
};

}  // namespace strata
