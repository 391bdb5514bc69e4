#pragma once
// Open-addressing hash tables for the vocabulary (~150k tokens, ~150k merges). Node-based
// std::unordered_map spends most of a vocabulary load in cache misses; these keep the hash and
// the key/value in one flat array (linear probing, load factor <= 1/2), built once, then read-only.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a, then a final avalanche (murmur3 fmix64) so that low bits are usable for the index.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

inline size_t table_capacity(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  return cap;
}

// text -> token id; the texts live in the vocabulary (`texts`), the table stores ids only.
class TextIndex {
 public:
  void build(const std::vector<std::string>& texts) {
    texts_ = &texts;
    slots_.assign(table_capacity(texts.size()), Slot{0, -1});
    mask_ = slots_.size() - 1;
    for (size_t i = 0; i < texts.size(); ++i) {
      const uint64_t h = hash_bytes(texts[i]);
      size_t j = h & mask_;
      for (;; j = (j + 1) & mask_) {
        Slot& s = slots_[j];
        if (s.id < 0) {
          s = Slot{uint32_t(h >> 32), int32_t(i)};
          break;
        }
        if (s.tag == uint32_t(h >> 32) && texts[s.id] == texts[i]) {
          s.id = int32_t(i);  // duplicate text: the last id wins (as in llama.cpp)
          break;
        }
      }
    }
  }
  // Token id of `text`, or -1.
  int32_t find(std::string_view text) const {
    const uint64_t h = hash_bytes(text);
    for (size_t j = h & mask_;; j = (j + 1) & mask_) {
      const Slot& s = slots_[j];
      if (s.id < 0) return -1;
      if (s.tag == uint32_t(h >> 32) && (*texts_)[s.id] == text) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high hash bits: most mismatches are rejected without touching the text
    int32_t id;
  };
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// uint64 key -> (int32 rank, int32 result). Keys are never UINT64_MAX (the empty marker).
class PairTable {
 public:
  struct Value {
    int32_t rank;
    int32_t result;
  };
  void reserve(size_t n) {
    slots_.assign(table_capacity(n), Slot{kEmpty, {0, 0}});
    mask_ = slots_.size() - 1;
  }
  // Inserts unless the key is present (the first insertion wins). The table never grows:
  // reserve() for the final count first.
  void try_emplace(uint64_t key, Value v) {
    for (size_t j = mix64(key) & mask_;; j = (j + 1) & mask_) {
      Slot& s = slots_[j];
      if (s.key == kEmpty) {
        s = Slot{key, v};
        return;
      }
      if (s.key == key) return;
    }
  }
  const Value* find(uint64_t key) const {
    for (size_t j = mix64(key) & mask_;; j = (j + 1) & mask_) {
      const Slot& s = slots_[j];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    Value value;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace strata::tokenizer
