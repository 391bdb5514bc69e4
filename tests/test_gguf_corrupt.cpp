// Corrupt and hostile GGUF files: each must be refused with gguf::FormatError whose message names the
// file, the byte offset and what is wrong. Files are built byte by byte (Raw) so any field can lie.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::gguf;

namespace {

constexpr uint64_t kMinus1 = ~uint64_t{0};
constexpr uint64_t k2pow63 = uint64_t{1} << 63;

struct Raw {
  std::vector<uint8_t> b;
  template <typename T> Raw& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Raw& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  Raw& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t a = 32) {
    while (b.size() % a) b.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
  size_t size() const { return b.size(); }
};

// Parses `bytes` and returns the FormatError message; fails the test when nothing is thrown.
std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    File::from_memory(bytes.data(), bytes.size(), "bad.gguf");
  } catch (const FormatError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a FormatError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "accepted a corrupt file";
  return "";
}

#define EXPECT_REJECTED(raw, offset, what)                                                      \
  do {                                                                                          \
    const std::string m_ = error_of((raw).b);                                                   \
    EXPECT_NE(m_.find("bad.gguf: offset " + std::to_string(offset) + ": "), std::string::npos)  \
        << "message lacks file/offset " << (offset) << ": " << m_;                             \
    EXPECT_NE(m_.find(what), std::string::npos) << "message lacks '" << (what) << "': " << m_;  \
  } while (0)

// A valid file: 2 keys, 2 tensors (f32 [8], q8_0 [32 x 2]) with data.
Raw valid() {
  Raw r;
  r.header(2, 2).kv_str("general.architecture", "test").kv_u32("test.block_count", 1);
  r.tensor("a", {8}, 0, 0).tensor("b", {32, 2}, 8, 32);
  r.pad().zeros(32 + 68).pad();
  return r;
}

}  // namespace

TEST(GgufCorrupt, ValidBaseFileParses) {
  const Raw r = valid();
  File f = File::from_memory(r.b.data(), r.b.size(), "ok.gguf");
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensor("b").nbytes, 68u);
}

TEST(GgufCorrupt, TruncatedAtEveryByte) {
  // Every proper prefix of a valid file is refused with a truncation or bounds message that names
  // an offset inside the prefix; none crash (ASan in the fuzz build checks the reads).
  Raw r;
  r.header(1, 3).kv_str("general.architecture", "test").str("arr").u32(9).u32(4).u64(2).u32(1).u32(2);
  r.str("b").u32(7).u8(1);
  r.tensor("t", {8}, 0, 0).pad().zeros(32);
  {
    File ok = File::from_memory(r.b.data(), r.b.size(), "ok");
    EXPECT_EQ(ok.get_array<uint32_t>("arr"), (std::vector<uint32_t>{1, 2}));
  }
  for (size_t n = 0; n < r.size(); ++n) {
    std::vector<uint8_t> prefix(r.b.begin(), r.b.begin() + n);
    const std::string m = error_of(prefix);
    EXPECT_NE(m.find("bad.gguf: offset "), std::string::npos) << n << ": " << m;
    const bool named = m.find("truncated file") != std::string::npos ||
                       m.find("past the end") != std::string::npos ||
                       m.find("cannot fit") != std::string::npos;
    EXPECT_TRUE(named) << "prefix " << n << ": " << m;
  }
}

