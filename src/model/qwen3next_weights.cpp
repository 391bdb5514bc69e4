#include "model/qwen3next_weights.h"

#include "common/error.h"
#include "quant/dequant.h"

namespace strata::qwen3next {
namespace {

void load_gdn(const gguf::File& f, const HParams& hp, const NextParams& np, WeightLoader& L,
              const std::string& p, GdnWeights& w, std::vector<std::vector<float>>& conv_f32) {
  const int64_t E = hp.n_embd, Kc = np.conv_kernel, C = np.conv_dim(), Hv = np.n_v_heads;
  const int64_t Vd = np.value_dim();
  if (f.find_tensor(p + "attn_qkv.weight") || !f.find_tensor(p + "ssm_in.weight")) {
    w.qkv = L.matrix(p + "attn_qkv.weight", {E, C});
    w.gate = L.matrix(p + "attn_gate.weight", {E, Vd});
  } else {
    w.qkvz = L.matrix(p + "ssm_in.weight", {E, C + Vd});  // legacy fused projection
  }
  w.ba = L.matrix(p + "ssm_ba.weight", {E, 2 * Hv});
  Weight conv = L.matrix(p + "ssm_conv1d.weight", {Kc, C});
  if (conv.type == GgmlType::F32) {
    w.conv = conv.f32();
  } else {  // small (conv_dim x K): converted once here so the conv kernel stays f32
    auto& buf = conv_f32.emplace_back(size_t(Kc * C));
    for (int64_t c = 0; c < C; ++c)
      dequantize_row(conv.type, conv.data + c * conv.row_bytes(), buf.data() + c * Kc, Kc);
    w.conv = buf.data();
  }
  w.a = L.f32(p + "ssm_a", {Hv});
  w.dt_bias = L.f32(p + "ssm_dt.bias", {Hv});
  w.norm = L.f32(p + "ssm_norm.weight", {np.head_dim});
  w.out = L.matrix(p + "ssm_out.weight", {Vd, E});
}

void load_attention(const HParams& hp, WeightLoader& L, const std::string& p, AttnWeights& w) {
  const int64_t E = hp.n_embd, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim;
  const int64_t Dv = hp.head_dim_v;
  w.wq = L.matrix(p + "attn_q.weight", {E, H * 2 * D});
  w.wk = L.matrix(p + "attn_k.weight", {E, Hkv * D});
  w.wv = L.matrix(p + "attn_v.weight", {E, Hkv * Dv});
  w.q_norm = L.f32(p + "attn_q_norm.weight", {D});
  w.k_norm = L.f32(p + "attn_k_norm.weight", {D});
  w.wo = L.matrix(p + "attn_output.weight", {H * Dv, E});
}

void load_ffn(const HParams& hp, const NextParams& np, WeightLoader& L, const std::string& p, Layer& l) {
  const int64_t E = hp.n_embd, X = hp.n_expert, F = hp.n_ff_exp, Fs = np.n_ff_shexp;
  l.router = L.matrix(p + "ffn_gate_inp.weight", {E, X});
  l.experts.gate = L.matrix(p + "ffn_gate_exps.weight", {E, F, X});
  l.experts.up = L.matrix(p + "ffn_up_exps.weight", {E, F, X});
  l.experts.down = L.matrix(p + "ffn_down_exps.weight", {F, E, X});
  l.sh_gate_inp = L.f32(p + "ffn_gate_inp_shexp.weight", {E});
  l.sh_gate = L.matrix(p + "ffn_gate_shexp.weight", {E, Fs});
  l.sh_up = L.matrix(p + "ffn_up_shexp.weight", {E, Fs});
  l.sh_down = L.matrix(p + "ffn_down_shexp.weight", {Fs, E});
}

void load_nextn(const gguf::File& f, const HParams& hp, int il, std::map<std::string, Weight>& nextn) {
  // An MTP block: the projections that join the embedding and the hidden state must be there; the
  // rest of the block (a full-attention decoder layer, optionally its own head) is kept as found.
  const std::string p = "blk." + std::to_string(il) + ".";
  WeightLoader L(f);
  const int64_t E = hp.n_embd;
  nextn[p + "nextn.eh_proj.weight"] = L.matrix(p + "nextn.eh_proj.weight", {2 * E, E});
  nextn[p + "nextn.enorm.weight"] = L.f32(p + "nextn.enorm.weight", {E});
  nextn[p + "nextn.hnorm.weight"] = L.f32(p + "nextn.hnorm.weight", {E});
  for (const auto& t : f.tensors()) {
    if (t.name.rfind(p, 0) != 0 || nextn.count(t.name)) continue;
    Weight w;
    w.info = &t;
    w.type = t.type;
    w.data = t.data;
    for (int i = 0; i < 4; ++i) w.ne[i] = int64_t(t.ne[i]);
    nextn[t.name] = w;
  }
}

// Layer pattern: `<arch>.attention.recurrent_layers` (bool/int array over the layers, or one value for
// all) when present, else every full_attention_interval-th layer attends (default 4, as llama.cpp).
std::vector<bool> read_layer_pattern(const gguf::File& f, const std::string& p, int32_t n_layer) {
  std::vector<bool> rec(static_cast<size_t>(n_layer));
  const std::string key = p + "attention.recurrent_layers";
  if (const gguf::Value* v = f.find(key)) {
    auto truth = [&](const gguf::Value& e) -> bool {
      using VT = gguf::ValueType;
      switch (e.type) {
        case VT::BOOL: return e.num.b;
        case VT::UINT8: case VT::UINT16: case VT::UINT32: case VT::UINT64: return e.num.u != 0;
        case VT::INT8: case VT::INT16: case VT::INT32: case VT::INT64: return e.num.i != 0;
        default:
          fail("{}: '{}' should hold booleans or integers, found {}", f.path(), key,
               gguf::value_type_name(e.type));
      }
    };
    if (v->type == gguf::ValueType::ARRAY) {
      STRATA_REQUIRE(v->arr.size() >= size_t(n_layer),
                     "{}: '{}' has {} entries for {} layers", f.path(), key, v->arr.size(), n_layer);
      for (int32_t i = 0; i < n_layer; ++i) rec[size_t(i)] = truth(v->arr[size_t(i)]);
    } else {
      std::fill(rec.begin(), rec.end(), truth(*v));
    }
    return rec;
  }
  const int64_t interval = meta_int_or(f, p + "full_attention_interval", 4, 1, 1 << 20);
  for (int32_t i = 0; i < n_layer; ++i) rec[size_t(i)] = (i + 1) % interval != 0;
  return rec;
}

}  // namespace

NextParams read_next_params(const gguf::File& f, const HParams& hp) {
  const std::string p = hp.arch + ".";
  const std::string& path = f.path();
  NextParams np;
  constexpr int64_t kBig = 1 << 20;
  np.conv_kernel = int32_t(meta_int(f, p + "ssm.conv_kernel", 1, 64));
  np.d_inner = int32_t(meta_int(f, p + "ssm.inner_size", 1, kBig));
  np.head_dim = int32_t(meta_int(f, p + "ssm.state_size", 1, 4096));
  np.n_v_heads = int32_t(meta_int(f, p + "ssm.time_step_rank", 1, 65536));
  np.n_k_heads = int32_t(meta_int(f, p + "ssm.group_count", 1, 65536));
  STRATA_REQUIRE(np.n_v_heads % np.n_k_heads == 0,
                 "{}: inconsistent head counts: ssm.time_step_rank (value heads) {} is not a multiple "
                 "of ssm.group_count (key heads) {}",
                 path, np.n_v_heads, np.n_k_heads);
  STRATA_REQUIRE(int64_t(np.n_v_heads) * np.head_dim == np.d_inner,
                 "{}: inconsistent head counts: ssm.inner_size {} != ssm.time_step_rank {} x "
                 "ssm.state_size {}",
                 path, np.d_inner, np.n_v_heads, np.head_dim);
  np.n_ff_shexp = int32_t(meta_int_or(f, p + "expert_shared_feed_forward_length", hp.n_ff_exp, 1, kBig));
  np.n_nextn = int32_t(meta_int_or(f, p + "nextn_predict_layers", 0, 0, hp.n_layer - 1));
  np.n_layer = hp.n_layer - np.n_nextn;
  np.recurrent = read_layer_pattern(f, p, np.n_layer);
  return np;
}

void load_weights(const gguf::File& f, const HParams& hp, const NextParams& np, Weights& w) {
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  WeightLoader L(f);
  w.tok_embd = L.matrix("token_embd.weight", {E, V});
  w.output_norm = L.f32("output_norm.weight", {E});
  w.output = L.optional_matrix("output.weight", {E, V});
  w.tied = !w.output;
  if (w.tied) w.output = w.tok_embd;
  w.layers.assign(size_t(np.n_layer), Layer());
  w.conv_f32.reserve(size_t(np.n_layer));  // pointers into it are kept: no reallocation
  for (int il = 0; il < np.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    Layer& l = w.layers[size_t(il)];
    l.recurrent = np.recurrent[size_t(il)];
    l.attn_norm = L.f32(p + "attn_norm.weight", {E});
    l.post_norm = L.f32(p + "post_attention_norm.weight", {E});
    try {
      if (l.recurrent)
        load_gdn(f, hp, np, L, p, l.gdn, w.conv_f32);
      else
        load_attention(hp, L, p, l.attn);
    } catch (const Error& e) {
      fail("{} (layer {} is a {} layer)", e.what(), il, l.recurrent ? "Gated DeltaNet" : "full-attention");
    }
    load_ffn(hp, np, L, p, l);
  }
  for (int il = np.n_layer; il < np.n_layer + np.n_nextn; ++il) load_nextn(f, hp, il, w.nextn);
}

}  // namespace strata::qwen3next
