#include "model/weights.h"

#include <fmt/format.h>

#include "common/error.h"

namespace strata {

std::string shape_str(const int64_t* ne, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

Weight WeightLoader::get(const std::string& name, std::initializer_list<int64_t> shape,
                         bool f32_only) const {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  STRATA_REQUIRE(t, "{}: missing tensor '{}' (expected shape {})", f_.path(), name,
                 shape_str(shape.begin(), static_cast<int>(shape.size())));
  Weight w;
  w.info = t;
  w.type = t->type;
  w.data = t->data;
  for (int i = 0; i < 4; ++i) w.ne[i] = static_cast<int64_t>(t->ne[i]);
  bool ok = true;
  int i = 0;
  for (int64_t d : shape) ok = ok && w.ne[i++] == d;
  for (; i < 4; ++i) ok = ok && w.ne[i] == 1;
  STRATA_REQUIRE(ok, "{}: tensor '{}' has shape {}, expected {}", f_.path(), name,
                 shape_str(w.ne, static_cast<int>(t->n_dims)),
                 shape_str(shape.begin(), static_cast<int>(shape.size())));
  if (f32_only) {
    STRATA_REQUIRE(t->type == GgmlType::F32, "{}: tensor '{}' has type {}, expected f32", f_.path(),
                   name, type_name(t->type));
  } else {
    const auto& tt = type_traits(t->type);
    STRATA_REQUIRE(w.ne[0] % tt.block_size == 0,
                   "{}: tensor '{}' of type {} has rows of {} values, not a multiple of its block "
                   "size {}", f_.path(), name, tt.name, w.ne[0], tt.block_size);
    STRATA_REQUIRE(t->type != GgmlType::I8 && t->type != GgmlType::I16 && t->type != GgmlType::I32 &&
                       t->type != GgmlType::I64 && t->type != GgmlType::F64,
                   "{}: tensor '{}' has type {}, which is not a weight format", f_.path(), name,
                   tt.name);
  }
  ++used_;
  return w;
}

Weight WeightLoader::matrix(const std::string& name, std::initializer_list<int64_t> shape) const {
  return get(name, shape, false);
}

Weight WeightLoader::f32(const std::string& name, std::initializer_list<int64_t> shape) const {
  return get(name, shape, true);
}

Weight WeightLoader::optional_matrix(const std::string& name,
                                     std::initializer_list<int64_t> shape) const {
  if (!f_.find_tensor(name)) return Weight{};
  return get(name, shape, false);
}

}  // namespace strata