TEST(GgufCorrupt, TruncatedInEachSection) {
  const Raw r = valid();
  auto cut = [&](size_t n) { Raw p; p.b.assign(r.b.begin(), r.b.begin() + n); return p; };
  EXPECT_REJECTED(cut(0), 0, "truncated file: magic needs 4 bytes");
  EXPECT_REJECTED(cut(6), 4, "truncated file: version");
  EXPECT_REJECTED(cut(12), 8, "truncated file: tensor count");
  EXPECT_REJECTED(cut(20), 16, "truncated file: metadata count");
  // Cut inside the metadata: before the counts themselves can be believed, they are checked against
  // the bytes that remain (2 keys need >= 26 bytes, 2 tensor infos >= 64).
  EXPECT_REJECTED(cut(30), 16, "metadata count 2 cannot fit in the 6 bytes that remain");
  EXPECT_REJECTED(cut(54), 8, "tensor count 2 cannot fit in the 30 bytes that remain");
  Raw kv;  // one key with a 100-byte string value, no tensors
  kv.header(0, 1).kv_str("general.architecture", std::string(100, 'x'));
  auto cut_kv = [&](size_t n) { Raw p; p.b.assign(kv.b.begin(), kv.b.begin() + n); return p; };
  EXPECT_REJECTED(cut_kv(40), 24, "metadata key: string length 20 runs past the end of the file (8 bytes remain)");
  EXPECT_REJECTED(cut_kv(54), 52, "truncated file: value type of key 'general.architecture' needs 4 bytes");
  EXPECT_REJECTED(cut_kv(60), 56, "truncated file: string value needs 8 bytes but only 4 remain");
  EXPECT_REJECTED(cut_kv(100), 56, "string value: string length 100 runs past the end of the file (36 bytes remain)");
  const size_t tensors_at = 24 + (8 + 20 + 4 + 8 + 4) + (8 + 16 + 4 + 4);
  EXPECT_REJECTED(cut(tensors_at + 3), tensors_at, "truncated file: tensor name");
  EXPECT_REJECTED(cut(tensors_at + 9 + 2), tensors_at + 9, "truncated file: tensor n_dims");
  EXPECT_REJECTED(cut(tensors_at + 13 + 4), tensors_at + 13, "truncated file: tensor dimension");
  EXPECT_REJECTED(cut(tensors_at + 21), tensors_at + 21, "truncated file: tensor type");
  EXPECT_REJECTED(cut(tensors_at + 25 + 7), tensors_at + 25, "truncated file: tensor data offset");
  // Infos complete, data section missing / cut inside the second tensor's data.
  const size_t infos_end = tensors_at + 33 + (8 + 1 + 4 + 16 + 4 + 8);
  EXPECT_REJECTED(cut(infos_end + 3), infos_end, "data section (offset 192) starts past the end");
  EXPECT_REJECTED(cut(r.size() - 40), tensors_at + 33, "tensor 'b': data [192 + 32, 68 bytes) runs past the end");
}

TEST(GgufCorrupt, MagicAndVersion) {
  Raw magic;
  magic.u32(0x58554747).u32(3).u64(0).u64(0);  // "GGUX"
  EXPECT_REJECTED(magic, 0, "bad magic 'GGUX': not a GGUF file");
  Raw v1;
  v1.header(0, 0, 1);
  EXPECT_REJECTED(v1, 4, "GGUF version 1 is not supported");
  Raw v4;
  v4.header(0, 0, 4);
  EXPECT_REJECTED(v4, 4, "unsupported GGUF version 4");
  Raw be;
  be.header(0, 0, 0x03000000);
  EXPECT_REJECTED(be, 4, "big-endian GGUF is not supported");
  Raw v2;  // version 2 is read like 3
  v2.header(0, 1, 2).kv_u32("k", 5);
  File f = File::from_memory(v2.b.data(), v2.b.size(), "v2");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get<uint32_t>("k"), 5u);
}

TEST(GgufCorrupt, HugeCounts) {
  Raw t1;
  t1.header(kMinus1, 0);
  EXPECT_REJECTED(t1, 8, "tensor count 18446744073709551615 cannot fit in the 0 bytes that remain");
  Raw t63;
  t63.header(k2pow63, 0).zeros(64);
  EXPECT_REJECTED(t63, 8, "tensor count 9223372036854775808 cannot fit");
  Raw k1;
  k1.header(0, kMinus1).kv_u32("a", 1);
  EXPECT_REJECTED(k1, 16, "metadata count 18446744073709551615 cannot fit");
  Raw k63;
  k63.header(0, k2pow63).kv_u32("a", 1);
  EXPECT_REJECTED(k63, 16, "metadata count 9223372036854775808 cannot fit");
  Raw more;  // says 3 keys, holds 2
  more.header(0, 3).kv_u32("a", 1).kv_u32("b", 2).zeros(16);
  EXPECT_REJECTED(more, 24 + 2 * 17, "metadata key 2 is empty");
}

TEST(GgufCorrupt, StringsPastEof) {
  Raw key;
  key.header(0, 1).u64(1000).zeros(20);
  EXPECT_REJECTED(key, 24, "metadata key: string length 1000 runs past the end of the file (20 bytes remain)");
  Raw val;
  val.header(0, 1).str("k").u32(8).u64(kMinus1).zeros(8);
  EXPECT_REJECTED(val, 37, "string value: string length 18446744073709551615 runs past the end");
  Raw name;
  name.header(1, 0).u64(k2pow63).zeros(40);
  EXPECT_REJECTED(name, 24, "tensor name: string length 9223372036854775808 runs past the end");
  Raw elem;  // array of strings, the second string's length lies
  elem.header(0, 1).str("k").u32(9).u32(8).u64(2).str("ok").u64(500).zeros(10);
  EXPECT_REJECTED(elem, 59, "string length 500 runs past the end");
}

