#include "kv/sequence_state.h"

#include <algorithm>

#include "common/checked_math.h"
#include "common/error.h"

namespace strata {

SequenceState::SequenceState(int32_t n_ctx, KvType type, const std::vector<bool>& attn_layers,
                             int n_head_kv, int head_dim, int head_dim_v)
    : n_ctx_(n_ctx), type_(type) {
  STRATA_REQUIRE(n_ctx >= 1, "context size must be >= 1, got {}", n_ctx);
  kv_.resize(attn_layers.size());
  recurrent_.resize(attn_layers.size());
  const uint64_t es = cpu::kv_type_size(type);
  for (size_t l = 0; l < attn_layers.size(); ++l) {
    if (!attn_layers[l]) continue;
    LayerKv& c = kv_[l];
    c.k_row = static_cast<int64_t>(n_head_kv) * head_dim;
    c.v_row = static_cast<int64_t>(n_head_kv) * head_dim_v;
    auto kb = checked_mul(static_cast<uint64_t>(n_ctx), static_cast<uint64_t>(c.k_row));
    auto vb = checked_mul(static_cast<uint64_t>(n_ctx), static_cast<uint64_t>(c.v_row));
    STRATA_REQUIRE(kb && vb && checked_mul(*kb, es) && checked_mul(*vb, es),
                   "KV cache size overflows for --ctx {}", n_ctx);
    c.k.assign(*kb * es, 0);
    c.v.assign(*vb * es, 0);
  }
}

size_t SequenceState::memory_bytes() const {
  size_t n = 0;
  for (const auto& c : kv_) n += c.k.size() + c.v.size();
  for (const auto& r : recurrent_) n += (r.conv.size() + r.state.size()) * sizeof(float);
  if (backend_) n += backend_->memory_bytes();
  return n;
}

void* SequenceState::k_at(int layer, int32_t pos) {
  LayerKv& c = kv_[static_cast<size_t>(layer)];
  return c.k.data() + static_cast<size_t>(pos) * c.k_row * cpu::kv_type_size(type_);
}

void* SequenceState::v_at(int layer, int32_t pos) {
  LayerKv& c = kv_[static_cast<size_t>(layer)];
  return c.v.data() + static_cast<size_t>(pos) * c.v_row * cpu::kv_type_size(type_);
}

void SequenceState::advance(int32_t n) {
  STRATA_REQUIRE(n >= 0 && n <= space_left(), "context overflow: {} tokens held, {} more, --ctx {}",
                 n_past_, n, n_ctx_);
  n_past_ += n;
}

void SequenceState::truncate(int32_t n) {
  STRATA_REQUIRE(n >= 0 && n <= n_past_, "cannot keep {} tokens of a sequence holding {}", n,
                 n_past_);
  const bool recurrent = std::any_of(recurrent_.begin(), recurrent_.end(),
                                     [](const LayerRecurrent& r) { return r.present(); });
  STRATA_REQUIRE(!recurrent || n == 0 || n == n_past_,
                 "a sequence with recurrent state can only be kept whole or reset");
  if (n == 0) reset();
  n_past_ = n;
}

void SequenceState::reset() {
  n_past_ = 0;
  for (auto& r : recurrent_) {
    std::fill(r.conv.begin(), r.conv.end(), 0.0f);
    std::fill(r.state.begin(), r.state.end(), 0.0f);
  }
}

}  // namespace strata
