#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace chorus {

const char* subsys_name(Subsys s) {
  switch (s) {
    case Subsys::Core: return "CORE";
    case Subsys::Bootstrap: return "BOOTSTRAP";
    case Subsys::Transport: return "TRANSPORT";
    case Subsys::Runtime: return "RUNTIME";
    case Subsys::Algorithms: return "ALGORITHMS";
    case Subsys::Kernels: return "KERNELS";
    case Subsys::Topology: return "TOPOLOGY";
    case Subsys::Tools: return "TOOLS";
    case Subsys::Count: break;
  }
  return "?";
}

void assert_fail(const char* expr, const std::source_location& where) {
  std::fprintf(stderr, "chorus: internal invariant broken: %s at %s:%u (%s)\n", expr, where.file_name(),
               static_cast<unsigned>(where.line()), where.function_name());
  std::fflush(stderr);
  std::abort();
}

}  // namespace chorus
