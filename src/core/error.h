// Typed errors. Inside the library, failures are C++ exceptions of type chorus::Error carrying a result code, the
// subsystem and the source location; the C boundary (src/core/api.cc) converts them to chorusResult_t and keeps the
// text for chorusGetLastError. Broken invariants are not errors: CHORUS_ASSERT aborts loudly.
#pragma once

#include <chorus/chorus.h>

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace chorus {

enum class Subsys : int { Core, Bootstrap, Transport, Runtime, Algorithms, Kernels, Topology, Tools, Count };
const char* subsys_name(Subsys s);

// Concatenates anything streamable: cat("rank ", r, " peer ", p).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

class Error : public std::runtime_error {
 public:
  Error(chorusResult_t code, Subsys subsys, std::string message,
        std::source_location where = std::source_location::current())
      : std::runtime_error(std::move(message)), code_(code), subsys_(subsys), where_(where) {}
  chorusResult_t code() const { return code_; }
  Subsys subsys() const { return subsys_; }
  const std::source_location& where() const { return where_; }

 private:
  chorusResult_t code_;
  Subsys subsys_;
  std::source_location where_;
};

[[noreturn]] void assert_fail(const char* expr, const std::source_location& where);

}  // namespace chorus

// Invariant check (always compiled in): aborts with the expression and location.
#define CHORUS_ASSERT(cond)                                                     \
  do {                                                                          \
    if (!(cond)) ::chorus::assert_fail(#cond, std::source_location::current()); \
  } while (0)
