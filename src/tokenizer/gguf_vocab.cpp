// Tokenizer::from_gguf: reads the tokenizer.ggml.* keys of a GGUF file into VocabData.
#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

namespace {

// Special token ids are UINT32 in files written by llama.cpp's converter; other writers use other
// integer types, so any integer type is accepted (its value is range-checked by from_data).
std::optional<int64_t> read_id(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  using T = gguf::ValueType;
  switch (v->type) {
    case T::UINT8: case T::UINT16: case T::UINT32: case T::UINT64:
      STRATA_REQUIRE(v->num.u <= static_cast<uint64_t>(INT64_MAX), "{} = {} is out of range", key,
                     v->num.u);
      return static_cast<int64_t>(v->num.u);
    case T::INT8: case T::INT16: case T::INT32: case T::INT64:
      return v->num.i;
    default:
      fail("{} has type {}, expected an integer token id", key, gguf::value_type_name(v->type));
  }
}

std::optional<bool> read_bool(const gguf::File& f, std::string_view key) {
  if (!f.has(key)) return std::nullopt;
  return f.get<bool>(key);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  try {
    STRATA_REQUIRE(f.has("tokenizer.ggml.model"),
                   "no tokenizer in this file (tokenizer.ggml.model is missing)");
    VocabData d;
    d.model = f.get<std::string>("tokenizer.ggml.model");
    d.pre = f.get_or<std::string>("tokenizer.ggml.pre", "");
    STRATA_REQUIRE(f.has("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens is missing");
    d.tokens = f.get_array<std::string>("tokenizer.ggml.tokens");
    if (f.has("tokenizer.ggml.token_type"))
      d.token_types = f.get_array<int32_t>("tokenizer.ggml.token_type");
    if (d.model == "gpt2") {
      STRATA_REQUIRE(f.has("tokenizer.ggml.merges"),
                     "tokenizer.ggml.merges is missing (byte-level BPE needs its merges)");
      d.merges = f.get_array<std::string>("tokenizer.ggml.merges");
    }
    d.bos_id = read_id(f, "tokenizer.ggml.bos_token_id");
    d.eos_id = read_id(f, "tokenizer.ggml.eos_token_id");
    d.eot_id = read_id(f, "tokenizer.ggml.eot_token_id");
    d.eom_id = read_id(f, "tokenizer.ggml.eom_token_id");
    d.unk_id = read_id(f, "tokenizer.ggml.unknown_token_id");
    d.sep_id = read_id(f, "tokenizer.ggml.seperator_token_id");  // sic: the GGUF key's spelling
    d.pad_id = read_id(f, "tokenizer.ggml.padding_token_id");
    d.add_bos = read_bool(f, "tokenizer.ggml.add_bos_token");
    d.add_eos = read_bool(f, "tokenizer.ggml.add_eos_token");
    return from_data(std::move(d));
  } catch (const gguf::FormatError&) {
    throw;  // already names the file
  } catch (const Error& e) {
    fail("{}: {}", f.path(), e.what());
  }
}

}  // namespace strata::tokenizer
