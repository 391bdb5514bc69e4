// libFuzzer target for the model loaders (qwen3moe, qwen3next): hyper-parameter and weight validation,
// then a short forward pass of whatever loads (scripts/fuzz: ASan+UBSan).
// Structure-aware: the input is a list of edits applied to a real fixture model (the first byte picks
// qwen3moe or qwen3next): drop, retype, reshape or rename a tensor; set a metadata key to another number
// or type; remove a key. The edited file is rebuilt in memory with gguf::Writer (so it is always a
// well-formed GGUF and the fuzzer spends its time on the model code, not on the reader, which
// fuzz_gguf covers). Contract: loading either succeeds or throws strata::Error; a loaded model
// evaluates two tokens or throws strata::Error; nothing else (no crash, no other exception, no
// sanitizer report).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/model.h"
#include "quant/types.h"

using namespace strata;

namespace {

struct Base {
  gguf::File file;
};

const std::vector<std::unique_ptr<Base>>& bases() {
  static const std::vector<std::unique_ptr<Base>> b = [] {
    std::vector<std::unique_ptr<Base>> v;
    const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/models/";
    for (const char* name : {"tiny-qwen3moe-A-Q8_0.gguf", "tiny-qwen3next-N-Q4_K_M.gguf"})
      v.push_back(std::make_unique<Base>(Base{gguf::File::open(dir + name)}));
    return v;
  }();
  return b;
}

// Reads the input a byte at a time; 0 once it is used up.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() { return n ? (--n, *p++) : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(u8()) << (8 * i);
    return v;
  }
};

struct EditedTensor {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> dims;
  const uint8_t* data;  // the original bytes, or null: zeros of the new size
  uint64_t nbytes;
};

constexpr uint64_t kMaxTensorBytes = 16ull << 20;  // an edit that would make a larger tensor is skipped

// Bytes of a tensor of `type` and `dims`, or 0 when it is not a valid shape for the type.
uint64_t tensor_bytes(GgmlType type, const std::vector<uint64_t>& dims) {
  const TypeTraits* tt = file_type_traits(static_cast<uint32_t>(type));
  if (tt == nullptr || dims.empty() || dims[0] % uint64_t(tt->block_size) != 0) return 0;
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] == 0 || rows > kMaxTensorBytes / dims[i]) return 0;
    rows *= dims[i];
  }
  const uint64_t row = dims[0] / uint64_t(tt->block_size) * uint64_t(tt->type_size);
  if (row == 0 || rows > kMaxTensorBytes / row) return 0;
  return row * rows;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const gguf::File& src = bases()[in.u8() % bases().size()]->file;

  std::vector<gguf::KeyValue> meta;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") meta.push_back(kv);
  std::vector<EditedTensor> tensors;
  for (const auto& t : src.tensors())
    tensors.push_back({t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes});

  for (int edits = 0; in.n > 0 && edits < 16; ++edits) {
    const uint8_t op = in.u8() % 6;
    if (op <= 2 && tensors.empty()) continue;
    if (op >= 3 && meta.empty()) continue;
    if (op == 0) {  // drop a tensor
      tensors.erase(tensors.begin() + in.u8() % tensors.size());
    } else if (op == 1) {  // another type (same dims), zero bytes
      EditedTensor& t = tensors[in.u8() % tensors.size()];
      const auto type = static_cast<GgmlType>(in.u8() % 40);
      const uint64_t nb = tensor_bytes(type, t.dims);
      if (nb == 0) continue;
      t.type = type, t.data = nullptr, t.nbytes = nb;
    } else if (op == 2) {  // another shape: one dimension changed, or one added / removed
      EditedTensor& t = tensors[in.u8() % tensors.size()];
      std::vector<uint64_t> dims = t.dims;
      const uint8_t how = in.u8() % 4;
      if (how == 0 && dims.size() < 4) dims.push_back(1 + in.u8() % 8);
      else if (how == 1 && dims.size() > 1) dims.pop_back();
      else dims[in.u8() % dims.size()] = 1 + (in.u32() % 4096);
      const uint64_t nb = tensor_bytes(t.type, dims);
      if (nb == 0) continue;
      t.dims = dims, t.data = nullptr, t.nbytes = nb;
    } else if (op == 3) {  // a key's value: another number, the same number as another type, or a string
      gguf::KeyValue& kv = meta[in.u8() % meta.size()];
      const uint8_t how = in.u8() % 4;
      const uint32_t v = in.u32();
      if (how == 0) kv.value = gguf::make_value<uint32_t>(v % 70000);
      else if (how == 1) kv.value = gguf::make_value<int32_t>(int32_t(v));
      else if (how == 2) {
        float f;
        std::memcpy(&f, &v, 4);
        kv.value = gguf::make_value<float>(f);
      } else kv.value = gguf::make_value<std::string>(std::string("x"));
    } else if (op == 4) {  // remove a key
      meta.erase(meta.begin() + in.u8() % meta.size());
    } else {  // rename a tensor: one character of its name
      EditedTensor& t = tensors[in.u8() % tensors.size()];
      if (t.name.empty()) continue;
      t.name[in.u8() % t.name.size()] = char('0' + in.u8() % 75);
    }
  }

  gguf::Writer w;
  for (const auto& kv : meta) w.set_value(kv.key, kv.value);
  std::vector<std::vector<uint8_t>> zeros;
  zeros.reserve(tensors.size());
  for (const auto& t : tensors) {
    bool dup = false;  // the writer refuses a repeated name: keep the first
    for (const auto& o : tensors) {
      if (&o == &t) break;
      dup = dup || o.name == t.name;
    }
    if (dup) continue;
    if (t.data) {
      w.add_tensor_view(t.name, t.type, t.dims, t.data, t.nbytes);
    } else {
      zeros.emplace_back(t.nbytes, uint8_t(0));
      w.add_tensor_view(t.name, t.type, t.dims, zeros.back().data(), t.nbytes);
    }
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = w.to_bytes();
  } catch (const Error&) {
    return 0;  // an edit the writer itself refuses (e.g. an empty name)
  }

  std::shared_ptr<const Model> model;
  try {
    model = load_model(gguf::File::from_bytes(std::move(bytes), "fuzz-model"));
  } catch (const Error&) {
    return 0;  // refused with a clear error: the contract
  }
  try {
    EngineOptions o;
    o.n_ctx = 8;
    o.n_batch = 2;
    o.n_threads = 1;
    Engine eng(model, o);
    auto seq = eng.new_sequence();
    std::vector<float> logits(size_t(eng.n_vocab()));
    const int32_t toks[2] = {1, 2};
    eng.prefill(*seq, toks, logits.data());
  } catch (const Error&) {
  }
  return 0;
}
