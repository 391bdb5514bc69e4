#include "quant/quant_mix.h"

#include <cctype>
#include <cstdio>

#include "common/error.h"

namespace strata {
namespace {

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

GgmlType fit_row(GgmlType want, uint64_t ne0) {
  if (ne0 % type_traits(want).block_size == 0) return want;
  if (ne0 % 32 == 0) return GgmlType::Q8_0;
  return GgmlType::F16;
}

}  // namespace

std::optional<QuantScheme> quant_scheme_from_name(std::string_view name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up == "Q8_0") return QuantScheme::Q8_0;
  if (up == "Q6_K") return QuantScheme::Q6_K;
  if (up == "Q5_K") return QuantScheme::Q5_K;
  if (up == "Q4_K") return QuantScheme::Q4_K;
  if (up == "Q4_K_M") return QuantScheme::Q4_K_M;
  if (up == "Q4_0") return QuantScheme::Q4_0;
  return std::nullopt;
}

std::string_view quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::Q8_0: return "Q8_0";
    case QuantScheme::Q6_K: return "Q6_K";
    case QuantScheme::Q5_K: return "Q5_K";
    case QuantScheme::Q4_K: return "Q4_K";
    case QuantScheme::Q4_K_M: return "Q4_K_M";
    case QuantScheme::Q4_0: return "Q4_0";
  }
  return "?";
}

uint32_t quant_scheme_file_type(QuantScheme s) {
  switch (s) {
    case QuantScheme::Q4_0: return 2;
    case QuantScheme::Q8_0: return 7;
    case QuantScheme::Q4_K: return 14;
    case QuantScheme::Q4_K_M: return 15;
    case QuantScheme::Q5_K: return 16;
    case QuantScheme::Q6_K: return 18;
  }
  return 0;
}

bool tensor_is_quantizable(const TensorPlanInput& t) {
  const std::string& n = t.name;
  if (t.n_dims < 2 || !ends_with(n, "weight")) return false;
  if (has(n, "_norm.weight") || has(n, "ffn_gate_inp") || has(n, "ssm_conv1d")) return false;
  if (n == "position_embd.weight" || n == "token_types.weight") return false;
  return true;
}

std::vector<GgmlType> plan_quantization(const std::vector<TensorPlanInput>& tensors, QuantScheme scheme,
                                        int n_layer, int n_expert) {
  STRATA_REQUIRE(n_layer >= 0 && n_expert >= 0, "quantize: bad model shape ({} layers, {} experts)", n_layer, n_expert);
  bool has_output = false;
  int n_v = 0;
  for (const auto& t : tensors) {
    has_output |= t.name == "output.weight";
    n_v += is_v_like(t.name);
  }
  std::vector<GgmlType> out;
  out.reserve(tensors.size());
  int i_v = 0;
  for (const auto& t : tensors) {
    if (!tensor_is_quantizable(t)) {
      out.push_back(t.type);
      continue;
    }
    GgmlType want;
    switch (scheme) {
      case QuantScheme::Q8_0: want = GgmlType::Q8_0; break;
      case QuantScheme::Q6_K: want = GgmlType::Q6_K; break;
      case QuantScheme::Q5_K: want = GgmlType::Q5_K; break;
      case QuantScheme::Q4_K: want = GgmlType::Q4_K; break;
      case QuantScheme::Q4_0: {
        const std::string& n = t.name;
        want = GgmlType::Q4_0;
        if (is_output(n, has_output)) want = GgmlType::Q6_K;
        else if (n_expert == 8 && (is_v_like(n) || has(n, "attn_k.weight"))) want = GgmlType::Q8_0;
        break;
      }
      case QuantScheme::Q4_K_M: {
        const std::string& n = t.name;
        want = GgmlType::Q4_K;
        if (is_output(n, has_output)) {
          want = GgmlType::Q6_K;
        } else if (is_v_like(n)) {
          if (use_more_bits(i_v, n_v)) want = GgmlType::Q6_K;
          if (n_expert == 8) want = GgmlType::Q8_0;
          ++i_v;
        } else if (has(n, "attn_k.weight")) {
          if (n_expert == 8) want = GgmlType::Q8_0;
        } else if (has(n, "ffn_down")) {
          const int layer = layer_of(n);
          STRATA_REQUIRE(layer >= 0 && layer < std::max(n_layer, 1), "quantize: cannot place {} in a layer of {}", n,
                         n_layer);
          if (use_more_bits(layer, n_layer)) want = GgmlType::Q6_K;
        } else if (has(n, "attn_output.weight")) {
          if (n_expert == 8) want = GgmlType::Q5_K;
        }
        break;
      }
      default: fail("quantize: unknown scheme");
    }
    out.push_back(fit_row(want, t.ne0));
  }
  return out;
}

}  // namespace strata
