// Tokenizer::from_gguf on GGUF files with broken tokenizer metadata (the tiny model's tokenizer
// keys, altered one at a time, written with gguf::Writer and read back from memory).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::tokenizer;
using testing::HasSubstr;

namespace {

const std::string kTinyModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q8_0.gguf";

// The tokenizer keys of the tiny model, changed by `edit`, as a GGUF image; then from_gguf's error
// ("(no error)" when it loads).
std::string load_error(const std::function<void(gguf::Writer&)>& edit) {
  static const gguf::File src = gguf::File::open(kTinyModel);
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key.rfind("tokenizer.ggml.", 0) == 0) w.set_value(kv.key, kv.value);
  edit(w);
  const std::vector<uint8_t> bytes = w.to_bytes();
  try {
    const auto f = gguf::File::from_memory(bytes.data(), bytes.size(), "edited.gguf");
    Tokenizer::from_gguf(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<std::string> tiny_merges() {
  return gguf::File::open(kTinyModel).get_array<std::string>("tokenizer.ggml.merges");
}

}  // namespace

TEST(TokenizerGguf, UnchangedKeysLoad) {
  EXPECT_EQ(load_error([](gguf::Writer&) {}), "(no error)");
  // Special ids in another integer type than u32 are accepted.
  EXPECT_EQ(load_error([](gguf::Writer& w) { w.set("tokenizer.ggml.bos_token_id", int32_t{509}); }),
            "(no error)");
}

TEST(TokenizerGguf, BrokenMetadataIsAClearError) {
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.remove("tokenizer.ggml.model"); }),
              HasSubstr("edited.gguf: no tokenizer in this file"));
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.remove("tokenizer.ggml.tokens"); }),
              HasSubstr("tokenizer.ggml.tokens is missing"));
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.remove("tokenizer.ggml.merges"); }),
              HasSubstr("tokenizer.ggml.merges is missing"));
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.set("tokenizer.ggml.model", "llama"); }),
              HasSubstr("tokenizer.ggml.model = 'llama' is not supported"));
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.set("tokenizer.ggml.pre", "martian"); }),
              HasSubstr("unsupported pre-tokenizer tokenizer.ggml.pre = 'martian'"));
  EXPECT_THAT(load_error([](gguf::Writer& w) {
                w.set("tokenizer.ggml.bos_token_id", uint32_t{100000});
              }),
              HasSubstr("edited.gguf: tokenizer.ggml.bos_token_id = 100000 is out of range"));
  EXPECT_THAT(load_error([](gguf::Writer& w) { w.set("tokenizer.ggml.eos_token_id", "511"); }),
              HasSubstr("tokenizer.ggml.eos_token_id has type"));
  EXPECT_THAT(load_error([](gguf::Writer& w) {
                w.remove("tokenizer.ggml.bos_token_id");
                w.set("tokenizer.ggml.add_bos_token", true);
              }),
              HasSubstr("bos_token_id is missing"));
  EXPECT_THAT(load_error([](gguf::Writer& w) {
                w.set_array("tokenizer.ggml.token_type", std::vector<int32_t>(100, 1));
              }),
              HasSubstr("token_type has 100 entries but tokenizer.ggml.tokens has 512"));
  EXPECT_THAT(load_error([](gguf::Writer& w) {
                auto m = tiny_merges();
                m[7] = "\xC4\xA0 nosuchtoken";
                w.set_array("tokenizer.ggml.merges", m);
              }),
              HasSubstr("tokenizer.ggml.merges[7] = '\xC4\xA0 nosuchtoken': 'nosuchtoken' is not a token"));
  // A key of the wrong type: the reader's own error, still a strata::Error naming the key.
  EXPECT_THAT(load_error([](gguf::Writer& w) {
                w.set_array("tokenizer.ggml.token_type", std::vector<float>(512, 1.0f));
              }),
              HasSubstr("tokenizer.ggml.token_type"));
}
