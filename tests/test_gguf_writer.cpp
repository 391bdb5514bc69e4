// GGUF writer: write -> read gives back every value and byte; re-writing llama.cpp's fixture files
// reproduces them byte for byte; bad calls are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::gguf;

namespace {

std::vector<uint8_t> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

}  // namespace

TEST(GgufWriter, RoundTripEveryValueTypeAndTensorBytes) {
  Writer w;
  w.set_alignment(64);
  w.set("t.u8", uint8_t{255});
  w.set("t.i8", int8_t{-128});
  w.set("t.u16", uint16_t{65535});
  w.set("t.i16", int16_t{-32768});
  w.set("t.u32", uint32_t{4000000000u});
  w.set("t.i32", int32_t{-2000000000});
  w.set("t.u64", std::numeric_limits<uint64_t>::max());
  w.set("t.i64", std::numeric_limits<int64_t>::min());
  w.set("t.f32", 3.25f);
  w.set("t.f64", -1.0e300);
  w.set("t.bool", true);
  w.set("t.str", std::string("h\xC3\xa9llo\0world", 12));  // UTF-8 and an embedded NUL
  w.set("t.empty_str", std::string());
  w.set_array("t.a_u8", std::vector<uint8_t>{0, 1, 255});
  w.set_array("t.a_i16", std::vector<int16_t>{-5, 7});
  w.set_array("t.a_u64", std::vector<uint64_t>{1ull << 63});
  w.set_array("t.a_f32", std::vector<float>{-0.5f, 1e-30f});
  w.set_array("t.a_f64", std::vector<double>{2.5});
  w.set_array("t.a_bool", std::vector<bool>{true, false, true});
  w.set_array("t.a_str", std::vector<std::string>{"a", "", "ccc"});
  w.set_array("t.a_empty", std::vector<int32_t>{});
  w.set_value("t.nested", make_array(ValueType::ARRAY, {make_array(std::vector<int32_t>{1, 2}),
                                                        make_array(std::vector<int32_t>{}),
                                                        make_array(std::vector<int32_t>{3})}));
  w.set("t.u32", uint32_t{7});  // replaces in place, keeps the position

  const auto f32 = random_bytes(4 * 48, 1), q8 = random_bytes(34 * 2 * 3, 2), q4k = random_bytes(144 * 5, 3);
  w.add_tensor("a.f32", GgmlType::F32, {48}, f32);
  w.add_tensor("b.q8_0", GgmlType::Q8_0, {64, 3}, q8);
  w.add_tensor("c.q4_K", GgmlType::Q4_K, {256, 1, 5}, q4k);
  const auto bytes = w.to_bytes();

  File f = File::from_memory(bytes.data(), bytes.size(), "roundtrip");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.get<uint8_t>("t.u8"), 255);
  EXPECT_EQ(f.get<int8_t>("t.i8"), -128);
  EXPECT_EQ(f.get<uint16_t>("t.u16"), 65535);
  EXPECT_EQ(f.get<int16_t>("t.i16"), -32768);
  EXPECT_EQ(f.get<uint32_t>("t.u32"), 7u);
  EXPECT_EQ(f.metadata()[5].key, "t.u32");  // after general.alignment and 4 keys
  EXPECT_EQ(f.get<int32_t>("t.i32"), -2000000000);
  EXPECT_EQ(f.get<uint64_t>("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get<int64_t>("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get<float>("t.f32"), 3.25f);
  EXPECT_EQ(f.get<double>("t.f64"), -1.0e300);
  EXPECT_EQ(f.get<bool>("t.bool"), true);
  EXPECT_EQ(f.get<std::string>("t.str"), std::string("h\xC3\xa9llo\0world", 12));
  EXPECT_EQ(f.get<std::string>("t.empty_str"), "");
  EXPECT_EQ(f.get_array<uint8_t>("t.a_u8"), (std::vector<uint8_t>{0, 1, 255}));
  EXPECT_EQ(f.get_array<int16_t>("t.a_i16"), (std::vector<int16_t>{-5, 7}));
  EXPECT_EQ(f.get_array<uint64_t>("t.a_u64"), (std::vector<uint64_t>{1ull << 63}));
  EXPECT_EQ(f.get_array<float>("t.a_f32"), (std::vector<float>{-0.5f, 1e-30f}));
  EXPECT_EQ(f.get_array<double>("t.a_f64"), (std::vector<double>{2.5}));
  EXPECT_EQ(f.get_array<bool>("t.a_bool"), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(f.get_array<std::string>("t.a_str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_TRUE(f.get_array<int32_t>("t.a_empty").empty());
  const Value* nested = f.find("t.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(describe_type(*nested), "array of array of i32");
  ASSERT_EQ(nested->arr.size(), 3u);
  EXPECT_EQ(nested->arr[0].arr.size(), 2u);
  EXPECT_EQ(nested->arr[0].arr[1].num.i, 2);
  EXPECT_TRUE(nested->arr[1].arr.empty());
  EXPECT_EQ(nested->arr[2].arr[0].num.i, 3);

  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo& c = f.tensor("c.q4_K");
  EXPECT_EQ(c.n_dims, 3u);
  EXPECT_EQ(c.ne[0], 256u);
  EXPECT_EQ(c.ne[2], 5u);
  EXPECT_EQ(c.ne[3], 1u);
  EXPECT_EQ(c.type, GgmlType::Q4_K);
  EXPECT_EQ(std::vector<uint8_t>(c.data, c.data + c.nbytes), q4k);
  EXPECT_EQ(std::vector<uint8_t>(f.tensor("a.f32").data, f.tensor("a.f32").data + f32.size()), f32);
  EXPECT_EQ(std::vector<uint8_t>(f.tensor("b.q8_0").data, f.tensor("b.q8_0").data + q8.size()), q8);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;

  // Reading and writing again is the identity on bytes.
  EXPECT_EQ(Writer::from_file(f).to_bytes(), bytes);
}

TEST(GgufWriter, RewritingFixtureFilesReproducesTheirBytes) {
  const fs::path fx = STRATA_FIXTURES_DIR;
  size_t n = 0;
  for (const char* sub : {"models", "vocab", "formats"}) {
    for (const auto& e : fs::directory_iterator(fx / sub)) {
      if (e.path().extension() != ".gguf") continue;
      SCOPED_TRACE(e.path().string());
      File f = File::open(e.path().string());
      const auto again = Writer::from_file(f).to_bytes();
      const auto orig = read_all(e.path());
      ASSERT_EQ(again.size(), orig.size());
      EXPECT_TRUE(again == orig) << "bytes differ";
      ++n;
    }
  }
  EXPECT_GE(n, 12u);
}

TEST(GgufWriter, WriteToPathThenOpen) {
  const fs::path p = fs::temp_directory_path() / ("strata_gguf_writer_" + std::to_string(::getpid()) + ".gguf");
  Writer w;
  w.set("general.architecture", "test");
  const auto b = random_bytes(2 * 32 * 4, 9);
  w.add_tensor("x", GgmlType::F16, {32, 4}, b);
  w.write(p.string());
  {
    File f = File::open(p.string());
    EXPECT_EQ(f.get<std::string>("general.architecture"), "test");
    EXPECT_EQ(f.tensor("x").nbytes, b.size());
    EXPECT_EQ(std::vector<uint8_t>(f.tensor("x").data, f.tensor("x").data + b.size()), b);
  }
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  fs::remove(p);
  EXPECT_THROW(w.write("/nonexistent-dir/x.gguf"), Error);
}

TEST(GgufWriter, RefusesWhatTheReaderWouldReject) {
  Writer w;
  const std::vector<uint8_t> b32(34);
  w.add_tensor("t", GgmlType::Q8_0, {32}, b32);
  EXPECT_THROW(w.add_tensor("t", GgmlType::Q8_0, {32}, b32), Error);                     // duplicate
  EXPECT_THROW(w.add_tensor("u", GgmlType::Q8_0, {32, 2}, b32), Error);                  // byte count
  EXPECT_THROW(w.add_tensor("u", GgmlType::Q8_0, {16}, std::vector<uint8_t>(17)), Error);  // block size
  EXPECT_THROW(w.add_tensor("u", GgmlType::F32, {0}, {}), Error);                        // zero dim
  EXPECT_THROW(w.add_tensor("u", GgmlType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), Error);  // 5 dims
  EXPECT_THROW(w.add_tensor("", GgmlType::F32, {1}, std::vector<uint8_t>(4)), Error);   // empty name
  EXPECT_THROW(w.set_alignment(48), Error);
  EXPECT_THROW(w.set_alignment(0), Error);
  EXPECT_THROW(w.set("general.alignment", uint64_t{32}), Error);
  Value bad = make_array(std::vector<int32_t>{1, 2});
  bad.arr[1].type = ValueType::FLOAT32;
  EXPECT_THROW(w.set_value("k", bad), Error);
  Value deep = make_array(std::vector<int32_t>{1});
  for (int i = 0; i < kMaxArrayDepth; ++i) deep = make_array(ValueType::ARRAY, {deep});
  EXPECT_THROW(w.set_value("deep", deep), Error);
  EXPECT_THROW(w.set("", uint32_t{1}), Error);
  EXPECT_EQ(w.n_tensors(), 1u);
}

TEST(GgufWriter, ProducedTensorsAreMadeAtWriteTime) {
  Writer w;
  int calls = 0;
  w.add_tensor_producer("p", GgmlType::Q8_0, {64, 3}, [&](std::span<uint8_t> out) {
    ++calls;
    ASSERT_EQ(out.size(), 34u * 2 * 3);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
  });
  w.add_tensor("q", GgmlType::F32, {4}, std::vector<uint8_t>(16, 0xab));
  EXPECT_EQ(calls, 0);
  File f = File::from_bytes(w.to_bytes(), "produced");
  EXPECT_EQ(calls, 1);
  const TensorInfo& p = f.tensor("p");
  ASSERT_EQ(p.nbytes, 204u);
  for (size_t i = 0; i < p.nbytes; ++i) ASSERT_EQ(p.data[i], static_cast<uint8_t>(i * 7)) << i;
  EXPECT_EQ(f.tensor("q").data[15], 0xab);
  EXPECT_THROW(w.add_tensor_producer("r", GgmlType::Q8_0, {33}, [](std::span<uint8_t>) {}), Error);
  EXPECT_THROW(w.add_tensor_producer("p", GgmlType::F32, {1}, [](std::span<uint8_t>) {}), Error);
  EXPECT_THROW(w.add_tensor_producer("s", static_cast<GgmlType>(4), {1}, [](std::span<uint8_t>) {}), Error);
}
