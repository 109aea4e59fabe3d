// chorus-plan: explains the selector's choice (DESIGN.md, "One collective, end to end", step 3). For each size of
// a sweep it prints every candidate algorithm's predicted time with its algorithm and bus bandwidth (nccl-tests
// definitions) and the algorithm the selector picks, from a topology file (or a synthetic cluster), the tuning
// file, CHORUS_ALGO and the program-shaping settings (CHORUS_NCHANNELS, CHORUS_SLICE_BYTES, CHORUS_FIFO_DEPTH).
#include <chorus/chorus.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/selector.h"
#include "algorithms/simulator.h"
#include "algorithms/verifier.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "topology/topology.h"

namespace {

using namespace chorus;
using namespace chorus::algo;

// Programs hold every rank's steps (O(N^2) for ring and one-shot): 8192 ranks already take gigabytes.
constexpr int kMaxPlanRanks = 8192;
// More sizes than a table can show (a --step just above 1).
constexpr size_t kMaxPlanSizes = 10000;

constexpr const char* kUsage =
    "usage: chorus-plan --coll NAME --bytes LO[:HI] [options]\n"
    "Prints, per size, every candidate algorithm's predicted time (us), algorithm and bus bandwidth (GB/s, as\n"
    "nccl-tests defines them) and the algorithm the selector chooses.\n"
    "  --coll NAME        allreduce, allgather, reducescatter, broadcast, reduce, alltoall, alltoallv, barrier,\n"
    "                     gather, scatter\n"
    "  --bytes LO[:HI]    size or range in bytes as nccl-tests counts them (K, M, G suffixes: powers of 1024);\n"
    "                     not for a barrier\n"
    "  --step F           multiply the size by F from LO to HI (default 2)\n"
    "  --dtype NAME       element type (default float): int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                     bfloat16 f8e4m3 f8e5m2\n"
    "  --topo FILE        topology file (JSON, docs/topology.md); default CHORUS_TOPO_FILE, else a synthetic\n"
    "                     cluster of --nranks ranks on --hosts hosts\n"
    "  --nranks N         ranks of the synthetic cluster (default 8, at most 8192)\n"
    "  --hosts H          hosts of the synthetic cluster (default 1; N must be a multiple of H)\n"
    "  --net-gbps X       synthetic hosts' shared network egress/ingress, GB/s (default 0: unlimited)\n"
    "  --tune FILE        link costs measured by chorus-tune; default CHORUS_TUNE_FILE\n"
    "  --algo NAME        force an algorithm, as a per-call option would\n"
    "  --nchannels N      channels per program (default CHORUS_NCHANNELS)\n"
    "  --slice-bytes B    pipelining slice (default CHORUS_SLICE_BYTES)\n"
    "  --fifo-depth D     slots per connection (default CHORUS_FIFO_DEPTH)\n"
    "  --root R           root of broadcast, reduce, gather and scatter (default 0)\n"
    "  --why              print the reason of every choice\n"
    "  --choice-only      print only the choice and its prediction, deciding as the library does (candidates that\n"
    "                     the cost floors skip, or all but a named one, are not simulated): what a rank pays\n"
    "  --verify           also run the verifier on every chosen program (in place and out of place)\n"
    "CHORUS_ALGO (e.g. allreduce:0-64K:oneshot,64K-:ring) applies as it does in the library.\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "chorus-plan: %s\n(chorus-plan --help for usage)\n", what.c_str());
  std::exit(2);
}

int64_t parse_int_flag(const char* flag, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi)
    usage_error(cat(flag, " '", text, "' is not an integer from ", lo, " to ", hi));
  return v;
}

uint64_t parse_size_flag(const char* flag, const std::string& text) {
  try {
    return static_cast<uint64_t>(parse_size(text, flag));
  } catch (const Error& e) {
    usage_error(e.what());
  }
}

