#pragma once
// Runs the strata binary under test (STRATA_CLI_PATH) through the shell: the CLI tests' one runner.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace strata::test {

struct CliOut {
  int rc = -1;      // exit status; -1: could not start it, or a signal ended it
  std::string out;  // stdout, and stderr unless dropped
};

// `strata ARGS`, stderr merged into out (or dropped), stdin from `stdin_path` when given.
inline CliOut run_strata(const std::string& args, bool merge_stderr = true, const std::string& stdin_path = "") {
  std::string cmd = std::string(STRATA_CLI_PATH) + " " + args;
  if (!stdin_path.empty()) cmd += " < " + stdin_path;
  cmd += merge_stderr ? " 2>&1" : " 2>/dev/null";
  CliOut o;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return o;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  const int st = pclose(p);
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

}  // namespace strata::test
