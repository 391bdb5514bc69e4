// GGUF reader: mmap (or a caller's buffer) + a single validating parse. Nothing read from the file is
// trusted: counts are bounded by the bytes that remain before anything is allocated, sizes are
// overflow-checked, and every tensor's data must lie inside the file, aligned, without overlap.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "common/checked_math.h"
#include "gguf/parse.h"

namespace strata::gguf {

using detail::Cursor;
using detail::quoted;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Every Value costs sizeof(Value) (~80 bytes) in memory; this cap keeps a hostile file of small values
// (a huge u8 array) from turning into tens of GB of Values, while real files (a 256k-token vocabulary:
// ~1M values) stay far below it.
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;

// Fewest bytes one value of type `t` occupies in the file (so a claimed count can be bounded by the
// bytes left before a vector is reserved). 0 for an unknown type.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;   // u64 length
    case ValueType::ARRAY: return 12;   // u32 element type + u64 count
  }
  return 0;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

struct Parser {
  Cursor& c;
  uint64_t total_values = 0;  // every Value built, nested elements included

  void count_values(uint64_t n, uint64_t at) {
    // Each value consumes at least one byte of the file, so more values than bytes means a bug or a
    // lie; this also caps memory at a fixed multiple of the file size.
    auto t = checked_add(total_values, n);
    if (!t || *t > c.size())
      c.fail_at(at, "too many metadata values in total (over {}, the file size)", c.size());
    if (*t > kMaxMetadataValues)
      c.fail_at(at, "too many metadata values in total (over {}; the largest real vocabularies use ~1M)",
                kMaxMetadataValues);
    total_values = *t;
  }

  ValueType read_type(std::string_view what) {
    const uint64_t at = c.pos();
    const uint32_t t = c.read<uint32_t>(what);
    if (!known_value_type(t)) c.fail_at(at, "{}: unknown metadata value type {} (known: 0..12)", what, t);
    return static_cast<ValueType>(t);
  }

  Value read_value(ValueType t, int depth) {
    Value v;
    v.type = t;
    const uint64_t at = c.pos();
    switch (t) {
      case ValueType::UINT8: v.num.u = c.read<uint8_t>("u8 value"); break;
      case ValueType::INT8: v.num.i = c.read<int8_t>("i8 value"); break;
      case ValueType::UINT16: v.num.u = c.read<uint16_t>("u16 value"); break;
      case ValueType::INT16: v.num.i = c.read<int16_t>("i16 value"); break;
      case ValueType::UINT32: v.num.u = c.read<uint32_t>("u32 value"); break;
      case ValueType::INT32: v.num.i = c.read<int32_t>("i32 value"); break;
      case ValueType::UINT64: v.num.u = c.read<uint64_t>("u64 value"); break;
      case ValueType::INT64: v.num.i = c.read<int64_t>("i64 value"); break;
      case ValueType::FLOAT32: v.num.f = c.read<float>("f32 value"); break;
      case ValueType::FLOAT64: v.num.f = c.read<double>("f64 value"); break;
      case ValueType::BOOL: {
        const uint8_t b = c.read<uint8_t>("bool value");
        if (b > 1) c.fail_at(at, "bool value must be 0 or 1, found {}", b);
        v.num.b = b != 0;
        break;
      }
      case ValueType::STRING: v.str = c.read_string("string value"); break;
      case ValueType::ARRAY: {
        if (depth >= kMaxArrayDepth)
          c.fail_at(at, "arrays nested deeper than {} levels", kMaxArrayDepth);
        v.elem_type = read_type("array element type");
        const uint64_t count_at = c.pos();
        const uint64_t n = c.read<uint64_t>("array length");
        const uint64_t min = min_encoded_size(v.elem_type);
        if (n > c.left() / min)
          c.fail_at(count_at, "array of {} {} elements cannot fit in the {} bytes that remain", n,
                    value_type_name(v.elem_type), c.left());
        count_values(n, count_at);
        v.arr.reserve(static_cast<size_t>(n));
        for (uint64_t i = 0; i < n; ++i) v.arr.push_back(read_value(v.elem_type, depth + 1));
        break;
      }
    }
    return v;
  }
};

void check_alignment(const KeyValue& kv, const Cursor& c) {
  if (kv.value.type != ValueType::UINT32)
    c.fail_at(kv.offset, "general.alignment must be u32, found {}", value_type_name(kv.value.type));
  const uint64_t a = kv.value.num.u;
  if (a == 0) c.fail_at(kv.offset, "general.alignment is 0");
  if ((a & (a - 1)) != 0) c.fail_at(kv.offset, "general.alignment {} is not a power of two", a);
}

}  // namespace

