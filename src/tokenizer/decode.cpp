// Detokenization: token bytes, whole sequences, and the streaming decoder. Accessors.
#include <algorithm>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace strata::tokenizer {

namespace {
inline void check_id(const Tokenizer::Impl& t, TokenId id) {
  STRATA_REQUIRE(id >= 0 && static_cast<size_t>(id) < t.text.size(),
                 "token id {} is out of range: the vocabulary has {} tokens", id, t.text.size());
}
}  // namespace

std::string_view Tokenizer::token_bytes(TokenId id, bool render_special) const {
  const Impl& t = *impl_;
  check_id(t, id);
  const TokenType ty = t.type[id];
  if (!render_special && (ty == TokenType::kControl || ty == TokenType::kUnknown)) return {};
  return t.bytes[id];
}

std::string Tokenizer::detokenize(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  Utf8Sanitizer utf8;
  for (TokenId id : ids) utf8.push(token_bytes(id, render_special), out);
  utf8.finish(out);
  return out;
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->text.size()); }
const std::string& Tokenizer::token_text(TokenId id) const {
  check_id(*impl_, id);
  return impl_->text[id];
}
TokenType Tokenizer::token_type(TokenId id) const {
  check_id(*impl_, id);
  return impl_->type[id];
}
TokenId Tokenizer::find_token(std::string_view text) const {
  return impl_->text_to_id.find(text);
}
bool Tokenizer::is_control(TokenId id) const {
  const TokenType ty = token_type(id);
  return ty == TokenType::kControl || ty == TokenType::kUnknown;
}
bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_eog.size() && impl_->is_eog[id];
}
const std::vector<TokenId>& Tokenizer::eog_ids() const { return impl_->eog; }
TokenId Tokenizer::bos() const { return impl_->bos; }
TokenId Tokenizer::eos() const { return impl_->eos; }
TokenId Tokenizer::eot() const { return impl_->eot; }
TokenId Tokenizer::unk() const { return impl_->unk; }
TokenId Tokenizer::pad() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
const std::string& Tokenizer::pre() const { return impl_->pre.name(); }

void StreamDecoder::push(TokenId id, std::string& out) {
  const std::string_view b = tok_.token_bytes(id, render_special_);  // throws before any change
  utf8_.push(b, out);
}

std::string StreamDecoder::push(TokenId id) {
  std::string out;
  push(id, out);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_.finish(out);
  return out;
}

}  // namespace strata::tokenizer
