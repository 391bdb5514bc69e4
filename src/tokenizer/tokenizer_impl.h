#pragma once
// Internal state of a Tokenizer (shared, immutable after construction). Only the tokenizer's own
// .cpp files include this.
#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

struct MergeRule {
  int32_t rank;    // index in tokenizer.ggml.merges: lower merges first
  TokenId result;  // the token the two merge into
};

// Key of the pair (left, right) in the merge table.
inline uint64_t merge_key(TokenId left, TokenId right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct Tokenizer::Impl {
  explicit Impl(std::string_view pre_name) : pre(pre_name) {}

  std::vector<std::string> text;    // [n_vocab] token text as stored (byte-level encoded)
  std::vector<TokenType> type;      // [n_vocab]
  std::vector<std::string> bytes;   // [n_vocab] what each token decodes to (raw bytes)
  // text -> id; views point into `text`, which never changes after construction. Duplicate texts:
  // the last id wins (as in llama.cpp).
  std::unordered_map<std::string_view, TokenId> text_to_id;
  std::unordered_map<uint64_t, MergeRule> merges;  // merge_key(left, right) -> rule
  std::array<TokenId, 256> byte_token{};           // token of each single byte; kNoToken if absent
  std::vector<TokenId> special;  // control/user-defined/unknown tokens, longest text first
  std::vector<TokenId> eog;      // end-of-generation ids, sorted
  std::vector<bool> is_eog;      // [n_vocab]
  PreTokenizer pre;

  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken,
          sep = kNoToken, pad = kNoToken;
  bool add_bos = false, add_eos = false;

  // BPE of one pre-tokenized piece (raw bytes); appends ids.
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
};

}  // namespace strata::tokenizer
