#include "model/model.h"

#include <fmt/ranges.h>

#include "model/qwen3moe.h"
#include "model/qwen3next.h"
#include "quant/q4k_repack.h"

namespace strata {

// Another model may later be mapped at the same addresses: no repacked copy may outlive its weights.
Model::~Model() { q::q4k_repack_clear(); }

std::vector<std::string> supported_architectures() { return {"qwen3moe", "qwen3next"}; }

std::unique_ptr<Model> load_model(gguf::File file) {
  const gguf::Value* a = file.find("general.architecture");
  STRATA_REQUIRE(a && a->type == gguf::ValueType::STRING,
                 "{}: missing string metadata 'general.architecture'", file.path());
  const std::string arch = a->str;
  if (arch == "qwen3moe") return make_qwen3moe(std::move(file));
  if (arch == "qwen3next") return make_qwen3next(std::move(file));
  fail("{}: unknown architecture '{}' (supported: {})", file.path(), arch,
       fmt::join(supported_architectures(), ", "));
}

std::unique_ptr<Model> load_model(const std::string& path) { return load_model(gguf::File::open(path)); }

}  // namespace strata
