#include "quant/types.h"

#include <array>
#include <cctype>
#include <cstdlib>

namespace strata {
namespace {

constexpr TypeTraits kTypes[] = {
    {GgmlType::F32, "f32", 1, 4, false},          {GgmlType::F16, "f16", 1, 2, false},
    {GgmlType::Q4_0, "q4_0", 32, 18, true},       {GgmlType::Q4_1, "q4_1", 32, 20, true},
    {GgmlType::Q5_0, "q5_0", 32, 22, true},       {GgmlType::Q5_1, "q5_1", 32, 24, true},
    {GgmlType::Q8_0, "q8_0", 32, 34, true},       {GgmlType::Q8_1, "q8_1", 32, 36, true},
    {GgmlType::Q2_K, "q2_K", 256, 84, true},      {GgmlType::Q3_K, "q3_K", 256, 110, true},
    {GgmlType::Q4_K, "q4_K", 256, 144, true},     {GgmlType::Q5_K, "q5_K", 256, 176, true},
    {GgmlType::Q6_K, "q6_K", 256, 210, true},     {GgmlType::Q8_K, "q8_K", 256, 292, true},
    {GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, true}, {GgmlType::IQ2_XS, "iq2_xs", 256, 74, true},
    {GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, true}, {GgmlType::IQ1_S, "iq1_s", 256, 50, true},
    {GgmlType::IQ4_NL, "iq4_nl", 32, 18, true},   {GgmlType::IQ3_S, "iq3_s", 256, 110, true},
    {GgmlType::IQ2_S, "iq2_s", 256, 82, true},    {GgmlType::IQ4_XS, "iq4_xs", 256, 136, true},
    {GgmlType::I8, "i8", 1, 1, false},            {GgmlType::I16, "i16", 1, 2, false},
    {GgmlType::I32, "i32", 1, 4, false},          {GgmlType::I64, "i64", 1, 8, false},
    {GgmlType::F64, "f64", 1, 8, false},          {GgmlType::IQ1_M, "iq1_m", 256, 56, true},
    {GgmlType::BF16, "bf16", 1, 2, false},        {GgmlType::TQ1_0, "tq1_0", 256, 54, true},
    {GgmlType::TQ2_0, "tq2_0", 256, 66, true},    {GgmlType::MXFP4, "mxfp4", 32, 17, true},
};

// strata's own storage types (types.h): not in the id index, not found by name.
constexpr TypeTraits kInternalTypes[] = {
    {GgmlType::Q4_0_X8, "q4_0x8", 256, 144, true},
    {GgmlType::Q6_K_X8, "q6_kx8", 2048, 1680, true},
    {GgmlType::Q6_K_P, "q6_kp", 256, 224, true},
};

constexpr uint32_t kMaxId = 40;
constexpr std::array<const TypeTraits*, kMaxId> make_index() {
  std::array<const TypeTraits*, kMaxId> idx{};
  for (const auto& t : kTypes) idx[static_cast<uint32_t>(t.type)] = &t;
  return idx;
}
constexpr auto kIndex = make_index();

}  // namespace

const TypeTraits* file_type_traits(uint32_t id) { return id < kMaxId ? kIndex[id] : nullptr; }

const TypeTraits* find_type_traits(GgmlType t) {
  if (const TypeTraits* tt = file_type_traits(static_cast<uint32_t>(t))) return tt;
  for (const auto& it : kInternalTypes)
    if (it.type == t) return &it;
  return nullptr;
}

const TypeTraits& type_traits(GgmlType t) {
  const TypeTraits* tt = find_type_traits(t);
  if (!tt) std::abort();  // unreachable: GgmlType values only come from validated ids
  return *tt;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::tolower(static_cast<unsigned char>(name[i])) ==
           std::tolower(static_cast<unsigned char>(t.name[i]));
    if (eq) return t.type;
  }
  return std::nullopt;
}

}  // namespace strata
