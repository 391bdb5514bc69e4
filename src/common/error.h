#pragma once
// One exception type for every user-facing failure (bad file, bad flag, bad request). It carries a
// message that says what was expected and what was found; callers at the top level print it and exit
// non-zero (CLI) or answer 4xx/5xx (server). Never abort on bad input.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace strata

// Checks a condition on untrusted or user input; throws strata::Error with the formatted message.
#define STRATA_REQUIRE(cond, ...)            \
  do {                                       \
    if (!(cond)) ::strata::fail(__VA_ARGS__); \
  } while (0)
