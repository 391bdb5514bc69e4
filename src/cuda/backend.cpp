#include "cuda/backend.h"

#include <cstdio>
#include <set>
#include <string>

#include "common/error.h"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_kernels.cuh"

namespace strata::cuda {
namespace {

// The low-bit formats' int8 decode kernels are off by default (q8_kernels.cuh low_bit_enabled): the note a
// file with such tensors prints once loaded, so that a user learns of the switch ("" when none applies).
std::string low_bit_note(const gguf::File& file, const CudaOptions& opt) {
  if (opt.exact || !q8::enabled() || q8::low_bit_enabled()) return {};
  std::set<std::string> low;
  for (const auto& t : file.tensors())
    if (q8ref::low_bit(t.type)) low.insert(std::string(type_name(t.type)));
  std::string names;
  for (const auto& n : low) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) return {};
  return "strata: cuda: the " + names + " tensors decode on the f32-activation kernels; STRATA_CUDA_Q8_LOW_BIT=1 "
         "takes their int8 kernels (about 2x the decode speed of a Q2_K file on an H200; off by default while their "
         "accuracy on IQ4_XS / IQ3_S files is below the rest's)\n";
}

}  // namespace

std::unique_ptr<Model> load_model_cuda(const std::string& path, const CudaOptions& opt) {
  gguf::File file = gguf::File::open(path);
  const std::string note = low_bit_note(file, opt);
  populate_weights(file);  // the CPU pool reads non-resident experts from the mapping
  const gguf::Value* a = file.find("general.architecture");
  STRATA_REQUIRE(a && a->type == gguf::ValueType::STRING, "{}: missing string metadata 'general.architecture'",
                 path);
  const std::string arch = a->str;
  STRATA_REQUIRE(arch == "qwen3moe" || arch == "qwen3next",
                 "{}: the CUDA backend does not support architecture {} yet; use --backend cpu", path, arch);
  std::unique_ptr<Model> m =
      arch == "qwen3moe" ? make_qwen3moe_cuda(std::move(file), opt) : make_qwen3next_cuda(std::move(file), opt);
  std::fputs(note.c_str(), stderr);  // (once the model is up: a load that fails says only why)
  return m;
}

}  // namespace strata::cuda
