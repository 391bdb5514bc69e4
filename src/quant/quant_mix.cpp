#include "quant/quant_mix.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/error.h"

namespace strata {
namespace {

using S = QuantScheme;
using T = GgmlType;

struct SchemeInfo {
  S scheme;
  std::string_view name;
  T base;
  uint32_t file_type;
  bool pure;  // no per-tensor rules
};
constexpr SchemeInfo kSchemes[] = {
    {S::Q8_0, "Q8_0", T::Q8_0, 7, true},        {S::Q6_K, "Q6_K", T::Q6_K, 18, true},
    {S::Q5_K, "Q5_K", T::Q5_K, 16, true},       {S::Q4_K, "Q4_K", T::Q4_K, 14, true},
    {S::Q4_0, "Q4_0", T::Q4_0, 2, false},       {S::Q4_1, "Q4_1", T::Q4_1, 3, false},
    {S::Q5_0, "Q5_0", T::Q5_0, 8, false},       {S::Q5_1, "Q5_1", T::Q5_1, 9, false},
    {S::Q2_K, "Q2_K", T::Q2_K, 10, false},      {S::Q3_K_S, "Q3_K_S", T::Q3_K, 11, false},
    {S::Q3_K_M, "Q3_K_M", T::Q3_K, 12, false},  {S::Q3_K_L, "Q3_K_L", T::Q3_K, 13, false},
    {S::Q4_K_S, "Q4_K_S", T::Q4_K, 14, false},  {S::Q4_K_M, "Q4_K_M", T::Q4_K, 15, false},
    {S::Q5_K_S, "Q5_K_S", T::Q5_K, 16, false},  {S::Q5_K_M, "Q5_K_M", T::Q5_K, 17, false},
    {S::IQ4_NL, "IQ4_NL", T::IQ4_NL, 25, false}, {S::IQ4_XS, "IQ4_XS", T::IQ4_XS, 30, false},
};

const SchemeInfo& info(S s) {
  for (const auto& i : kSchemes)
    if (i.scheme == s) return i;
  fail("quantize: unknown scheme {}", static_cast<int>(s));
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The output projection: output.weight, or token_embd.weight where the model has none (tied).
bool is_output(const std::string& n, bool has_output) {
  return n == "output.weight" || (!has_output && n == "token_embd.weight");
}

bool is_v_like(const std::string& n) {
  return has(n, "attn_v.weight") || has(n, "attn_qkv.weight") || has(n, "attn_kv_b.weight");
}

// Layer index from "blk.<i>." (-1 when the name has none).
int layer_of(const std::string& name) {
  int i = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &i) != 1) return -1;
  return i;
}

bool fits(T t, uint64_t ne0) { return ne0 % type_traits(t).block_size == 0; }

// llama.cpp's fallback for rows that are not whole blocks of the chosen type.
T fit_row(T want, uint64_t ne0) {
  if (fits(want, ne0)) return want;
  T next = T::F16;
  switch (want) {
    case T::IQ4_XS: next = T::IQ4_NL; break;
    case T::Q2_K: case T::Q3_K: next = T::Q4_0; break;
    case T::Q4_K: next = T::Q5_0; break;
    case T::Q5_K: next = T::Q5_1; break;
    case T::Q6_K: next = T::Q8_0; break;
    default: break;
  }
  return fits(next, ne0) ? next : T::F16;
}

struct PlanState {
  const ModelShape& shape;
  bool has_output;
  int n_v, i_v = 0;
};

// llama_tensor_get_type's choice for one quantizable tensor (see quant_mix.h).
T mixed_type(const TensorPlanInput& t, S s, PlanState& st) {
  const std::string& n = t.name;
  const T base = info(s).base;
  const bool eight = st.shape.n_expert == 8, gqa4 = st.shape.n_gqa >= 4;
  if (is_output(n, st.has_output)) {
    if (!fits(base, t.ne0)) return T::Q8_0;
    return base == T::Q8_0 ? T::Q8_0 : T::Q6_K;
  }
  if (is_v_like(n)) {
    T v = base;
    const int i = st.i_v++;
    switch (s) {
      case S::Q2_K: v = gqa4 ? T::Q4_K : T::Q3_K; break;
      case S::Q3_K_M: v = i < 2 ? T::Q5_K : T::Q4_K; break;
      case S::Q3_K_L: v = T::Q5_K; break;
      case S::IQ4_NL: case S::IQ4_XS: if (gqa4) v = T::Q5_K; break;
      case S::Q4_K_M: case S::Q5_K_M: if (use_more_bits(i, st.n_v)) v = T::Q6_K; break;
      case S::Q4_K_S: if (i < 4) v = T::Q5_K; break;
      default: break;
    }
    return eight ? T::Q8_0 : v;
  }
  if (has(n, "attn_k.weight")) return eight ? T::Q8_0 : base;
  if (has(n, "ffn_down")) {
    const int i = layer_of(n), nl = st.shape.n_layer;
    STRATA_REQUIRE(i >= 0 && i < std::max(nl, 1), "quantize: cannot place {} in a layer of {}", n, nl);
    switch (s) {
      case S::Q2_K: return T::Q3_K;
      case S::Q3_K_M: return i < nl / 16 ? T::Q5_K : T::Q4_K;
      case S::Q3_K_L: return T::Q5_K;
      case S::Q4_K_M: return use_more_bits(i, nl) ? T::Q6_K : base;
      case S::IQ4_NL: case S::IQ4_XS: return i < nl / 8 ? T::Q5_K : base;
      case S::Q5_K_M: return use_more_bits(i, nl) ? T::Q6_K : base;
      case S::Q4_K_S: return i < nl / 8 ? T::Q5_K : base;
      default: return base;
    }
  }
  if (has(n, "attn_output.weight")) {
    if (eight) {
      switch (s) {
        case S::Q2_K: case S::Q3_K_S: case S::Q3_K_M: case S::IQ4_NL: case S::Q4_K_S: case S::Q4_K_M:
        case S::IQ4_XS:
          return T::Q5_K;
        default: return base;
      }
    }
    switch (s) {
      case S::Q2_K: return T::Q3_K;
      case S::Q3_K_M: return T::Q4_K;
      case S::Q3_K_L: return T::Q5_K;
      default: return base;
    }
  }
  return base;
}

}  // namespace

