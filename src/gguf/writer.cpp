// GGUF v3 writer: header, metadata, tensor infos, padding, tensor data (each padded to the alignment).
#include "gguf/writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "common/checked_math.h"
#include "gguf/parse.h"

namespace strata::gguf {

namespace {

using detail::value_type_of;

constexpr uint64_t kDefaultAlignment = 32;

uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }


// A Value built by hand must be something the reader accepts back.
void check_value(const std::string& key, const Value& v, int depth) {
  STRATA_REQUIRE(static_cast<uint32_t>(v.type) <= static_cast<uint32_t>(ValueType::FLOAT64),
                 "gguf writer: key '{}': unknown value type {}", key, static_cast<uint32_t>(v.type));
  if (v.type != ValueType::ARRAY) return;
  STRATA_REQUIRE(static_cast<uint32_t>(v.elem_type) <= static_cast<uint32_t>(ValueType::FLOAT64),
                 "gguf writer: key '{}': unknown array element type {}", key, static_cast<uint32_t>(v.elem_type));
  STRATA_REQUIRE(depth < kMaxArrayDepth, "gguf writer: key '{}': arrays nested deeper than {}", key,
                 kMaxArrayDepth);
  for (const Value& e : v.arr) {
    STRATA_REQUIRE(e.type == v.elem_type, "gguf writer: key '{}': array of {} holds a {}", key,
                   value_type_name(v.elem_type), value_type_name(e.type));
    check_value(key, e, depth + 1);
  }
}

// Serialises into a byte sink, counting what it wrote.
struct Out {
  const std::function<void(const void*, size_t)>& sink;
  uint64_t pos = 0;
  void bytes(const void* p, size_t n) {
    if (n) sink(p, n);
    pos += n;
  }
  template <typename T> void put(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void zeros(uint64_t n) {
    static const uint8_t z[256] = {};
    while (n) {
      const size_t k = n < sizeof z ? static_cast<size_t>(n) : sizeof z;
      bytes(z, k);
      n -= k;
    }
  }
  void value(const Value& v) {
    switch (v.type) {
      case ValueType::UINT8: put<uint8_t>(static_cast<uint8_t>(v.num.u)); break;
      case ValueType::INT8: put<int8_t>(static_cast<int8_t>(v.num.i)); break;
      case ValueType::UINT16: put<uint16_t>(static_cast<uint16_t>(v.num.u)); break;
      case ValueType::INT16: put<int16_t>(static_cast<int16_t>(v.num.i)); break;
      case ValueType::UINT32: put<uint32_t>(static_cast<uint32_t>(v.num.u)); break;
      case ValueType::INT32: put<int32_t>(static_cast<int32_t>(v.num.i)); break;
      case ValueType::UINT64: put<uint64_t>(v.num.u); break;
      case ValueType::INT64: put<int64_t>(v.num.i); break;
      case ValueType::FLOAT32: put<float>(static_cast<float>(v.num.f)); break;
      case ValueType::FLOAT64: put<double>(v.num.f); break;
      case ValueType::BOOL: put<uint8_t>(v.num.b ? 1 : 0); break;
      case ValueType::STRING: str(v.str); break;
      case ValueType::ARRAY:
        put<uint32_t>(static_cast<uint32_t>(v.elem_type));
        put<uint64_t>(v.arr.size());
        for (const Value& e : v.arr) value(e);
        break;
    }
  }
};

}  // namespace

template <typename T>
Value make_value(T x) {
  Value v;
  v.type = value_type_of<T>();
  if constexpr (std::is_same_v<T, std::string>) v.str = std::move(x);
  else if constexpr (std::is_same_v<T, bool>) v.num.b = x;
  else if constexpr (std::is_floating_point_v<T>) v.num.f = x;
  else if constexpr (std::is_signed_v<T>) v.num.i = x;
  else v.num.u = x;
  return v;
}

template <typename T>
Value make_array(const std::vector<T>& xs) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = value_type_of<T>();
  v.arr.reserve(xs.size());
  for (const T& x : xs) v.arr.push_back(make_value<T>(x));
  return v;
}

