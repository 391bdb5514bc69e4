#include "cuda/backend.h"

#include <string>

#include "common/error.h"

namespace strata::cuda {

std::unique_ptr<Model> load_model_cuda(const std::string& path, const CudaOptions& opt) {
  gguf::File file = gguf::File::open(path);
  populate_weights(file);  // the CPU pool reads non-resident experts from the mapping
  const gguf::Value* a = file.find("general.architecture");
  STRATA_REQUIRE(a && a->type == gguf::ValueType::STRING, "{}: missing string metadata 'general.architecture'",
                 path);
  const std::string arch = a->str;
  STRATA_REQUIRE(arch == "qwen3moe" || arch == "qwen3next",
                 "{}: the CUDA backend does not support architecture {} yet; use --backend cpu", path, arch);
  std::unique_ptr<Model> m =
      arch == "qwen3moe" ? make_qwen3moe_cuda(std::move(file), opt) : make_qwen3next_cuda(std::move(file), opt);
  return m;
}

}  // namespace strata::cuda