struct File::Impl {
  std::string path;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void* mapping = nullptr;  // owned mmap (File::open); nullptr for from_memory
  size_t mapping_size = 0;
  std::vector<uint8_t> owned;  // from_bytes
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<KeyValue> metadata;
  std::unordered_map<std::string_view, size_t> key_index;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string_view, size_t> tensor_index;

  ~Impl() {
    if (mapping) munmap(mapping, mapping_size);
  }

  void parse();
  void parse_tensor_infos(Cursor& c, uint64_t n_tensors);
  void place_tensor_data(Cursor& c, const std::vector<uint64_t>& info_offsets);
};

void File::Impl::parse() {
  Cursor c(data, size, path);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    char m[4];
    std::memcpy(m, &magic, 4);
    c.fail_at(0, "bad magic {}: not a GGUF file (expected \"GGUF\")", quoted(std::string_view(m, 4)));
  }
  version = c.read<uint32_t>("version");
  if (version == 1) c.fail_at(4, "GGUF version 1 is not supported (only versions 2 and 3)");
  if (version != 2 && version != 3) {
    if (version == 0x02000000u || version == 0x03000000u)
      c.fail_at(4, "big-endian GGUF is not supported");
    c.fail_at(4, "unsupported GGUF version {} (only versions 2 and 3)", version);
  }

  const uint64_t n_tensors_at = c.pos();
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv_at = c.pos();
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 13 bytes (key length, value type, 1-byte value); a tensor info
  // at least 32 (name length, n_dims, one dim, type, offset).
  if (n_kv > c.left() / 13)
    c.fail_at(n_kv_at, "metadata count {} cannot fit in the {} bytes that remain", n_kv, c.left());
  if (n_tensors > c.left() / 32)
    c.fail_at(n_tensors_at, "tensor count {} cannot fit in the {} bytes that remain", n_tensors, c.left());

  Parser p{c};
  p.count_values(n_kv, n_kv_at);
  metadata.reserve(static_cast<size_t>(n_kv));
  key_index.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    kv.offset = c.pos();
    kv.key = c.read_string("metadata key");
    if (kv.key.empty()) c.fail_at(kv.offset, "metadata key {} is empty", i);
    const ValueType t = p.read_type(fmt::format("value type of key {}", quoted(kv.key)));
    kv.value = p.read_value(t, 0);
    metadata.push_back(std::move(kv));
  }
  for (size_t i = 0; i < metadata.size(); ++i) {
    auto [it, fresh] = key_index.emplace(metadata[i].key, i);
    if (!fresh)
      c.fail_at(metadata[i].offset, "duplicate metadata key {} (first at offset {})", quoted(metadata[i].key),
                metadata[it->second].offset);
  }
  if (auto it = key_index.find("general.alignment"); it != key_index.end()) {
    check_alignment(metadata[it->second], c);
    alignment = metadata[it->second].value.num.u;
  }

  parse_tensor_infos(c, n_tensors);
}

void File::Impl::parse_tensor_infos(Cursor& c, uint64_t n_tensors) {
  std::vector<uint64_t> info_offsets;
  info_offsets.reserve(static_cast<size_t>(n_tensors));
  tensors.reserve(static_cast<size_t>(n_tensors));
  tensor_index.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    TensorInfo t{};
    t.name = c.read_string("tensor name");
    if (t.name.empty()) c.fail_at(at, "tensor {} has an empty name", i);
    const std::string q = quoted(t.name);
    const uint64_t dims_at = c.pos();
    t.n_dims = c.read<uint32_t>("tensor n_dims");
    if (t.n_dims < 1 || t.n_dims > kMaxDims)
      c.fail_at(dims_at, "tensor {}: n_dims {} out of range 1..{}", q, t.n_dims, kMaxDims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < kMaxDims; ++d) t.ne[d] = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = c.pos();
      t.ne[d] = c.read<uint64_t>("tensor dimension");
      if (t.ne[d] == 0) c.fail_at(ne_at, "tensor {}: dimension {} is zero", q, d);
      auto n = checked_mul(n_elements, t.ne[d]);
      if (!n || *n > static_cast<uint64_t>(INT64_MAX))
        c.fail_at(ne_at, "tensor {}: element count overflows (dimension {} is {})", q, d, t.ne[d]);
      n_elements = *n;
    }
    const uint64_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>("tensor type");
    const TypeTraits* tt = file_type_traits(type_id);
    if (!tt) c.fail_at(type_at, "tensor {}: unknown ggml type id {}", q, type_id);
    t.type = tt->type;
    if (t.ne[0] % tt->block_size != 0)
      c.fail_at(dims_at, "tensor {}: row length {} (element count {}) is not a multiple of the {} block size {}",
                q, t.ne[0], n_elements, tt->name, tt->block_size);
    // ne[0] / block_size * type_size * rows: each step checked.
    auto row = checked_mul(t.ne[0] / tt->block_size, tt->type_size);
    auto nbytes = row ? checked_mul(*row, n_elements / t.ne[0]) : std::nullopt;
    if (!nbytes) c.fail_at(dims_at, "tensor {}: byte size overflows", q);
    t.nbytes = *nbytes;
    t.offset = c.read<uint64_t>("tensor data offset");

    info_offsets.push_back(at);
    tensors.push_back(std::move(t));
  }
  // Names are indexed once the vector no longer moves (the index holds views into it).
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto [it, fresh] = tensor_index.emplace(tensors[i].name, i);
    if (!fresh)
      c.fail_at(info_offsets[i], "duplicate tensor name {} (first at offset {})", quoted(tensors[i].name),
                info_offsets[it->second]);
  }
  place_tensor_data(c, info_offsets);
}

