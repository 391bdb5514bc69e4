#pragma once
// Turns the byte pieces of generated tokens into text that is safe to send: it never splits a UTF-8
// character across two sends, and never sends bytes that might turn out to be the start of a stop
// string. When a stop string appears, the text before it is released and the rest is dropped.
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling.h"

namespace strata::server {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {});

  // Appends a token's bytes; returns the text that can be sent now (maybe empty).
  // After a stop string has matched, returns "" and ignores further input.
  std::string push(std::string_view piece);
  // End of generation: releases what was held back (an unfinished UTF-8 tail stays as is; the JSON
  // writer replaces invalid bytes with U+FFFD).
  std::string flush();

  bool stopped() const { return stop_.stopped(); }
  const std::string& matched_stop() const { return stop_.matched(); }

 private:
  StopMatcher stop_;          // holds back what may start a stop string (the engine's matcher)
  std::string utf8_pending_;  // released by stop_, held for an unfinished UTF-8 character
};

// Number of bytes at the end of `s` that form an incomplete (so far valid-looking) UTF-8 sequence.
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace strata::server
