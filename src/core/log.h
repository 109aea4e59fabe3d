// Run-time switchable logging: CHORUS_DEBUG=WARN|INFO|TRACE, CHORUS_DEBUG_SUBSYS=BOOTSTRAP,TRANSPORT,...
// (or ALL, or ^SUBSYS to exclude) choosing the INFO and TRACE messages shown (warnings always are, as in NCCL),
// CHORUS_DEBUG_FILE=path (%h host, %p pid). Thread-safe.
#pragma once

#include "core/error.h"

namespace chorus {

enum class LogLevel : int { None = 0, Warn = 1, Info = 2, Trace = 3 };

bool log_enabled(LogLevel level, Subsys subsys);
void log_write(LogLevel level, Subsys subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace chorus

#define CHORUS_LOG(level, subsys, ...)                                                       \
  do {                                                                                       \
    if (::chorus::log_enabled(::chorus::LogLevel::level, ::chorus::Subsys::subsys))          \
      ::chorus::log_write(::chorus::LogLevel::level, ::chorus::Subsys::subsys, __VA_ARGS__); \
  } while (0)
#define CHORUS_WARN(subsys, ...) CHORUS_LOG(Warn, subsys, __VA_ARGS__)
#define CHORUS_INFO(subsys, ...) CHORUS_LOG(Info, subsys, __VA_ARGS__)
#define CHORUS_TRACE(subsys, ...) CHORUS_LOG(Trace, subsys, __VA_ARGS__)
