// `strata dequant MODEL.gguf TENSOR -o OUT.f32`: a tensor's values as raw little-endian f32 in storage
// order (ne[0] fastest), whatever its type. For debugging and scripts (numpy.fromfile(..., '<f4')).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "quant/dequant.h"

namespace strata::cli {
namespace {

int run_dequant(const std::string& model, const std::string& tensor, const std::string& out) {
  const auto f = gguf::File::open(model);
  const gguf::TensorInfo* t = f.find_tensor(tensor);
  if (!t) fail("{}: no tensor named '{}' ({} tensors; e.g. '{}')", model, tensor, f.tensors().size(),
               f.tensors().empty() ? std::string("none") : f.tensors().front().name);
  STRATA_REQUIRE(can_dequantize(t->type), "{}: tensor '{}' has type {}, which has no dequantization", model, tensor,
                 type_name(t->type));
  const std::string tmp = out + ".tmp";
  std::FILE* fp = std::fopen(tmp.c_str(), "wb");
  STRATA_REQUIRE(fp != nullptr, "cannot open {} for writing", tmp);
  const uint64_t ne0 = t->ne[0], rb = row_bytes(t->type, ne0);
  std::vector<float> row(ne0);
  bool ok = true;
  for (uint64_t r = 0; r < t->n_rows() && ok; ++r) {
    dequantize_row(t->type, t->data + r * rb, row.data(), static_cast<int64_t>(ne0));
    ok = std::fwrite(row.data(), 4, ne0, fp) == ne0;
  }
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("writing {} failed", out);
  }
  std::string shape;
  for (uint32_t d = 0; d < t->n_dims; ++d) shape += (d ? " x " : "") + std::to_string(t->ne[d]);
  std::fprintf(stderr, "%s: %s [%s] %s -> %llu f32 values in %s\n", model.c_str(), tensor.c_str(), shape.c_str(),
               std::string(type_name(t->type)).c_str(), static_cast<unsigned long long>(t->n_elements()), out.c_str());
  return 0;
}

const CommandRegistrar reg{
    "dequant", "Write one tensor's values as raw little-endian f32 (storage order)", [](CLI::App& sub) {
      auto model = std::make_shared<std::string>();
      auto tensor = std::make_shared<std::string>();
      auto out = std::make_shared<std::string>();
      sub.add_option("model", *model, "GGUF file")->required();
      sub.add_option("tensor", *tensor, "tensor name, e.g. blk.0.attn_q.weight")->required();
      sub.add_option("-o,--output", *out, "output file (raw f32)")->required();
      return [=] { return run_dequant(*model, *tensor, *out); };
    }};

}  // namespace
}  // namespace strata::cli