TEST(GgufCorrupt, BadValues) {
  Raw empty_key;
  empty_key.header(0, 1).str("").u32(4).u32(1);
  EXPECT_REJECTED(empty_key, 24, "metadata key 0 is empty");
  Raw type;
  type.header(0, 1).str("k").u32(13).u32(1);
  EXPECT_REJECTED(type, 33, "value type of key 'k': unknown metadata value type 13");
  Raw elem_type;
  elem_type.header(0, 1).str("k").u32(9).u32(0xffffffff).u64(0);
  EXPECT_REJECTED(elem_type, 37, "array element type: unknown metadata value type 4294967295");
  Raw boolean;
  boolean.header(0, 1).str("k").u32(7).u8(2);
  EXPECT_REJECTED(boolean, 37, "bool value must be 0 or 1, found 2");
  Raw array;
  array.header(0, 1).str("k").u32(9).u32(4).u64(uint64_t{1} << 62).zeros(64);
  EXPECT_REJECTED(array, 41, "array of 4611686018427387904 u32 elements cannot fit in the 64 bytes that remain");
  Raw too_many;  // 2^24 + 1 one-byte values, all present: refused by the total value cap, not by size
  too_many.header(0, 1).str("k").u32(9).u32(0).u64((uint64_t{1} << 24) + 1).zeros((size_t{1} << 24) + 1);
  EXPECT_REJECTED(too_many, 41, "too many metadata values in total (over 16777216");
}

TEST(GgufCorrupt, NestedArrayBombs) {
  // Deep: arrays of arrays 100,000 levels down (12 bytes a level) must stop at the depth limit,
  // not overflow the stack.
  Raw deep;
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 100000; ++i) deep.u32(9).u64(1);
  EXPECT_REJECTED(deep, 37 + 12 * kMaxArrayDepth, "arrays nested deeper than 8 levels");
  // Wide: an array claiming 2^40 empty arrays.
  Raw wide;
  wide.header(0, 1).str("k").u32(9).u32(9).u64(uint64_t{1} << 40).u32(4).u64(0);
  EXPECT_REJECTED(wide, 41, "array of 1099511627776 array elements cannot fit");
  // Wide and deep: every inner array claims 2^30 elements.
  Raw inner;
  inner.header(0, 1).str("k").u32(9).u32(9).u64(2).u32(9).u64(1).u32(4).u64(uint64_t{1} << 30).u32(1);
  EXPECT_REJECTED(inner, 65, "array of 1073741824 u32 elements cannot fit");
  // At the limit (8 levels) it is accepted.
  Raw ok;
  ok.header(0, 1).str("k").u32(9);
  for (int i = 0; i < kMaxArrayDepth - 1; ++i) ok.u32(9).u64(1);
  ok.u32(4).u64(1).u32(42);
  File f = File::from_memory(ok.b.data(), ok.b.size(), "ok");
  const Value* v = f.find("k");
  for (int i = 0; i < kMaxArrayDepth - 1; ++i) v = &v->arr.at(0);
  EXPECT_EQ(v->arr.at(0).num.u, 42u);
}

TEST(GgufCorrupt, DuplicateKey) {
  Raw r;
  r.header(0, 3).kv_u32("a.b", 1).kv_u32("c", 2).kv_u32("a.b", 3);
  EXPECT_REJECTED(r, 24 + 19 + 17, "duplicate metadata key 'a.b' (first at offset 24)");
}

TEST(GgufCorrupt, Alignment) {
  Raw zero;
  zero.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_REJECTED(zero, 24, "general.alignment is 0");
  Raw npot;
  npot.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_REJECTED(npot, 24, "general.alignment 48 is not a power of two");
  Raw type;
  type.header(0, 1).str("general.alignment").u32(10).u64(32);
  EXPECT_REJECTED(type, 24, "general.alignment must be u32, found u64");
  Raw str;
  str.header(0, 1).kv_str("general.alignment", "32");
  EXPECT_REJECTED(str, 24, "general.alignment must be u32, found string");
  // A valid alignment of 64 moves the data section and requires 64-aligned offsets.
  Raw a64;
  a64.header(1, 1).kv_u32("general.alignment", 64).tensor("t", {8}, 0, 32).pad(64).zeros(64);
  EXPECT_REJECTED(a64, 24 + 33, "tensor 't': data offset 32 is not a multiple of the alignment 64");
}

