// chorus-info: what this build of Chorus has: version, every CHORUS_* variable (name, type, default, current
// value, doc) from the config registry, the transports in priority order with what each finds on this machine
// (UCX's version and transports, RDMA devices or why there are none), and the algorithm table.
// `chorus-info --topology [--json] [-n N]`: the topology instead (this host discovered with hwloc, or
// CHORUS_TOPO_FILE), with CHORUS_TUNE_FILE applied. `chorus-info --transport NAME`: what one transport finds here;
// exit status 0 when it can run, 3 when it cannot (for scripts such as scripts/rdma-check.sh).
#include <chorus/chorus.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "core/error.h"
#include "topology/topology.h"
#include "transports/transport.h"

namespace {

const char* const kUsage =
    "usage: chorus-info [--topology [--json] [-n N]] [--transport NAME]\n"
    "  (no option)  the version, configuration variables, transports and algorithms\n"
    "  --topology   the topology: CHORUS_TOPO_FILE when set, else this host as hwloc sees it, with N ranks\n"
    "               (-n; default one per GPU, or 1); link costs from CHORUS_TUNE_FILE when set\n"
    "  --json       print the topology as a topology file (docs/topology.md) instead of a summary\n"
    "  --transport NAME\n"
    "               what transport NAME (ucx, ibverbs, ...) finds here; exit status 0 when it can run, 3 when not\n";

int print_topology(bool json, int nranks) {
  try {
    using namespace chorus;
    topo::Topology t;
    if (param_is_set(Param::TopoFile)) {
      t = topo::load_file(param_str(Param::TopoFile));
    } else {
      topo::Host host = topo::discover_host();
      const int n = nranks > 0 ? nranks : std::max<int>(1, static_cast<int>(host.gpus.size()));
      t = topo::place_ranks({host}, {n});
    }
    if (param_is_set(Param::TuneFile)) topo::apply_tune_file(t, param_str(Param::TuneFile));
    std::fputs(json ? topo::to_json(t).c_str() : topo::describe(t).c_str(), stdout);
    return 0;
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus-info: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool topology = false, json = false;
  int nranks = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--topology") {
      topology = true;
    } else if ((a == "--transport" || a == "-n") && i + 1 == argc) {
      std::fprintf(stderr, "chorus-info: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    } else if (a == "--transport") {
      const std::string name = argv[++i];
      const auto names = chorus::transport_names();
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        std::fprintf(stderr, "chorus-info: unknown transport '%s'\n%s", name.c_str(), kUsage);
        return 2;
      }
      const chorus::TransportReport r = chorus::report_transport(name);
      std::printf("%s: %s\n", r.name.c_str(), r.found.c_str());
      return r.available ? 0 : 3;
    } else if (a == "--json") {
      json = true;
    } else if (a == "-n") {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 1 << 20) {
        std::fprintf(stderr, "chorus-info: -n '%s' is not a rank count (1..1048576)\n%s", argv[i], kUsage);
        return 2;
      }
      nranks = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "chorus-info: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if ((json || nranks > 0) && !topology) {
    std::fprintf(stderr, "chorus-info: --json and -n go with --topology\n%s", kUsage);
    return 2;
  }
  if (topology) return print_topology(json, nranks);
  int version = 0;
  chorusGetVersion(&version);
  std::printf("Chorus %d.%d.%d\n\n", version / 10000, version / 100 % 100, version % 100);

  std::printf("Configuration (environment variables):\n");
  for (const chorus::ParamInfo& p : chorus::params()) {
    const char* v = std::getenv(p.name);
    // The secret authenticates every connection of a job: whether it is set, never its value.
    const std::string shown = v == nullptr ? "" : p.id == chorus::Param::Secret ? "  set" : std::string("  set: ") + v;
    std::printf("  %-22s %-6s default %-14s%s\n", p.name, p.type, *p.fallback ? p.fallback : "(none)", shown.c_str());
    std::printf("      %s\n", p.doc);
  }
  for (const chorus::UnknownSetting& u : chorus::unknown_settings())
    std::printf("  %-22s set but not a setting: ignored%s\n", u.name.c_str(), u.suggestion(" (", ")").c_str());

  std::printf(
      "\nTransports (priority order; CHORUS_TRANSPORTS lists those used, and for each peer the first that "
      "can reach it is used):\n");
  for (const std::string& t : chorus::transport_names()) {
    const chorus::TransportReport r = chorus::report_transport(t);
    std::printf("  %-8s %s\n", r.name.c_str(), r.description.c_str());
    std::printf("           found: %s\n", r.found.c_str());
  }

  std::printf("\nAlgorithms:\n");
  for (const chorus::algo::AlgorithmInfo& a : chorus::algo::algorithm_table())
    std::printf("  %2d  %-14s %-9s %s\n", a.id, chorus::algo::coll_name(a.coll), a.name, a.description);
  std::printf(
      "\nCompressed schedules (chorusCollOptions_t::compression; codecs int8, fp8_e4m3, int4, sign1, "
      "sign_vote):\n");
  for (const chorus::algo::AlgorithmInfo& a : chorus::algo::compressed_algorithm_table())
    std::printf("  %2d  %-14s %-10s %s\n", a.id, chorus::algo::coll_name(a.coll), a.name, a.description);
  return 0;
}