std::optional<QuantScheme> quant_scheme_from_name(std::string_view name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& i : kSchemes)
    if (i.name == up) return i.scheme;
  return std::nullopt;
}

std::string_view quant_scheme_name(QuantScheme s) { return info(s).name; }

std::string quant_scheme_names() {
  std::string out;
  for (const auto& i : kSchemes) out += (out.empty() ? "" : ", ") + std::string(i.name);
  return out;
}

GgmlType quant_scheme_base_type(QuantScheme s) { return info(s).base; }

uint32_t quant_scheme_file_type(QuantScheme s) { return info(s).file_type; }

bool tensor_is_quantizable(const TensorPlanInput& t) {
  const std::string& n = t.name;
  if (t.n_dims < 2 || !ends_with(n, "weight")) return false;
  if (has(n, "_norm.weight") || has(n, "ffn_gate_inp") || has(n, "ssm_conv1d")) return false;
  if (n == "position_embd.weight" || n == "token_types.weight") return false;
  return true;
}

std::vector<GgmlType> plan_quantization(const std::vector<TensorPlanInput>& tensors, QuantScheme scheme,
                                        const ModelShape& shape, bool pure) {
  STRATA_REQUIRE(shape.n_layer >= 0 && shape.n_expert >= 0 && shape.n_gqa >= 1,
                 "quantize: bad model shape ({} layers, {} experts, {} query heads per KV head)", shape.n_layer,
                 shape.n_expert, shape.n_gqa);
  PlanState st{shape, false, 0};
  for (const auto& t : tensors) {
    st.has_output |= t.name == "output.weight";
    st.n_v += is_v_like(t.name);
  }
  pure |= info(scheme).pure;
  std::vector<GgmlType> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!tensor_is_quantizable(t)) {
      out.push_back(t.type);
      continue;
    }
    out.push_back(fit_row(pure ? info(scheme).base : mixed_type(t, scheme, st), t.ne0));
  }
  return out;
}

}  // namespace strata
