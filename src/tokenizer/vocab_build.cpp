// Tokenizer::from_data: validates untrusted tokenizer metadata and builds the lookup tables.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace strata::tokenizer {

namespace {

// Printable form of untrusted text for error messages: short, and no control characters.
std::string in_quotes(std::string_view s) {
  std::string r = "'";
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = s[i];
    if (c < 0x20 || c == 0x7F)
      r += fmt::format("\\x{:02x}", c);
    else
      r += static_cast<char>(c);
  }
  if (s.size() > 64) r += "...";
  return sanitize_utf8(r + "'");
}

TokenId checked_id(const std::optional<int64_t>& id, const char* key, size_t n_vocab) {
  if (!id) return kNoToken;
  STRATA_REQUIRE(*id >= 0 && static_cast<uint64_t>(*id) < n_vocab,
                 "tokenizer.ggml.{} = {} is out of range: the vocabulary has {} tokens", key, *id,
                 n_vocab);
  return static_cast<TokenId>(*id);
}

// Token texts that end generation in the model families we run (when they are special tokens).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>",    "<|end|>",  "<end_of_turn>", "<|endoftext|>",
    "<|return|>", "<|call|>",      "<EOT>",    "_<EOT>",        "<|end_of_text|>",
    "<｜end▁of▁sentence｜>"};

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return -1;
  }
  return v;
}

}  // namespace

Tokenizer Tokenizer::from_data(VocabData d) {
  STRATA_REQUIRE(d.model == "gpt2",
                 "tokenizer.ggml.model = {} is not supported (strata implements byte-level BPE, "
                 "'gpt2', used by Qwen, DeepSeek, Llama 3, Kimi, gpt-oss)",
                 in_quotes(d.model));
  if (d.pre.empty()) {
    spdlog::warn("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer; token ids may "
                 "differ from the model's own tokenizer");
    d.pre = "default";
  }
  auto impl = std::make_shared<Impl>(d.pre);  // throws on an unknown pre-tokenizer
  Impl& t = *impl;

  const size_t n = d.tokens.size();
  STRATA_REQUIRE(n > 0, "tokenizer.ggml.tokens is empty");
  STRATA_REQUIRE(n <= static_cast<size_t>(std::numeric_limits<TokenId>::max()),
                 "tokenizer.ggml.tokens has {} entries, more than token ids can address", n);
  STRATA_REQUIRE(d.token_types.empty() || d.token_types.size() == n,
                 "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                 d.token_types.size(), n);

  t.text = std::move(d.tokens);
  t.type.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < d.token_types.size(); ++i) {
    const int32_t ty = d.token_types[i];
    STRATA_REQUIRE(ty >= 0 && ty <= 6, "tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)",
                   i, ty);
    t.type[i] = static_cast<TokenType>(ty);
  }

  t.text_to_id.build(t.text);

  // What each token decodes to.
  t.bytes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t.type[i]) {
      case TokenType::kNormal:
      case TokenType::kUndefined:
        t.bytes[i] = byte_level_decode(t.text[i]);
        break;
      case TokenType::kByte: {
        const int b = parse_byte_token(t.text[i]);
        t.bytes[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : byte_level_decode(t.text[i]);
        break;
      }
      case TokenType::kUnused:
        break;
      default:  // control, user-defined, unknown: their text as is
        t.bytes[i] = t.text[i];
    }
  }

  // Single-byte tokens: the start of every BPE.
  size_t missing = 0;
  for (int b = 0; b < 256; ++b) {
    t.byte_token[b] = t.text_to_id.find(byte_to_unicode(static_cast<uint8_t>(b)));
    missing += t.byte_token[b] == kNoToken;
  }
  if (missing > 0)
    spdlog::warn("the vocabulary has no token for {} of the 256 bytes: text containing them "
                 "cannot be tokenized exactly (they become the unknown token, or are dropped)",
                 missing);

  // Merges: "left right" with both halves and their concatenation in the vocabulary (the same
  // rule as Hugging Face tokenizers, which rejects such a file too).
  STRATA_REQUIRE(d.merges.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                 "tokenizer.ggml.merges has too many entries ({})", d.merges.size());
  t.merges.reserve(d.merges.size());
  std::string joined;
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string_view m = d.merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    STRATA_REQUIRE(sp != std::string_view::npos && sp + 1 < m.size(),
                   "tokenizer.ggml.merges[{}] = {} is not of the form 'left right'", r, in_quotes(m));
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    const TokenId ia = t.text_to_id.find(a), ib = t.text_to_id.find(b);
    STRATA_REQUIRE(ia != kNoToken, "tokenizer.ggml.merges[{}] = {}: {} is not a token", r,
                   in_quotes(m), in_quotes(a));
    STRATA_REQUIRE(ib != kNoToken, "tokenizer.ggml.merges[{}] = {}: {} is not a token", r,
                   in_quotes(m), in_quotes(b));
    joined.assign(a);
    joined += b;
    const TokenId ij = t.text_to_id.find(joined);
    STRATA_REQUIRE(ij != kNoToken,
                   "tokenizer.ggml.merges[{}] = {}: the merged token {} is not in the vocabulary",
                   r, in_quotes(m), in_quotes(joined));
    // A pair listed twice keeps its first (lowest) rank.
    t.merges.try_emplace(merge_key(ia, ib), {static_cast<int32_t>(r), ij});
  }

  t.bos = checked_id(d.bos_id, "bos_token_id", n);
  t.eos = checked_id(d.eos_id, "eos_token_id", n);
  t.eot = checked_id(d.eot_id, "eot_token_id", n);
  t.eom = checked_id(d.eom_id, "eom_token_id", n);
  t.unk = checked_id(d.unk_id, "unknown_token_id", n);
  t.sep = checked_id(d.sep_id, "seperator_token_id", n);
  t.pad = checked_id(d.pad_id, "padding_token_id", n);
  // The family default applies only where there is a BOS token to add.
  t.add_bos = d.add_bos.value_or(t.pre.default_add_bos() && t.bos != kNoToken);
  t.add_eos = d.add_eos.value_or(false);
  STRATA_REQUIRE(!t.add_bos || t.bos != kNoToken,
                 "the tokenizer adds a BOS token (tokenizer.ggml.add_bos_token) but "
                 "tokenizer.ggml.bos_token_id is missing");
  STRATA_REQUIRE(!t.add_eos || t.eos != kNoToken,
                 "the tokenizer adds an EOS token (tokenizer.ggml.add_eos_token) but "
                 "tokenizer.ggml.eos_token_id is missing");

  // Tokens matched in text before BPE: longest first, so "<|im_start|>" wins over "<|im".
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = t.type[i];
    if ((ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown) &&
        !t.text[i].empty())
      t.special.push_back(static_cast<TokenId>(i));
  }
  std::stable_sort(t.special.begin(), t.special.end(), [&](TokenId x, TokenId y) {
    return t.text[x].size() > t.text[y].size();
  });

  t.is_eog.assign(n, false);
  for (TokenId id : {t.eos, t.eot, t.eom})
    if (id != kNoToken) t.is_eog[id] = true;
  for (std::string_view s : kEogTexts) {
    const TokenId id = t.text_to_id.find(s);
    if (id != kNoToken && t.type[id] != TokenType::kNormal) t.is_eog[id] = true;
  }
  for (size_t i = 0; i < n; ++i)
    if (t.is_eog[i]) t.eog.push_back(static_cast<TokenId>(i));

  return Tokenizer(std::move(impl));
}

}  // namespace strata::tokenizer
