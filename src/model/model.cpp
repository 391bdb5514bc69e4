#include "model/model.h"

#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

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

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

// Maps every page of the tensor data into the process before the first forward pass (as llama.cpp's
// loader does with MAP_POPULATE). Why: otherwise the first use of each expert in decode pays ~200 page
// faults per matrix; on the 4-layer synthetic Qwen3-30B-A3B at 1 thread the MoE part of a decode step
// took 6.4-7.5 ms without and 5.1-5.5 ms with it (load 0.03 -> 0.17-0.27 s with the file in the page
// cache; bench/results/2026-11-29-cpu-decode-q4k.md). STRATA_POPULATE=0 skips it, =1 forces it; by
// default it is skipped when the weights exceed half the machine's memory (a model that does not fit
// would be read whole for nothing). A kernel without MADV_POPULATE_READ: nothing happens.
void populate_weights(const gguf::File& f) {
  if (f.tensors().empty()) return;
  const char* e = std::getenv("STRATA_POPULATE");
  STRATA_REQUIRE(!e || !*e || std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0,
                 "STRATA_POPULATE must be 0 or 1, got '{}'", e);
  if (e && std::strcmp(e, "0") == 0) return;
  const uint64_t bytes = f.file_size() - f.data_offset();
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const bool forced = e && std::strcmp(e, "1") == 0;
  if (!forced && (pages <= 0 || page <= 0 || bytes > uint64_t(pages) * uint64_t(page) / 2)) return;
  const gguf::TensorInfo& t = f.tensors()[0];
  const uintptr_t start = reinterpret_cast<uintptr_t>(t.data) - t.offset;  // the data section
  const uintptr_t aligned = start & ~(uintptr_t(page) - 1);
  (void)madvise(reinterpret_cast<void*>(aligned), bytes + (start - aligned), MADV_POPULATE_READ);
}

std::unique_ptr<Model> load_model(const std::string& path) {
  gguf::File f = gguf::File::open(path);
  populate_weights(f);
  return load_model(std::move(f));
}

}  // namespace strata
