// Test helper: run a shell command line and capture what it printed, for the tests that start real processes
// (chorusrun jobs, scripts).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace chorus::test {

struct Result {
  int code = -1;    // exit status, or 128 + signal
  std::string out;  // stdout and stderr together
};

// Runs `cmd` through the shell, capturing stdout and stderr.
inline Result run(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// How many times `needle` occurs in `out`.
inline int count_of(const std::string& out, const std::string& needle) {
  int c = 0;
  for (size_t pos = 0; (pos = out.find(needle, pos)) != std::string::npos; pos += needle.size()) ++c;
  return c;
}

}  // namespace chorus::test
