#pragma once
// UTF-8 validation and repair for text that leaves the tokenizer. Model output is a byte stream
// cut at token boundaries: a token can end in the middle of a character, and a model can emit bytes
// that are not UTF-8 at all. Utf8Sanitizer turns such a stream into valid UTF-8 incrementally: it
// holds back an incomplete character until the rest arrives, and replaces every ill-formed
// sequence with U+FFFD, one per maximal subpart (Unicode ch. 3, "U+FFFD substitution of maximal
// subparts"), the same policy as WHATWG/Python decoders.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Classifies the sequence that starts at p[0] (n >= 1 bytes available).
struct Utf8Step {
  enum Kind : uint8_t { kValid, kInvalid, kIncomplete } kind;
  uint8_t len;        // kValid: bytes of the character; kInvalid: bytes of the maximal subpart
                      // to replace; kIncomplete: n (a valid prefix that the buffer end cuts off)
  uint32_t codepoint; // kValid only
};
Utf8Step utf8_step(const uint8_t* p, size_t n);

// Appends the UTF-8 encoding of cp (cp <= 0x10FFFF, not a surrogate) to out.
void append_utf8(std::string& out, uint32_t cp);

// True when s is entirely well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

// s with every ill-formed sequence replaced by U+FFFD (a truncated character at the end too).
std::string sanitize_utf8(std::string_view s);

// Streaming form of sanitize_utf8: push() bytes as they come, get back the valid text that is
// complete so far; finish() releases a trailing incomplete character as U+FFFD.
class Utf8Sanitizer {
 public:
  void push(std::string_view bytes, std::string& out);
  void finish(std::string& out);
  void reset() { n_pending_ = 0; }
  size_t pending() const { return n_pending_; }  // bytes held back (0..3)

 private:
  uint8_t pending_[4] = {};
  size_t n_pending_ = 0;
};

}  // namespace strata::tokenizer
