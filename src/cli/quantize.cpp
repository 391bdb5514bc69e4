// `strata quantize IN.gguf OUT.gguf TYPE [--pure]`: re-encodes a model's weights (TYPE: a scheme of
// src/quant/quant_mix.h, which also says which tensor gets which type). All metadata is kept; general.file_type and
// general.quantization_version are set as llama.cpp does; tensors that are not quantized (norms, the
// router, 1-D tensors) are copied byte for byte; tensor data keeps the file's alignment.
// Each tensor is quantized while the file is written (gguf::Writer's producers, rows split over the threads),
// so memory holds one tensor of output at a time; the file goes through a temporary renamed into place.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/error.h"
#include "cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quant/dequant.h"
#include "quant/quant_mix.h"
#include "quant/quantize.h"

namespace strata::cli {
namespace {

uint32_t get_count(const gguf::File& f, const std::string& key) {
  const gguf::Value* v = f.find(key);
  if (!v) return 0;
  switch (v->type) {
    case gguf::ValueType::UINT32: case gguf::ValueType::UINT64: case gguf::ValueType::UINT16:
    case gguf::ValueType::UINT8:
      return static_cast<uint32_t>(v->num.u);
    case gguf::ValueType::INT32: case gguf::ValueType::INT64: case gguf::ValueType::INT16:
    case gguf::ValueType::INT8:
      STRATA_REQUIRE(v->num.i >= 0, "{}: {} is negative", f.path(), key);
      return static_cast<uint32_t>(v->num.i);
    default:
      fail("{}: {} has type {}, expected an integer", f.path(), key, gguf::value_type_name(v->type));
  }
}

int run_quantize(const std::string& in, const std::string& out, const std::string& type, bool pure, int threads) {
  const auto scheme = quant_scheme_from_name(type);
  STRATA_REQUIRE(scheme.has_value(), "unknown quantization type '{}' (expected one of {})", type, quant_scheme_names());
  const auto f = gguf::File::open(in);
  const gguf::Value* arch_v = f.find("general.architecture");
  STRATA_REQUIRE(arch_v && arch_v->type == gguf::ValueType::STRING, "{}: no general.architecture string", in);
  const std::string arch = arch_v->str;
  const int n_layer = static_cast<int>(get_count(f, arch + ".block_count"));
  const int n_expert = static_cast<int>(get_count(f, arch + ".expert_count"));
  // Query heads per KV head (llama.cpp's n_gqa); 1 where the counts are missing or per-layer arrays.
  auto scalar_count = [&](const std::string& key) -> uint32_t {
    const gguf::Value* v = f.find(key);
    return v && v->type != gguf::ValueType::ARRAY ? get_count(f, key) : 0;
  };
  const uint32_t n_head = scalar_count(arch + ".attention.head_count"),
                 n_head_kv = scalar_count(arch + ".attention.head_count_kv");
  const int n_gqa = n_head && n_head_kv ? static_cast<int>(n_head / n_head_kv) : 1;

  std::vector<TensorPlanInput> plan_in;
  for (const auto& t : f.tensors()) plan_in.push_back({t.name, t.n_dims, t.ne[0], t.type});
  const std::vector<GgmlType> plan = plan_quantization(plan_in, *scheme, {n_layer, n_expert, std::max(n_gqa, 1)}, pure);

  gguf::Writer w;
  for (const auto& kv : f.metadata()) w.set_value(kv.key, kv.value);
  w.set<uint32_t>("general.quantization_version", 2);  // ggml's GGML_QNT_VERSION
  w.set<uint32_t>("general.file_type", quant_scheme_file_type(*scheme));

  ThreadPool pool(threads);
  uint64_t bytes_in = 0, bytes_out = 0;
  size_t n_requant = 0;
  const size_t n_tensors = f.tensors().size();
  for (size_t i = 0; i < n_tensors; ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    const GgmlType target = plan[i];
    const std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    bytes_in += t.nbytes;
    if (target == t.type) {
      w.add_tensor_view(t.name, t.type, dims, t.data, t.nbytes);
      bytes_out += t.nbytes;
      continue;
    }
    STRATA_REQUIRE(can_dequantize(t.type), "{}: tensor {} has type {}, which cannot be read", in, t.name,
                   type_name(t.type));
    if (type_traits(t.type).quantized) ++n_requant;
    const uint64_t ne0 = t.ne[0], rb_in = row_bytes(t.type, ne0), rb_out = row_bytes(target, ne0);
    bytes_out += rb_out * t.n_rows();
    w.add_tensor_producer(t.name, target, dims, [&pool, &t, target, ne0, rb_in, rb_out, i, n_tensors](std::span<uint8_t> dst) {
      pool.parallel_for(static_cast<int64_t>(t.n_rows()), 8, [&](int64_t r0, int64_t r1, int) {
        thread_local std::vector<float> row;
        row.resize(ne0);
        for (int64_t r = r0; r < r1; ++r) {
          dequantize_row(t.type, t.data + r * rb_in, row.data(), static_cast<int64_t>(ne0));
          quantize_row(target, row.data(), dst.data() + r * rb_out, static_cast<int64_t>(ne0));
        }
      });
      std::fprintf(stderr, "[%zu/%zu] %-36s %-6s -> %s\n", i + 1, n_tensors, t.name.c_str(),
                   std::string(type_name(t.type)).c_str(), std::string(type_name(target)).c_str());
    });
  }
  w.write(out);
  if (n_requant)
    std::fprintf(stderr, "note: %zu tensors were already quantized; they were dequantized and re-quantized\n",
                 n_requant);
  std::fprintf(stderr, "%s: %.2f MiB -> %s: %.2f MiB (%s)\n", in.c_str(), bytes_in / 1048576.0, out.c_str(),
               bytes_out / 1048576.0, std::string(quant_scheme_name(*scheme)).c_str());
  return 0;
}

const CommandRegistrar reg{
    "quantize", "Quantize a GGUF model (Q4_K_M, Q8_0, Q2_K, Q3_K_M, IQ4_XS, ...: see the type option)", [](CLI::App& sub) {
      auto in = std::make_shared<std::string>();
      auto out = std::make_shared<std::string>();
      auto type = std::make_shared<std::string>();
      auto threads = std::make_shared<int>(0);
      sub.add_option("input", *in, "input GGUF (any readable weight types)")->required();
      sub.add_option("output", *out, "output GGUF")->required();
      auto pure = std::make_shared<bool>(false);
      sub.add_option("type", *type,
                     quant_scheme_names() + " (Q8_0, Q6_K, Q5_K, Q4_K: one type everywhere; the others: llama.cpp's "
                     "file types and per-tensor rules)")
          ->required();
      sub.add_flag("--pure", *pure, "every quantizable tensor in the type's base type (llama-quantize --pure)");
      sub.add_option("-t,--threads", *threads, "threads (0 = all cores)");
      return [=] { return run_quantize(*in, *out, *type, *pure, *threads); };
    }};

}  // namespace
}  // namespace strata::cli
