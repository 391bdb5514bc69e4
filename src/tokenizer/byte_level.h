#pragma once
// GPT-2 byte-level encoding: byte-level BPE vocabularies (tokenizer.ggml.model = gpt2) store token
// text with every byte mapped to a printable code point (space -> U+0120 'Ġ', newline -> U+010A 'Ċ',
// printable ASCII and most Latin-1 to themselves). Text is encoded this way before BPE and token
// text is decoded back to bytes for output.
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

// UTF-8 of the code point that stands for byte b.
std::string_view byte_to_unicode(uint8_t b);

// The byte a code point stands for, or -1 when cp is not in the table.
int unicode_to_byte(uint32_t cp);

// Encodes raw bytes (any bytes) into byte-level text; appends to out.
void byte_level_encode(std::string_view bytes, std::string& out);

// Decodes byte-level token text back to bytes. Code points outside the table (token text that was
// not byte-level encoded, or is not valid UTF-8) are copied through unchanged, never dropped.
std::string byte_level_decode(std::string_view text);

}  // namespace strata::tokenizer
