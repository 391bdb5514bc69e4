#pragma once
// Internal state of a Tokenizer (shared, immutable after construction). Only the tokenizer's own
// .cpp files include this.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/flat_tables.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

// Key of the pair (left, right) in the merge table.
inline uint64_t merge_key(TokenId left, TokenId right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct Tokenizer::Impl {
  explicit Impl(std::string_view pre_name) : pre(pre_name) {}

  std::vector<std::string> text;    // [n_vocab] token text as stored (byte-level encoded)
  std::vector<TokenType> type;      // [n_vocab]
  std::vector<std::string> bytes;   // [n_vocab] what each token decodes to (raw bytes)
  TextIndex text_to_id;  // text -> id over `text`; duplicate texts: the last id wins (llama.cpp)
  // merge_key(left, right) -> {rank: index in tokenizer.ggml.merges, lower merges first;
  //                            result: the token the two merge into}
  PairTable merges;
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
