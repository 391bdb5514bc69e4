// Tokenizer::tokenize: special-token partition, pre-tokenization, byte-level BPE.
#include <algorithm>

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace strata::tokenizer {

namespace {

struct Fragment {
  TokenId token;        // a matched special token, or kNoToken for plain text
  uint32_t offset, length;  // plain text: byte range in the input
};

struct Bigram {
  int32_t rank;
  int32_t left, right;     // symbol indices
  TokenId left_id, right_id, result;
};
// Heap order: lowest rank first; among equal ranks the leftmost pair (llama.cpp's order).
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

struct Symbol {
  TokenId id;  // kNoToken: a byte the vocabulary lacks (never merges)
  int32_t prev, next;
  bool alive;
};

// Splits the plain fragments at every occurrence of the special tokens, longest token first (the
// order llama.cpp uses, so both agree when tokens overlap).
void partition_special(const Tokenizer::Impl& t, std::string_view text, bool parse_special,
                       std::vector<Fragment>& frags) {
  frags.assign(1, Fragment{kNoToken, 0, static_cast<uint32_t>(text.size())});
  std::vector<Fragment> next;
  for (TokenId id : t.special) {
    const TokenType ty = t.type[id];
    if (!parse_special && (ty == TokenType::kControl || ty == TokenType::kUnknown)) continue;
    const std::string_view st = t.text[id];
    if (st.size() > text.size() || text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.offset;
      const size_t end = size_t(f.offset) + f.length;
      while (pos < end) {
        const size_t hit = text.substr(0, end).find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({kNoToken, uint32_t(pos), uint32_t(hit - pos)});
        next.push_back({id, 0, 0});
        pos = hit + st.size();
      }
      if (pos < end) next.push_back({kNoToken, uint32_t(pos), uint32_t(end - pos)});
    }
    frags.swap(next);
  }
}

}  // namespace

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  auto emit_unmergeable = [&](TokenId id) {
    if (id != kNoToken) {
      out.push_back(id);
    } else if (unk != kNoToken) {
      out.push_back(unk);
    }  // else dropped, as llama.cpp does (the load warned that bytes are missing)
  };
  if (piece.size() == 1) {
    emit_unmergeable(byte_token[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (pre.ignore_merges()) {
    std::string enc;
    byte_level_encode(piece, enc);
    const TokenId id = text_to_id.find(enc);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
  }

  // Symbols start as one per byte, in a doubly linked list; the heap holds candidate merges of
  // neighbours. A popped pair is stale when either side has changed since it was pushed.
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Bigram> heap;
  sym.resize(piece.size());
  heap.clear();
  const int32_t n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i)
    sym[i] = Symbol{byte_token[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};

  auto push_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const TokenId a = sym[l].id, b = sym[r].id;
    if (a == kNoToken || b == kNoToken) return;
    const PairTable::Value* m = merges.find(merge_key(a, b));
    if (!m) return;
    heap.push_back(Bigram{m->rank, l, r, a, b, m->result});
    std::push_heap(heap.begin(), heap.end(), BigramAfter{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), BigramAfter{});
    const Bigram bg = heap.back();
    heap.pop_back();
    Symbol& L = sym[bg.left];
    Symbol& R = sym[bg.right];
    if (!L.alive || !R.alive || L.next != bg.right || L.id != bg.left_id || R.id != bg.right_id)
      continue;
    L.id = bg.result;
    L.next = R.next;
    if (R.next >= 0) sym[R.next].prev = bg.left;
    R.alive = false;
    push_pair(L.prev, bg.left);
    push_pair(bg.left, L.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) emit_unmergeable(sym[i].id);
}

std::vector<TokenId> Tokenizer::tokenize(std::string_view text, EncodeOptions opt) const {
  std::vector<TokenId> out;
  tokenize(text, opt, out);
  return out;
}

void Tokenizer::tokenize(std::string_view text, EncodeOptions opt, std::vector<TokenId>& out) const {
  const Impl& t = *impl_;
  STRATA_REQUIRE(text.size() <= UINT32_MAX, "text of {} bytes is too long to tokenize",
                 text.size());
  if (opt.add_special && t.add_bos) out.push_back(t.bos);
  if (!text.empty()) {
    std::vector<Fragment> frags;
    partition_special(t, text, opt.parse_special, frags);
    std::vector<Piece> pieces;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        continue;
      }
      const std::string_view frag = text.substr(f.offset, f.length);
      pieces.clear();
      t.pre.split(frag, pieces);
      for (const Piece& p : pieces) t.bpe(frag.substr(p.offset, p.length), out);
    }
  }
  if (opt.add_special && t.add_eos) out.push_back(t.eos);
}

}  // namespace strata::tokenizer
