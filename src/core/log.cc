#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/config.h"

namespace chorus {

namespace {

struct LogState {
  LogLevel level = LogLevel::Warn;
  bool subsys_on[static_cast<int>(Subsys::Count)] = {};
  FILE* out = stderr;
  std::mutex mu;
};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

LogState& state() {
  static LogState* st = [] {
    auto* s = new LogState();  // never freed: logging may run during static destruction
    std::string lvl = upper(param_str(Param::Debug));
    if (lvl == "NONE" || lvl == "OFF")
      s->level = LogLevel::None;
    else if (lvl == "INFO")
      s->level = LogLevel::Info;
    else if (lvl == "TRACE")
      s->level = LogLevel::Trace;
    else
      s->level = LogLevel::Warn;
    // Logging cannot throw (it runs everywhere, even while unwinding), so bad values are said once and replaced.
    if (lvl != "NONE" && lvl != "OFF" && lvl != "WARN" && lvl != "INFO" && lvl != "TRACE")
      std::fprintf(stderr, "chorus: CHORUS_DEBUG='%s' is not NONE, WARN, INFO or TRACE; using WARN\n", lvl.c_str());
    std::string subs = upper(param_str(Param::DebugSubsys));
    bool exclude = !subs.empty() && subs[0] == '^';
    if (exclude) subs.erase(0, 1);
    bool any_known = false;
    for (size_t pos = 0; pos <= subs.size();) {
      size_t comma = subs.find(',', pos);
      std::string name = subs.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      bool known = name == "ALL";
      for (int i = 0; i < static_cast<int>(Subsys::Count); ++i) known |= name == subsys_name(static_cast<Subsys>(i));
      any_known |= known;
      if (!known && !name.empty()) {
        std::string names;
        for (int i = 0; i < static_cast<int>(Subsys::Count); ++i)
          names += std::string(subsys_name(static_cast<Subsys>(i))) + ", ";
        std::fprintf(stderr, "chorus: CHORUS_DEBUG_SUBSYS: unknown subsystem '%s' ignored (known: %sALL)\n",
                     name.c_str(), names.c_str());
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    // A list of unknown names only would silence every subsystem: it is ignored as a whole.
    if (!any_known) {
      subs = "ALL";
      exclude = false;
    }
    for (int i = 0; i < static_cast<int>(Subsys::Count); ++i) {
      std::string name = subsys_name(static_cast<Subsys>(i));
      bool listed = subs == "ALL" || ("," + subs + ",").find("," + name + ",") != std::string::npos;
      s->subsys_on[i] = exclude ? !listed : listed;
    }
    std::string file = param_str(Param::DebugFile);
    if (!file.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      std::string path;
      for (size_t i = 0; i < file.size(); ++i) {
        if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') {
          path += host;
          ++i;
        } else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') {
          path += std::to_string(getpid());
          ++i;
        } else
          path += file[i];
      }
      if (FILE* f = std::fopen(path.c_str(), "a")) {
        s->out = f;
      } else {
        std::fprintf(stderr, "chorus: CHORUS_DEBUG_FILE='%s': cannot open (%s); logging to stderr\n", path.c_str(),
                     std::strerror(errno));
      }
    }
    return s;
  }();
  return *st;
}

}  // namespace

bool log_enabled(LogLevel level, Subsys subsys) {
  LogState& s = state();
  // Warnings are always shown (a peer's failure, a misspelt setting); the subsystems choose among the rest.
  return level <= s.level && (level == LogLevel::Warn || s.subsys_on[static_cast<int>(subsys)]);
}

void log_write(LogLevel level, Subsys subsys, const char* fmt, ...) {
  LogState& s = state();
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  static const char* kLevel[] = {"", "WARN", "INFO", "TRACE"};
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(s.mu);
  std::fprintf(s.out, "[%.6f] chorus %d %s %s: %s\n", t, static_cast<int>(getpid()), kLevel[static_cast<int>(level)],
               subsys_name(subsys), msg);
  std::fflush(s.out);
}

}  // namespace chorus
