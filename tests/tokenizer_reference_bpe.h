#pragma once
// Reference BPE for tests and benchmarks, written independently of src/tokenizer's fast one.
#include <climits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8_decode.h"

namespace strata::tokenizer::reference {

// Reference BPE, written independently of the fast one: GPT-2's encoder.py loop on strings
// (merge every occurrence of the lowest-ranked adjacent pair until none is left).
class ReferenceBpe {
 public:
  ReferenceBpe(const gguf::File& f, const Tokenizer& tok)
      : tok_(tok), pre_(f.get<std::string>("tokenizer.ggml.pre")) {
    const auto merges = f.get_array<std::string>("tokenizer.ggml.merges");
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t sp = merges[r].find(' ', 1);
      ranks_.emplace(std::make_pair(merges[r].substr(0, sp), merges[r].substr(sp + 1)), int(r));
    }
  }
  std::vector<TokenId> encode(std::string_view text) const {  // plain text: no special tokens, no BOS
    std::vector<Piece> pieces;
    pre_.split(text, pieces);
    std::vector<TokenId> out;
    for (const Piece& p : pieces) {
      std::string enc;
      byte_level_encode(text.substr(p.offset, p.length), enc);
      std::vector<std::string> sym;
      for (size_t i = 0; i < enc.size();) {
        const auto st = utf8_step(reinterpret_cast<const uint8_t*>(enc.data()) + i, enc.size() - i);
        sym.push_back(enc.substr(i, st.len));
        i += st.len;
      }
      for (;;) {
        int best = INT_MAX;
        std::pair<std::string, std::string> bp;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto it = ranks_.find({sym[i], sym[i + 1]});
          if (it != ranks_.end() && it->second < best) best = it->second, bp = it->first;
        }
        if (best == INT_MAX) break;
        std::vector<std::string> next;
        for (size_t i = 0; i < sym.size();) {
          if (i + 1 < sym.size() && sym[i] == bp.first && sym[i + 1] == bp.second) {
            next.push_back(sym[i] + sym[i + 1]);
            i += 2;
          } else {
            next.push_back(sym[i++]);
          }
        }
        sym.swap(next);
      }
      for (const auto& s : sym) out.push_back(tok_.find_token(s));
    }
    return out;
  }

 private:
  const Tokenizer& tok_;
  PreTokenizer pre_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
};

}  // namespace strata::tokenizer::reference
