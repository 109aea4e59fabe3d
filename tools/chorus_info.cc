// chorus-info: what this build of Chorus has: version, every CHORUS_* variable (name, type, default, current
// value, doc) from the config registry, the transports in priority order, and the algorithm table.
#include <chorus/chorus.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "transports/transport.h"

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("usage: chorus-info\nPrints the version, configuration variables, transports and algorithms.\n");
    return 0;
  }
  int version = 0;
  chorusGetVersion(&version);
  std::printf("Chorus %d.%d.%d\n\n", version / 10000, version / 100 % 100, version % 100);

  std::printf("Configuration (environment variables):\n");
  for (const chorus::ParamInfo& p : chorus::params()) {
    const char* v = std::getenv(p.name);
    std::printf("  %-22s %-6s default %-14s%s\n", p.name, p.type, *p.fallback ? p.fallback : "(none)",
                v ? (std::string("  set: ") + v).c_str() : "");
    std::printf("      %s\n", p.doc);
  }

  std::printf("\nTransports (default priority order; the first that can reach a peer is used):\n");
  for (const std::string& t : chorus::transport_names()) {
    const char* what = t == "local" ? "ranks that are threads of one process: slot FIFOs in process memory"
                       : t == "shm" ? "processes on one host: slot FIFOs in POSIX shared memory (mode 0600)"
                       : t == "tcp" ? "any reachable rank: non-blocking sockets, authenticated by the job secret"
                                    : "";
    std::printf("  %-6s %s\n", t.c_str(), what);
  }

  std::printf("\nAlgorithms:\n");
  for (const chorus::algo::AlgorithmInfo& a : chorus::algo::algorithm_table())
    std::printf("  %2d  %-14s %-9s %s\n", a.id, chorus::algo::coll_name(a.coll), a.name, a.description);
  return 0;
}