Value make_array(ValueType elem, std::vector<Value> elems) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = elem;
  v.arr = std::move(elems);
  return v;
}

#define STRATA_GGUF_INSTANTIATE(T)      \
  template Value make_value<T>(T);      \
  template Value make_array<T>(const std::vector<T>&);
STRATA_GGUF_INSTANTIATE(uint8_t)
STRATA_GGUF_INSTANTIATE(int8_t)
STRATA_GGUF_INSTANTIATE(uint16_t)
STRATA_GGUF_INSTANTIATE(int16_t)
STRATA_GGUF_INSTANTIATE(uint32_t)
STRATA_GGUF_INSTANTIATE(int32_t)
STRATA_GGUF_INSTANTIATE(uint64_t)
STRATA_GGUF_INSTANTIATE(int64_t)
STRATA_GGUF_INSTANTIATE(float)
STRATA_GGUF_INSTANTIATE(double)
STRATA_GGUF_INSTANTIATE(bool)
STRATA_GGUF_INSTANTIATE(std::string)
#undef STRATA_GGUF_INSTANTIATE

Writer Writer::from_file(const File& f) {
  Writer w;
  for (const KeyValue& kv : f.metadata()) w.set_value(kv.key, kv.value);
  for (const TensorInfo& t : f.tensors())
    w.add_tensor_view(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
  return w;
}

void Writer::set_value(const std::string& key, Value v) {
  STRATA_REQUIRE(!key.empty(), "gguf writer: empty metadata key");
  check_value(key, v, 0);
  if (key == "general.alignment") {
    STRATA_REQUIRE(v.type == ValueType::UINT32, "gguf writer: general.alignment must be u32, not {}",
                   value_type_name(v.type));
    STRATA_REQUIRE(v.num.u != 0 && (v.num.u & (v.num.u - 1)) == 0,
                   "gguf writer: general.alignment {} is not a power of two", v.num.u);
  }
  if (auto it = key_pos_.find(key); it != key_pos_.end()) {
    kv_[it->second].value = std::move(v);
    return;
  }
  key_pos_.emplace(key, kv_.size());
  kv_.push_back(KeyValue{key, std::move(v), 0});
}

bool Writer::remove(const std::string& key) {
  auto it = key_pos_.find(key);
  if (it == key_pos_.end()) return false;
  kv_.erase(kv_.begin() + static_cast<ptrdiff_t>(it->second));
  key_pos_.clear();
  for (size_t i = 0; i < kv_.size(); ++i) key_pos_.emplace(kv_[i].key, i);
  return true;
}

void Writer::set_alignment(uint32_t a) { set<uint32_t>("general.alignment", a); }

uint64_t Writer::alignment() const {
  auto it = key_pos_.find("general.alignment");
  return it == key_pos_.end() ? kDefaultAlignment : kv_[it->second].value.num.u;
}

void Writer::check_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                          uint64_t nbytes) const {
  STRATA_REQUIRE(!name.empty(), "gguf writer: empty tensor name");
  STRATA_REQUIRE(!tensor_names_.count(name), "gguf writer: duplicate tensor '{}'", name);
  STRATA_REQUIRE(file_type_traits(static_cast<uint32_t>(type)) != nullptr, "gguf writer: tensor '{}': unknown type {}",
                 name, static_cast<uint32_t>(type));
  STRATA_REQUIRE(dims.size() >= 1 && dims.size() <= 4, "gguf writer: tensor '{}': {} dims (1..4)", name,
                 dims.size());
  std::optional<uint64_t> n = 1;
  for (uint64_t d : dims) {
    STRATA_REQUIRE(d != 0, "gguf writer: tensor '{}': zero dimension", name);
    n = n ? checked_mul(*n, d) : std::nullopt;
  }
  STRATA_REQUIRE(n && *n <= static_cast<uint64_t>(INT64_MAX), "gguf writer: tensor '{}': too many elements", name);
  const auto& tt = type_traits(type);
  STRATA_REQUIRE(dims[0] % tt.block_size == 0,
                 "gguf writer: tensor '{}': row length {} is not a multiple of the {} block size {}", name, dims[0],
                 tt.name, tt.block_size);
  auto expect = checked_mul(dims[0] / tt.block_size * tt.type_size, *n / dims[0]);
  STRATA_REQUIRE(expect && *expect == nbytes, "gguf writer: tensor '{}': {} bytes given, {} {} x{} needs {}", name,
                 nbytes, tt.name, dims[0], *n / dims[0], expect ? *expect : 0);
}

