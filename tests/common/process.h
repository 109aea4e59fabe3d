// Test helper: run a shell command line and capture what it printed, for the tests that start real processes
// (chorusrun jobs, scripts).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

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

// The path of a program built with the running test: the file of the same name in the running test's own folder
// when there is one, else `built_path` as CMake baked it in. The first serves a build that was copied elsewhere as
// one folder (scripts/gpu-pack.sh, which the lent GPU machine runs from), where the baked path does not exist.
inline std::string built_tool(const std::string& built_path) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return built_path;
  const std::string exe(self, static_cast<size_t>(n));
  const std::string beside = exe.substr(0, exe.rfind('/') + 1) + built_path.substr(built_path.rfind('/') + 1);
  return access(beside.c_str(), X_OK) == 0 ? beside : built_path;
}

// How many times `needle` occurs in `out`.
inline int count_of(const std::string& out, const std::string& needle) {
  int c = 0;
  for (size_t pos = 0; (pos = out.find(needle, pos)) != std::string::npos; pos += needle.size()) ++c;
  return c;
}

}  // namespace chorus::test
