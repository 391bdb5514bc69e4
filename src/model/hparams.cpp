#include "model/hparams.h"

#include <cmath>

#include "cpu/ops.h"

namespace strata {

namespace {

bool value_int(const gguf::Value& v, int64_t& out) {
  using VT = gguf::ValueType;
  switch (v.type) {
    case VT::UINT8: case VT::UINT16: case VT::UINT32:
      out = static_cast<int64_t>(v.num.u);
      return true;
    case VT::UINT64:
      if (v.num.u > static_cast<uint64_t>(INT64_MAX)) return false;
      out = static_cast<int64_t>(v.num.u);
      return true;
    case VT::INT8: case VT::INT16: case VT::INT32: case VT::INT64:
      out = v.num.i;
      return true;
    default:
      return false;
  }
}

}  // namespace

int64_t meta_int(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi) {
  const gguf::Value* v = f.find(key);
  STRATA_REQUIRE(v, "{}: missing metadata key '{}'", f.path(), key);
  int64_t x = 0;
  STRATA_REQUIRE(value_int(*v, x), "{}: metadata '{}' should be an integer, found {}", f.path(), key,
                 gguf::value_type_name(v->type));
  STRATA_REQUIRE(x >= lo && x <= hi, "{}: metadata '{}' = {} is out of range [{}, {}]", f.path(),
                 key, x, lo, hi);
  return x;
}

int64_t meta_int_or(const gguf::File& f, const std::string& key, int64_t def, int64_t lo,
                    int64_t hi) {
  return f.has(key) ? meta_int(f, key, lo, hi) : def;
}

float meta_float_or(const gguf::File& f, const std::string& key, float def) {
  const gguf::Value* v = f.find(key);
  if (!v) return def;
  double x = 0;
  int64_t i = 0;
  if (v->type == gguf::ValueType::FLOAT32 || v->type == gguf::ValueType::FLOAT64)
    x = v->num.f;
  else if (value_int(*v, i))
    x = static_cast<double>(i);
  else
    fail("{}: metadata '{}' should be a number, found {}", f.path(), key,
         gguf::value_type_name(v->type));
  STRATA_REQUIRE(std::isfinite(x), "{}: metadata '{}' is not finite", f.path(), key);
  return static_cast<float>(x);
}

bool meta_bool_or(const gguf::File& f, const std::string& key, bool def) {
  const gguf::Value* v = f.find(key);
  if (!v) return def;
  STRATA_REQUIRE(v->type == gguf::ValueType::BOOL, "{}: metadata '{}' should be a bool, found {}",
                 f.path(), key, gguf::value_type_name(v->type));
  return v->num.b;
}

HParams read_common_hparams(const gguf::File& f) {
  HParams hp;
  const gguf::Value* a = f.find("general.architecture");
  STRATA_REQUIRE(a && a->type == gguf::ValueType::STRING,
                 "{}: missing string metadata 'general.architecture'", f.path());
  hp.arch = a->str;
  const std::string p = hp.arch + ".";
  constexpr int64_t kBig = 1 << 24;
  hp.n_ctx_train = static_cast<int32_t>(meta_int_or(f, p + "context_length", 4096, 1, INT32_MAX));
  hp.n_embd = static_cast<int32_t>(meta_int(f, p + "embedding_length", 1, kBig));
  hp.n_layer = static_cast<int32_t>(meta_int(f, p + "block_count", 1, 4096));
  hp.n_head = static_cast<int32_t>(meta_int(f, p + "attention.head_count", 1, 4096));
  hp.n_head_kv = static_cast<int32_t>(
      meta_int_or(f, p + "attention.head_count_kv", hp.n_head, 1, hp.n_head));
  STRATA_REQUIRE(hp.n_head % hp.n_head_kv == 0,
                 "{}: head_count {} is not a multiple of head_count_kv {}", f.path(), hp.n_head,
                 hp.n_head_kv);
  hp.head_dim = static_cast<int32_t>(
      meta_int_or(f, p + "attention.key_length", hp.n_embd / hp.n_head, 1, 65536));
  hp.head_dim_v = static_cast<int32_t>(
      meta_int_or(f, p + "attention.value_length", hp.head_dim, 1, 65536));
  hp.n_rot = static_cast<int32_t>(meta_int_or(f, p + "rope.dimension_count", hp.head_dim, 2, hp.head_dim));
  STRATA_REQUIRE(hp.n_rot % 2 == 0, "{}: rope.dimension_count {} must be even", f.path(), hp.n_rot);
  hp.rope_base = meta_float_or(f, p + "rope.freq_base", 10000.0f);
  STRATA_REQUIRE(hp.rope_base > 0, "{}: rope.freq_base must be > 0", f.path());
  hp.rms_eps = meta_float_or(f, p + "attention.layer_norm_rms_epsilon", 1e-6f);
  STRATA_REQUIRE(hp.rms_eps >= 0, "{}: layer_norm_rms_epsilon must be >= 0", f.path());
  hp.n_expert = static_cast<int32_t>(meta_int_or(f, p + "expert_count", 0, 0, 1024));
  hp.n_expert_used = static_cast<int32_t>(
      meta_int_or(f, p + "expert_used_count", 0, 0, std::max<int64_t>(hp.n_expert, 0)));
  hp.n_ff_exp = static_cast<int32_t>(meta_int_or(f, p + "expert_feed_forward_length", 0, 0, kBig));
  hp.expert_weights_norm = meta_bool_or(f, p + "expert_weights_norm", true);
  hp.bos_id = static_cast<int32_t>(meta_int_or(f, "tokenizer.ggml.bos_token_id", -1, -1, INT32_MAX));
  hp.eos_id = static_cast<int32_t>(meta_int_or(f, "tokenizer.ggml.eos_token_id", -1, -1, INT32_MAX));
  return hp;
}

void check_moe_hparams_and_vocab(HParams& hp, const gguf::File& file) {
  const std::string& f = file.path();
  const std::string& a = hp.arch;
  STRATA_REQUIRE(hp.n_expert >= 1, "{}: {} needs {}.expert_count >= 1", f, a, a);
  STRATA_REQUIRE(hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert,
                 "{}: {}.expert_used_count {} must be in [1, expert_count {}]", f, a,
                 hp.n_expert_used, hp.n_expert);
  STRATA_REQUIRE(hp.n_expert <= cpu::kMaxExperts, "{}: {} experts, at most {} supported", f,
                 hp.n_expert, cpu::kMaxExperts);
  STRATA_REQUIRE(hp.n_ff_exp >= 1, "{}: missing {}.expert_feed_forward_length", f, a);
  STRATA_REQUIRE(hp.n_rot <= cpu::kMaxRot, "{}: rope dimension {} above {}", f, hp.n_rot,
                 cpu::kMaxRot);
  const gguf::TensorInfo* te = file.find_tensor("token_embd.weight");
  STRATA_REQUIRE(te, "{}: missing tensor 'token_embd.weight'", f);
  STRATA_REQUIRE(te->n_dims == 2 && te->ne[1] >= 1 && te->ne[1] <= INT32_MAX,
                 "{}: token_embd.weight should be 2-D [n_embd][n_vocab]", f);
  hp.n_vocab = static_cast<int32_t>(te->ne[1]);
}

}  // namespace strata