void File::Impl::place_tensor_data(Cursor& c, const std::vector<uint64_t>& info_offsets) {
  // The data section starts at the first multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = c.pos();
  auto padded = checked_add(end_of_infos, alignment - 1);  // alignment >= 1 (validated)
  if (!padded) c.fail_at(end_of_infos, "data section offset overflows");
  data_offset = *padded / alignment * alignment;
  if (tensors.empty()) {  // a vocabulary-only file may end right after its metadata, unpadded
    data_offset = std::min(data_offset, size);
    return;
  }
  if (data_offset > size)
    c.fail_at(end_of_infos, "data section (offset {}) starts past the end of the file ({} bytes)", data_offset,
              size);

  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorInfo& t = tensors[i];
    const std::string q = quoted(t.name);
    if (t.offset % alignment != 0)
      c.fail_at(info_offsets[i], "tensor {}: data offset {} is not a multiple of the alignment {}", q, t.offset,
                alignment);
    auto begin = checked_add(data_offset, t.offset);
    auto end = begin ? checked_add(*begin, t.nbytes) : std::nullopt;
    if (!end || *end > size)
      c.fail_at(info_offsets[i], "tensor {}: data [{} + {}, {} bytes) runs past the end of the file ({} bytes)", q,
                data_offset, t.offset, t.nbytes, size);
    t.data = data + *begin;
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors[order[k - 1]];
    const TensorInfo& cur = tensors[order[k]];
    if (prev.offset + prev.nbytes > cur.offset)  // no overflow: both ends were checked above
      c.fail_at(info_offsets[order[k]], "tensor {}: data at offset {} overlaps tensor {} (offset {}, {} bytes)",
                quoted(cur.name), cur.offset, quoted(prev.name), prev.offset, prev.nbytes);
  }
}

// ---- File ----

File::File() : impl_(std::make_unique<Impl>()) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path) {
  File f;
  f.impl_->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw FormatError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw FormatError(fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(fmt::format("{}: not a regular file", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw FormatError(fmt::format("{}: offset 0: empty file (0 bytes), expected a GGUF header", path));
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw FormatError(fmt::format("{}: cannot mmap {} bytes: {}", path, size, std::strerror(e)));
  f.impl_->mapping = m;
  f.impl_->mapping_size = size;
  f.impl_->data = static_cast<const uint8_t*>(m);
  f.impl_->size = size;
  f.impl_->parse();
  return f;
}

File File::from_memory(const uint8_t* data, size_t size, std::string name) {
  File f;
  f.impl_->path = std::move(name);
  f.impl_->data = data;
  f.impl_->size = size;
  f.impl_->parse();
  return f;
}

File File::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  File f;
  f.impl_->path = std::move(name);
  f.impl_->owned = std::move(bytes);
  f.impl_->data = f.impl_->owned.data();
  f.impl_->size = f.impl_->owned.size();
  f.impl_->parse();
  return f;
}

const std::string& File::path() const { return impl_->path; }
uint32_t File::version() const { return impl_->version; }
uint64_t File::alignment() const { return impl_->alignment; }
uint64_t File::file_size() const { return impl_->size; }
uint64_t File::data_offset() const { return impl_->data_offset; }
const std::vector<KeyValue>& File::metadata() const { return impl_->metadata; }
const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }

const Value* File::find(std::string_view key) const {
  auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw FormatError(fmt::format("{}: missing tensor {}", impl_->path, quoted(name)));
  return *t;
}

}  // namespace strata::gguf