TEST(GgufCorrupt, TensorInfos) {
  const size_t at = 24;  // first tensor info right after a header without keys
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t off = 0, size_t data = 256) {
    Raw r;
    r.header(1, 0).tensor("w", dims, type, off).pad().zeros(data);
    return r;
  };
  EXPECT_REJECTED(one({8}, 99), at + 21, "tensor 'w': unknown ggml type id 99");
  EXPECT_REJECTED(one({8}, 4), at + 21, "unknown ggml type id 4");  // removed from ggml (q4_2)
  EXPECT_REJECTED(one({}, 0), at + 9, "tensor 'w': n_dims 0 out of range 1..4");
  EXPECT_REJECTED(one({1, 1, 1, 1, 1}, 0), at + 9, "n_dims 5 out of range 1..4");
  EXPECT_REJECTED(one({8, 0}, 0), at + 21, "tensor 'w': dimension 1 is zero");
  EXPECT_REJECTED(one({uint64_t{1} << 32, uint64_t{1} << 32}, 0), at + 21, "element count overflows");
  EXPECT_REJECTED(one({uint64_t{1} << 62}, 0), at + 9, "tensor 'w': byte size overflows");
  EXPECT_REJECTED(one({100}, 12), at + 9,
                  "row length 100 (element count 100) is not a multiple of the q4_K block size 256");
  EXPECT_REJECTED(one({16, 4}, 8), at + 9, "row length 16 (element count 64) is not a multiple of the q8_0 block");
  EXPECT_REJECTED(one({8}, 0, 4096), at, "tensor 'w': data [64 + 4096, 32 bytes) runs past the end of the file");
  EXPECT_REJECTED(one({8}, 0, 16), at, "tensor 'w': data offset 16 is not a multiple of the alignment 32");
  EXPECT_REJECTED(one({8}, 0, kMinus1 - 31), at, "runs past the end of the file");  // offset + size overflows
  EXPECT_REJECTED(one({64}, 0, 0, 200), at, "tensor 'w': data [64 + 0, 256 bytes) runs past the end");
  Raw empty_name;
  empty_name.header(1, 0).tensor("", {8}, 0, 0).pad().zeros(32);
  EXPECT_REJECTED(empty_name, at, "tensor 0 has an empty name");
}

TEST(GgufCorrupt, DuplicateTensorName) {
  Raw r;
  r.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64);
  EXPECT_REJECTED(r, 24 + 33, "duplicate tensor name 'w' (first at offset 24)");
}

TEST(GgufCorrupt, OverlappingTensorData) {
  Raw r;  // "b" starts inside "a" (a: 64 f32 = 256 bytes at 0; b at 128)
  r.header(2, 0).tensor("a", {64}, 0, 0).tensor("b", {8}, 0, 128).pad().zeros(512);
  EXPECT_REJECTED(r, 24 + 33, "tensor 'b': data at offset 128 overlaps tensor 'a' (offset 0, 256 bytes)");
  Raw same;  // two tensors sharing one offset, listed out of order
  same.header(3, 0).tensor("c", {8}, 0, 64).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 64).pad().zeros(512);
  const std::string m = error_of(same.b);
  EXPECT_NE(m.find("overlaps tensor"), std::string::npos) << m;
}

TEST(GgufCorrupt, ControlBytesInNamesAreEscaped) {
  Raw r;
  r.header(0, 2).kv_u32("a\n\x1b[31m", 1).kv_u32("a\n\x1b[31m", 2);
  EXPECT_REJECTED(r, 24 + 23, "duplicate metadata key 'a\\x0a\\x1b[31m'");
}

TEST(GgufCorrupt, OpenErrorsNameThePath) {
  const fs::path dir = fs::temp_directory_path();
  const fs::path empty = dir / ("strata_gguf_empty_" + std::to_string(::getpid()) + ".gguf");
  std::ofstream(empty).close();
  try {
    File::open(empty.string());
    ADD_FAILURE() << "empty file accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(empty.string() + ": offset 0: empty file"), std::string::npos) << e.what();
  }
  fs::remove(empty);
  try {
    File::open("/nonexistent/model.gguf");
    ADD_FAILURE() << "missing file accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf: cannot open: No such file"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(File::open(dir.string()), FormatError);
}