void Writer::add_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                        std::span<const uint8_t> bytes) {
  check_tensor(name, type, dims, bytes.size());
  Tensor t{name, type, dims, nullptr, bytes.size(), std::vector<uint8_t>(bytes.begin(), bytes.end()), {}};
  tensors_.push_back(std::move(t));
  tensor_names_.insert(name);
}

void Writer::add_tensor_view(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                             const uint8_t* data, uint64_t nbytes) {
  check_tensor(name, type, dims, nbytes);
  tensors_.push_back(Tensor{name, type, dims, data, nbytes, {}, {}});
  tensor_names_.insert(name);
}

void Writer::add_tensor_producer(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                                 TensorProducer produce) {
  STRATA_REQUIRE(produce != nullptr, "gguf writer: tensor '{}': no producer", name);
  // Validate the shape first (with a byte count that passes), then record the real size.
  STRATA_REQUIRE(file_type_traits(static_cast<uint32_t>(type)) != nullptr, "gguf writer: tensor '{}': unknown type {}",
                 name, static_cast<uint32_t>(type));
  check_tensor(name, type, dims, expected_bytes(type, dims));
  tensors_.push_back(Tensor{name, type, dims, nullptr, expected_bytes(type, dims), {}, std::move(produce)});
  tensor_names_.insert(name);
}

// Bytes of a tensor of `dims` (validated by check_tensor); 0 when the shape is invalid.
uint64_t Writer::expected_bytes(GgmlType type, const std::vector<uint64_t>& dims) {
  if (dims.empty() || dims.size() > 4) return 0;
  const auto& tt = type_traits(type);
  std::optional<uint64_t> rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows = rows ? checked_mul(*rows, dims[i]) : std::nullopt;
  if (!rows || dims[0] % tt.block_size) return 0;
  return checked_mul(dims[0] / tt.block_size * tt.type_size, *rows).value_or(0);
}

void Writer::write_to(const std::function<void(const void*, size_t)>& sink) const {
  const uint64_t align = alignment();
  Out o{sink};
  o.put<uint32_t>(0x46554747);  // "GGUF"
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const KeyValue& kv : kv_) {
    o.str(kv.key);
    o.put<uint32_t>(static_cast<uint32_t>(kv.value.type));
    o.value(kv.value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) o.put<uint64_t>(d);
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += pad_to(t.nbytes, align);
  }
  // A file without tensors ends with its metadata (as gguf-py writes vocabulary files).
  if (tensors_.empty()) return;
  o.zeros(pad_to(o.pos, align) - o.pos);
  std::vector<uint8_t> produced;
  for (const Tensor& t : tensors_) {
    if (t.produce) {
      produced.assign(t.nbytes, 0);
      t.produce(std::span<uint8_t>(produced.data(), produced.size()));
      o.bytes(produced.data(), t.nbytes);
    } else {
      o.bytes(t.owned.empty() ? t.data : t.owned.data(), t.nbytes);
    }
    o.zeros(pad_to(t.nbytes, align) - t.nbytes);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  write_to([&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

void Writer::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::FILE* fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) fail("cannot create {}: {}", tmp, std::strerror(errno));
  bool ok = true;
  write_to([&](const void* p, size_t n) { ok = ok && std::fwrite(p, 1, n, fp) == n; });
  const int e = errno;
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("cannot write {}: {}", tmp, std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e2 = errno;
    std::remove(tmp.c_str());
    fail("cannot rename {} to {}: {}", tmp, path, std::strerror(e2));
  }
}

}  // namespace strata::gguf