double bus_factor(Coll coll, int n) {
  switch (coll) {
    case Coll::AllReduce: return n > 0 ? 2.0 * (n - 1) / n : 0;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll:
    case Coll::AllToAllv:
    case Coll::Gather:
    case Coll::Scatter: return n > 0 ? static_cast<double>(n - 1) / n : 0;
    default: return 1;
  }
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.4g %s", v, units[u]);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string coll_text, bytes_text, dtype_text = "float", topo_file, tune_file, algo;
  double step = 2;
  std::string step_text = "2";
  int64_t nranks = 8, hosts = 1, nchannels = -1, fifo_depth = -1, root = 0;
  int64_t slice_bytes = -1;
  double net_gbps = 0;
  bool verify_programs = false, why = false, choice_only = false;
  bool topo_given = false, tune_given = false, synthetic_given = false;

  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--verify") {
      verify_programs = true;
      continue;
    }
    if (a == "--why") {
      why = true;
      continue;
    }
    if (a == "--choice-only") {
      choice_only = true;
      continue;
    }
    std::string flag = a, value;
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) flag = a.substr(0, eq);
    static const char* const kValueFlags[] = {"--coll",      "--bytes",       "--step",       "--dtype",    "--topo",
                                              "--tune",      "--nranks",      "--hosts",      "--net-gbps", "--algo",
                                              "--nchannels", "--slice-bytes", "--fifo-depth", "--root"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), flag) == std::end(kValueFlags))
      usage_error(cat("unknown option '", a, "'"));
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= argc) usage_error(cat(a, " needs a value"));
      value = argv[++i];
    }
    const char* f = flag.c_str();
    if (flag == "--coll") {
      coll_text = value;
    } else if (flag == "--bytes") {
      bytes_text = value;
    } else if (flag == "--step") {
      char* end = nullptr;
      step = std::strtod(value.c_str(), &end);
      step_text = value;
      if (value.empty() || *end != '\0' || !(step > 1)) usage_error(cat("--step '", value, "' must be a number > 1"));
    } else if (flag == "--dtype") {
      dtype_text = value;
    } else if (flag == "--topo") {
      topo_file = value;
      topo_given = true;
    } else if (flag == "--tune") {
      tune_file = value;
      tune_given = true;
    } else if (flag == "--nranks") {
      nranks = parse_int_flag(f, value, 1, kMaxPlanRanks);
      synthetic_given = true;
    } else if (flag == "--hosts") {
      hosts = parse_int_flag(f, value, 1, 1 << 20);
      synthetic_given = true;
    } else if (flag == "--net-gbps") {
      synthetic_given = true;
      char* end = nullptr;
      net_gbps = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(net_gbps >= 0) || !std::isfinite(net_gbps * 1e9))
        usage_error(cat("--net-gbps '", value, "' must be a finite number >= 0"));
    } else if (flag == "--algo") {
      algo = value;
    } else if (flag == "--nchannels") {
      nchannels = parse_int_flag(f, value, 1, 32);  // as CHORUS_NCHANNELS
    } else if (flag == "--slice-bytes") {
      slice_bytes = static_cast<int64_t>(parse_size_flag(f, value));
      if (slice_bytes < 64 || slice_bytes > (int64_t{1} << 30))
        usage_error("--slice-bytes must be between 64 and 1G (as CHORUS_SLICE_BYTES)");
    } else if (flag == "--fifo-depth") {
      fifo_depth = parse_int_flag(f, value, 2, 64);
      if ((fifo_depth & (fifo_depth - 1)) != 0)
        usage_error(cat("--fifo-depth ", fifo_depth, " must be a power of two (as CHORUS_FIFO_DEPTH)"));
    } else if (flag == "--root") {
      root = parse_int_flag(f, value, 0, 1 << 20);
    }
  }

  // Collective, dtype and sizes.
  if (coll_text.empty()) usage_error("--coll is required");
  Coll coll = Coll::Count;
  std::string coll_names;
  for (Coll c : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce, Coll::AllToAll,
                 Coll::AllToAllv, Coll::Barrier, Coll::Gather, Coll::Scatter}) {
    if (!coll_names.empty()) coll_names += ", ";
    coll_names += coll_spec_name(c);
    if (coll_text == coll_spec_name(c)) coll = c;
  }
  if (coll == Coll::Count) usage_error(cat("--coll '", coll_text, "' is not a collective (known: ", coll_names, ")"));
  int dtype = -1;
  std::string dtype_names;
  for (int d = 0; d < chorusNumTypes; ++d) {
    const char* name = dtype_name(static_cast<chorusDataType_t>(d));
    if (!dtype_names.empty()) dtype_names += ' ';
    dtype_names += name;
    if (dtype_text == name) dtype = d;
  }
  if (dtype < 0) usage_error(cat("--dtype '", dtype_text, "' is not a type (known: ", dtype_names, ")"));
  const size_t esz = dtype_size(static_cast<chorusDataType_t>(dtype));
  if (coll == Coll::Barrier) {
    if (!bytes_text.empty() && bytes_text != "0") usage_error("--bytes: a barrier moves no data (leave it out)");
    bytes_text.assign(1, '0');
  }
  if (bytes_text.empty()) usage_error("--bytes is required (e.g. --bytes 1K:1G)");
  const size_t colon = bytes_text.find(':');
  const uint64_t lo = parse_size_flag("--bytes", bytes_text.substr(0, colon));
  const uint64_t hi = colon == std::string::npos ? lo : parse_size_flag("--bytes", bytes_text.substr(colon + 1));
  if (hi < lo) usage_error(cat("--bytes '", bytes_text, "': the upper size is below the lower one"));
  // The sizes from LO (from 1 when LO is 0) to HI, before any count repeats: a step just above 1 gives more than a
  // table can show, and would take hours to walk.
  if (const double steps =
          std::log(static_cast<double>(std::max<uint64_t>(hi, 1)) / static_cast<double>(std::max<uint64_t>(lo, 1))) /
          std::log(step);
      steps > static_cast<double>(kMaxPlanSizes))
    usage_error(cat("--bytes ", bytes_text, " with --step ", step_text, " gives more than ", kMaxPlanSizes,
                    " sizes (take a larger --step)"));

  try {
    warn_unknown_settings_once();
    // Topology: file, else CHORUS_TOPO_FILE, else synthetic.
    if (!topo_given && param_is_set(Param::TopoFile)) topo_file = param_str(Param::TopoFile);
    if (!tune_given && param_is_set(Param::TuneFile)) tune_file = param_str(Param::TuneFile);
    topo::Topology topology;
    std::string topo_what;
    if (!topo_file.empty()) {
      if (synthetic_given)
        usage_error(cat("--nranks, --hosts and --net-gbps describe a synthetic cluster; the topology comes from ",
                        topo_given ? "--topo" : "CHORUS_TOPO_FILE", " here"));
      try {
        topology = topo::load_file(topo_file);
      } catch (const Error& e) {
        usage_error(cat(topo_given ? "--topo" : "CHORUS_TOPO_FILE", ": ", e.what()));
      }
      // As --nranks: programs hold every rank's steps, and past 8192 ranks they take more memory than a host has.
      if (topology.nranks() > kMaxPlanRanks)
        usage_error(cat(topo_given ? "--topo" : "CHORUS_TOPO_FILE", ": ", topo_file, " has ", topology.nranks(),
                        " ranks; chorus-plan plans at most ", kMaxPlanRanks));
      topo_what = topo_file;
    } else {
      if (nranks % hosts != 0) usage_error(cat("--nranks ", nranks, " is not a multiple of --hosts ", hosts));
      topology = topo::make_cluster(std::vector<int>(static_cast<size_t>(hosts), static_cast<int>(nranks / hosts)),
                                    net_gbps * 1e9);
      topo_what = cat("synthetic, ", hosts, " host(s) x ", nranks / hosts, " ranks");
    }
    if (!tune_file.empty()) {
      try {
        topo::apply_tune_file(topology, tune_file);
      } catch (const Error& e) {
        usage_error(cat(tune_given ? "--tune" : "CHORUS_TUNE_FILE", ": ", e.what()));
      }
    }
    const int n = topology.nranks();
    if (rooted(coll) && root >= n) usage_error(cat("--root ", root, " is out of range for ", n, " ranks"));

    SimOptions sim;
    // The environment's settings, checked as a communicator checks them (a flag given instead is checked above):
    // a bad one is a usage error, as a bad flag.
    int nch = 0;
    try {
      sim.slice_bytes = slice_bytes > 0 ? static_cast<size_t>(slice_bytes) : slice_bytes_setting();
      sim.fifo_depth = fifo_depth > 0 ? static_cast<int>(fifo_depth) : fifo_depth_setting();
      nch = nchannels > 0 ? static_cast<int>(nchannels) : nchannels_setting();
    } catch (const Error& e) {
      usage_error(e.what());
    }
    AlgoOverrides overrides;
    const char* spec = std::getenv("CHORUS_ALGO");
    // The data type the selector sees: with CHORUS_FP32_PARTIALS=1 a narrow-float reduction runs as a float32 call
    // on widened copies (chorus-plan plans a sum), and the selector and CHORUS_ALGO's size ranges see its bytes.
    size_t sel_esz = esz;
    bool widened = false;
    try {
      if (spec && *spec) overrides = parse_algo_overrides(spec);
      if (switch_setting(Param::Deterministic)) add_deterministic_rules(overrides);
      widened = switch_setting(Param::Fp32Partials) &&
                (coll == Coll::AllReduce || coll == Coll::ReduceScatter || coll == Coll::Reduce) &&
                dtype_is_narrow_float(static_cast<chorusDataType_t>(dtype));
      if (widened) sel_esz = dtype_size(chorusFloat32);
    } catch (const Error& e) {
      usage_error(e.what());
    }
    if (!algo.empty() && find_algorithm(coll, algo) == nullptr)
      usage_error(
          cat("--algo '", algo, "' is not an algorithm of ", coll_text, " (known: ", algorithm_names(coll), ")"));
    Selector selector(topology, sim, nch, overrides);

    std::printf("# chorus-plan: %s, %s, %d ranks on %d host(s), %d channel(s), slice %s, fifo depth %d\n",
                coll_name(coll), dtype_text.c_str(), n, topology.nhosts(), nch, human_bytes(sim.slice_bytes).c_str(),
                sim.fifo_depth);
    std::printf("# topology: %s%s%s\n", topo_what.c_str(), tune_file.empty() ? "" : ", tuning ", tune_file.c_str());
    if (widened)
      std::printf(
          "# CHORUS_FP32_PARTIALS=1: %s runs as a float32 call on widened copies; the choice is the float32 "
          "call's\n",
          dtype_text.c_str());
    if (spec && *spec) std::printf("# CHORUS_ALGO=%s\n", spec);
    if (!algo.empty()) std::printf("# --algo %s\n", algo.c_str());

    // Sizes: nccl-tests style, count = bytes / (elem * blocks per call), repeated counts skipped.
    const uint64_t per_count = selection_bytes(coll, 1, esz, n);
    std::vector<size_t> counts;
    for (double b = static_cast<double>(lo);; b *= step) {
      const auto bytes = static_cast<uint64_t>(b);
      if (bytes > hi) break;
      const size_t count = static_cast<size_t>(bytes / per_count);
      if (counts.empty() || counts.back() != count) counts.push_back(count);
      if (b == 0) b = 1;
    }

    std::vector<const AlgorithmInfo*> algos;
    for (const AlgorithmInfo& a : algorithm_table())
      if (a.coll == coll) algos.push_back(&a);
    std::printf("#\n# %12s %12s", "size(B)", "count");
    if (choice_only) {
      std::printf(" | %-28s | choice\n# %12s %12s | %10s %8s %8s |\n", "chosen", "", "(elements)", "time(us)", "algbw",
                  "busbw");
    } else {
      for (const AlgorithmInfo* a : algos) std::printf(" | %-28s", a->name);
      std::printf(" | choice\n# %12s %12s", "", "(elements)");
      for (size_t i = 0; i < algos.size(); ++i) std::printf(" | %10s %8s %8s", "time(us)", "algbw", "busbw");
      std::printf(" |\n");
    }

    std::map<std::string, std::shared_ptr<const Program>> chosen_programs;
    std::vector<std::string> notes;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t count : counts) {
      const auto choice =
          selector.choose(coll, count, sel_esz, static_cast<int>(root), algo.empty() ? nullptr : algo.c_str());
      const uint64_t bytes = selection_bytes(coll, count, esz, n);
      std::printf("  %12llu %12zu", static_cast<unsigned long long>(bytes), count);
      // --choice-only: the chosen program's prediction at the count the selector decided at (named: none).
      std::vector<Candidate> candidates;
      if (choice_only)
        candidates.push_back(Candidate{choice->algorithm, !std::isnan(choice->predicted_s), choice->predicted_s,
                                       "was named: generated, not simulated"});
      // The choice holds every candidate at this exact count only when the cost model decided at this count.
      else if (choice->reason == ChoiceReason::CostModel && choice->count == count)
        candidates = choice->candidates;
      else
        candidates = selector.evaluate(coll, count, sel_esz, static_cast<int>(root));
      for (const Candidate& c : candidates) {
        if (!c.applicable) {  // with --choice-only, only a named algorithm: it has no prediction
          std::printf(" | %10s %8s %8s", choice_only ? "named" : "n/a", "", "");
          const std::string note = cat("# ", c.algorithm->name, " ", c.note);
          if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
          continue;
        }
        const double algbw = c.predicted_s > 0 ? static_cast<double>(bytes) / c.predicted_s / 1e9 : 0;
        std::printf(" | %10.2f %8.2f %8.2f", c.predicted_s * 1e6, algbw, algbw * bus_factor(coll, n));
      }
      std::printf(" | %s (%s)\n", choice->algorithm->name, choice_reason_name(choice->reason));
      if (why)
        std::printf("#   counts %zu-%zu: %s\n", decision_count_low(choice->count), choice->count, choice->why.c_str());
      chosen_programs.emplace(choice->algorithm->name, choice->program);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (const std::string& note : notes) std::printf("%s\n", note.c_str());
    if (choice_only)
      std::printf("# %zu size(s) decided in %.1f ms\n", counts.size(), ms);
    else
      std::printf("# %zu size(s) x %zu candidate(s) predicted in %.1f ms\n", counts.size(), algos.size(), ms);

    int failures = 0;
    if (verify_programs) {
      for (const auto& [name, prog] : chosen_programs) {
        for (bool in_place : {false, true}) {
          if (in_place && !has_in_place_form(coll)) continue;
          VerifyResult v = verify(*prog, {in_place, sim.fifo_depth});
          std::printf("# verify %s (%s): %s", name.c_str(), in_place ? "in place" : "out of place",
                      v.ok ? "ok" : "FAILED");
          if (v.ok)
            std::printf(
                ", %lld messages%s\n", static_cast<long long>(v.messages),
                v.lanes_ordered ? "" : " (the order of lanes that share chunks was not checked: too many lanes)");
          else
            std::printf(": %s\n", v.error.c_str());
          failures += v.ok ? 0 : 1;
        }
      }
    }
    return failures == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "chorus-plan: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "chorus-plan: out of memory (programs hold every rank's steps: plan fewer ranks)\n");
    return 1;
  }
}
