// chorus-tune: measures the cost parameters the simulator uses on the machines a job runs on and writes a tuning
// file (docs/topology.md, "chorus-tune") that CHORUS_TUNE_FILE and `chorus-plan --tune` apply.
//
// It runs as an ordinary Chorus job (`chorusrun -n 4 --hosts 2 chorus-tune -o tune.json`, or any launcher whose
// environment chorusCommInitFromEnv reads; without one, a single rank that measures only the reduce and copy rates).
//  1. Every rank's host identity (topo::host_identity()) and a random per-process token are all-gathered, and every
//     pair of ranks is classified by link class as the communicator does (NUMA unknown: same_numa).
//  2. Per class present, the lowest pair (a, b) of that class ping-pongs messages of 8 B .. --max-bytes (powers of
//     4) while every other rank waits in a barrier, so the measurement is one flow. One-way time = the fastest round
//     trip / 2 (on a shared machine interference only adds time; the median is recorded too). Hockney's t(b) = alpha +
//     b / bandwidth: pair alpha = median one-way time of the sizes <= 1 KiB, bandwidth = 1 / the Theil-Sen slope
//     through the sizes >= max/64.
//  3. With several disjoint pairs of a class, they all ping-pong the largest size at once (a shared host NIC or
//     memory bus): reported, not written.
//  4. Rank 0 measures reduce_Bps (the library's CPU kernel, float32 sum a + b -> c) and copy_Bps (memcpy) on 4 MiB,
//     best of several runs.
//  5. Collectives see more than one flow does: with every rank running (and, on small machines, more ranks than
//     cores) each message also pays for the call, the executor and the scheduler. A ring all-reduce of nranks
//     floats on all ranks is timed, and one extra latency d for the dearest class present (network with several
//     hosts: its hops are what the scheduler delays most) is found (by bisection) with which the simulator predicts
//     that time (with the default per-message overhead o of each class, which this tool does not measure and writes
//     as it used it). The file's alpha is pair alpha (+ d for that class). A tree all-reduce of
//     the same size and a ring all-reduce of up to 1 MiB are timed too and predicted with the written values, as
//     a check that is printed and recorded.
// Rank 0 writes the file atomically (a temporary beside it, renamed over it) and prints a table.
#include <chorus/chorus.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "algorithms/algorithms.h"
#include "algorithms/simulator.h"
#include "core/config.h"
#include "core/error.h"
#include "kernels/cpu/reduce.h"
#include "topology/topology.h"

namespace {

using namespace chorus;
using Clock = std::chrono::steady_clock;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr size_t kSmallLimit = 1024;                   // pair alpha: sizes up to this
constexpr size_t kFullItersLimit = size_t{256} << 10;  // sizes up to this run --iters round trips
constexpr size_t kKernelBytes = size_t{4} << 20;       // reduce and copy measurements
constexpr int kKernelRuns = 10;
constexpr size_t kIdentityBytes = 256;  // token (8 bytes) + host identity, NUL-terminated

const char* const kUsage =
    "usage: chorus-tune -o FILE [--max-bytes SIZE] [--iters N]\n"
    "Measures link costs per link class (alpha, bandwidth), the reduction and copy rates, and writes a tuning\n"
    "file for CHORUS_TUNE_FILE / chorus-plan --tune. Run it as a Chorus job, e.g.\n"
    "  chorusrun -n 4 --hosts 2 chorus-tune -o tune.json\n"
    "  -o, --output FILE     the tuning file to write (by rank 0, atomically)\n"
    "      --max-bytes SIZE  largest ping-pong message (K, M, G suffixes; 4K..1G; default 64M); on a shaped\n"
    "                        link keep it well above the shaper's burst, or the bandwidth comes out too high\n"
    "      --iters N         round trips per size up to 256 KiB; above, fewer in proportion to the size, but\n"
    "                        at least 3 (or N, when N is below 3) (default 20)\n"
    "  -h, --help            this text\n";

struct Options {
  std::string output;
  size_t max_bytes = size_t{64} << 20;
  int iters = 20;
};

// Thrown on a failed Chorus call; main prints it and exits 1.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(chorusResult_t r, const char* call, chorusComm_t comm) {
  if (r == chorusSuccess) return;
  const char* detail = chorusGetLastError(comm);
  throw Failure(cat(call, " failed: ", chorusGetErrorString(r), detail && *detail ? cat(" (", detail, ")") : ""));
}

// -1: go on; else the exit code. Only `speak` prints (rank 0, so a job prints one message).
int parse_args(int argc, char** argv, Options* o, bool speak) {
  auto bad = [&](const std::string& what) {
    if (speak) std::fprintf(stderr, "chorus-tune: %s\n(chorus-tune --help for usage)\n", what.c_str());
    return kExitUsage;
  };
  bool have_output = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    bool inline_value = false;
    if (flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos) {
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
      inline_value = true;
    }
    if (flag == "-h" || flag == "--help") {
      if (speak) std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag != "-o" && flag != "--output" && flag != "--max-bytes" && flag != "--iters")
      return bad(cat("unknown flag '", argv[i], "'"));
    if (!inline_value) {
      if (i + 1 >= argc) return bad(cat(flag, " needs a value"));
      value = argv[++i];
    }
    if (flag == "-o" || flag == "--output") {
      if (value.empty()) return bad(cat(flag, " needs a file name"));
      o->output = value;
      have_output = true;
    } else if (flag == "--max-bytes") {
      int64_t v = -1;
      try {
        v = parse_size(value, "--max-bytes");
      } catch (const Error&) {
      }
      if (v < 4096 || v > (int64_t{1} << 30))
        return bad(cat("--max-bytes '", value, "' is not a size from 4K to 1G (e.g. 64M)"));
      o->max_bytes = static_cast<size_t>(v);
    } else {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1000000)
        return bad(cat("--iters '", value, "' is not an integer from 1 to 1000000"));
      o->iters = static_cast<int>(v);
    }
  }
  if (!have_output) return bad("-o/--output FILE is required");
  return -1;
}

// A launcher gave this process a rank (chorusrun always; the others when they started more than one process).
bool launched(int* rank) {
  if (const char* r = std::getenv("CHORUS_RANK")) {
    *rank = std::atoi(r);
    return true;
  }
  static const std::pair<const char*, const char*> kVars[] = {{"RANK", "WORLD_SIZE"},
                                                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                                              {"SLURM_PROCID", "SLURM_NTASKS"},
                                                              {"PMI_RANK", "PMI_SIZE"}};
  for (const auto& [rank_var, size_var] : kVars) {
    const char* r = std::getenv(rank_var);
    const char* s = std::getenv(size_var);
    if (r != nullptr && s != nullptr && std::atoi(s) > 1) {
      *rank = std::atoi(r);
      return true;
    }
  }
  return false;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// x rounded to `digits` significant digits (file and table readability; measurements are not more precise).
double round_sig(double x, int digits) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double p = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
  return std::round(x * p) / p;
}

std::string human_bytes(size_t b) {
  if (b >= (size_t{1} << 30) && b % (size_t{1} << 30) == 0) return cat(b >> 30, " GiB");
  if (b >= (size_t{1} << 20) && b % (size_t{1} << 20) == 0) return cat(b >> 20, " MiB");
  if (b >= (size_t{1} << 10) && b % (size_t{1} << 10) == 0) return cat(b >> 10, " KiB");
  return cat(b, " B");
}

// 8 B, 32 B, ... (powers of 4) up to max, and max itself.
std::vector<size_t> sweep_sizes(size_t max) {
  std::vector<size_t> s;
  for (size_t b = 8; b <= max; b *= 4) s.push_back(b);
  if (s.back() != max) s.push_back(max);
  return s;
}

// Round trips at `bytes`: --iters up to 256 KiB, then proportionally fewer (at least 3, or --iters if below), so that a
// 64 MiB message over a 1 Gbit/s link takes seconds, not minutes.
int iters_at(size_t bytes, int iters) {
  if (bytes <= kFullItersLimit) return iters;
  const double scaled = static_cast<double>(iters) * static_cast<double>(kFullItersLimit) / static_cast<double>(bytes);
  return std::min(iters, std::max(3, static_cast<int>(std::ceil(scaled))));
}

struct Fit {
  double alpha_s = 0;
  double bandwidth_Bps = 0;
};

// Hockney's t(b) = alpha + b / bandwidth from one-way times: alpha from the small sizes (median of those <= 1 KiB),
// bandwidth from the large ones (1 / the Theil-Sen slope through the sizes >= max/64), so neither
// end's noise leaks into the other parameter.
Fit fit_hockney(const std::vector<size_t>& sizes, const std::vector<double>& t) {
  Fit f;
  std::vector<double> small;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] <= kSmallLimit) small.push_back(t[i]);
  f.alpha_s = median(small);
  const size_t max = sizes.back();
  std::vector<std::pair<double, double>> large;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] >= max / 64 && sizes[i] > kSmallLimit) large.emplace_back(static_cast<double>(sizes[i]), t[i]);
  // Theil-Sen: the median of the slopes between every two points, so one disturbed size does not tilt the line.
  std::vector<double> slopes;
  for (size_t i = 0; i < large.size(); ++i)
    for (size_t j = i + 1; j < large.size(); ++j)
      slopes.push_back((large[j].second - large[i].second) / (large[j].first - large[i].first));
  const double slope = median(slopes);
  if (slope > 0) {
    f.bandwidth_Bps = 1 / slope;
  } else {  // noise flattened the line: the largest size alone
    const double tb = t.back() > f.alpha_s ? t.back() - f.alpha_s : t.back();
    f.bandwidth_Bps = static_cast<double>(max) / std::max(tb, 1e-9);
  }
  return f;
}

// One rank's view of the job.
class Job {
 public:
  explicit Job(chorusComm_t comm) : comm_(comm) {
    check(chorusCommUserRank(comm, &rank_), "chorusCommUserRank", comm);
    check(chorusCommCount(comm, &nranks_), "chorusCommCount", comm);
  }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  chorusComm_t comm() const { return comm_; }

  void barrier() { check(chorusBarrier(comm_, nullptr), "chorusBarrier", comm_); }
  void broadcast(void* buf, size_t count, chorusDataType_t dtype, int root) {
    check(chorusBroadcast(buf, buf, count, dtype, root, comm_, nullptr), "chorusBroadcast", comm_);
  }
  void all_gather(const void* mine, void* all, size_t count, chorusDataType_t dtype) {
    check(chorusAllGather(mine, all, count, dtype, comm_, nullptr), "chorusAllGather", comm_);
  }
  double max_over_ranks(double v) {
    check(chorusAllReduce(&v, &v, 1, chorusFloat64, chorusMax, comm_, nullptr), "chorusAllReduce", comm_);
    return v;
  }
  void send(const void* buf, size_t bytes, int peer) {
    check(chorusSend(buf, bytes, chorusUint8, peer, comm_, nullptr), "chorusSend", comm_);
  }
  void recv(void* buf, size_t bytes, int peer) {
    check(chorusRecv(buf, bytes, chorusUint8, peer, comm_, nullptr), "chorusRecv", comm_);
  }

 private:
  chorusComm_t comm_;
  int rank_ = 0;
  int nranks_ = 1;
};

// Every rank's host identity and process token, all-gathered; the topology built from them as the communicator
// builds its own (hosts in order of their first rank, processes of a host in order of their first rank; no NUMA
// binding known, no GPU).
topo::Topology gather_topology(Job& job) {
  std::array<char, kIdentityBytes> mine{};
  std::random_device rd;
  const uint64_t token = (static_cast<uint64_t>(rd()) << 32 | rd()) ^ static_cast<uint64_t>(getpid());
  std::memcpy(mine.data(), &token, sizeof token);
  std::string id = topo::host_identity();
  if (id.size() >= kIdentityBytes - sizeof token) {  // keep equality, not the text
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
    id = cat(id.substr(0, id.find('/')).substr(0, 64), "/fnv1a:", h);
  }
  std::memcpy(mine.data() + sizeof token, id.data(), id.size());
  std::vector<char> all(kIdentityBytes * static_cast<size_t>(job.nranks()));
  job.all_gather(mine.data(), all.data(), kIdentityBytes, chorusUint8);

  topo::Topology t;
  std::vector<std::string> host_ids;
  std::vector<std::vector<uint64_t>> procs;  // per host: tokens in order of first rank
  for (int r = 0; r < job.nranks(); ++r) {
    const char* rec = all.data() + kIdentityBytes * static_cast<size_t>(r);
    uint64_t tok = 0;
    std::memcpy(&tok, rec, sizeof tok);
    const std::string hid(rec + sizeof tok, strnlen(rec + sizeof tok, kIdentityBytes - sizeof tok));
    auto it = std::find(host_ids.begin(), host_ids.end(), hid);
    const int host = static_cast<int>(it - host_ids.begin());
    if (it == host_ids.end()) {
      host_ids.push_back(hid);
      procs.emplace_back();
      topo::Host h;
      h.id = hid;
      const size_t slash = hid.find('/'), ns = hid.rfind("netns:");
      h.name = hid.substr(0, slash);
      if (ns != std::string::npos) h.name += cat(" (netns ", hid.substr(ns + 6), ")");
      t.hosts.push_back(h);
    }
    std::vector<uint64_t>& p = procs[static_cast<size_t>(host)];
    auto pit = std::find(p.begin(), p.end(), tok);
    topo::RankPlace place;
    place.host = host;
    place.local_rank = static_cast<int>(t.ranks_of_host(host).size());
    place.process = static_cast<int>(pit - p.begin());
    if (pit == p.end()) p.push_back(tok);
    t.ranks.push_back(place);
  }
  topo::apply_default_costs(t);
  t.validate();
  return t;
}

// Ping-pong of `bytes` between every pair (a, b) at once: a sends then receives, b receives then sends; one warm-up
// round trip, then n timed. Returns this rank's round-trip times when it is some pair's a, else nothing. Ranks in
// no pair return at once (the caller's barrier is where they wait).
std::vector<double> ping_pong(Job& job, const std::vector<std::pair<int, int>>& pairs, size_t bytes, int n,
                              std::vector<char>& sbuf, std::vector<char>& rbuf) {
  std::vector<double> rt;
  for (const auto& [a, b] : pairs) {
    if (job.rank() == a) {
      for (int i = -1; i < n; ++i) {
        const auto t0 = Clock::now();
        job.send(sbuf.data(), bytes, b);
        job.recv(rbuf.data(), bytes, b);
        if (i >= 0) rt.push_back(seconds_since(t0));
      }
    } else if (job.rank() == b) {
      for (int i = -1; i < n; ++i) {
        job.recv(rbuf.data(), bytes, a);
        job.send(sbuf.data(), bytes, a);
      }
    }
  }
  return rt;
}

struct ClassResult {
  topo::LinkClass cls{};
  std::pair<int, int> pair{};
  std::vector<double> one_way_s;         // per sweep size: the fastest of the round trips / 2
  std::vector<double> one_way_median_s;  // per sweep size: the median round trip / 2
  Fit fit;
  double alpha_s = 0;  // written: pair alpha + the collective surcharge
  // All disjoint pairs of the class at once, largest size (when there are at least two such pairs).
  int concurrent_pairs = 0;
  double concurrent_one_way_s = 0;  // median over the pairs of their fastest one-way time
};

// One kind of call timed with every rank running: a barrier (algorithm nullptr) or an all-reduce of `count`
// floats with `algorithm`.
struct Timed {
  const char* algorithm = nullptr;
  size_t count = 0;
  double measured_s = 0;        // median over rounds of the rank-averaged time per call
  double predicted_s = 0;       // simulated with the written values
  double predicted_pair_s = 0;  // simulated with the pair alphas (no surcharge)
};

// Times `rounds` calls of each kind, interleaved (round r runs every kind once), so that load that comes and goes
// on a shared machine touches every kind alike. Each round times a batch of back-to-back calls after a barrier and
// averages over the ranks, as the perf tools do;
// the result is the median over rounds. Two untimed rounds first.
void time_calls(Job& job, std::vector<Timed>& kinds, int rounds) {
  size_t max_count = 1;
  for (const Timed& k : kinds) max_count = std::max(max_count, k.count);
  std::vector<float> in(max_count, 1.0f), out(max_count);
  std::vector<std::vector<double>> t(kinds.size(), std::vector<double>(static_cast<size_t>(rounds)));
  for (int r = -2; r < rounds; ++r) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      chorusCollOptions_t opts = CHORUS_COLL_OPTIONS_INIT;
      opts.algorithm = kinds[k].algorithm;
      // Back-to-back calls, timed on every rank and averaged over the ranks: what the perf tools report (a lone
      // call started from a barrier also pays for the barrier's release skew).
      const int batch = kinds[k].count * sizeof(float) <= (size_t{64} << 10) ? 20 : 2;
      job.barrier();
      const auto t0 = Clock::now();
      for (int b = 0; b < batch; ++b) {
        if (kinds[k].algorithm == nullptr)
          job.barrier();
        else
          check(chorusAllReduceEx(in.data(), out.data(), kinds[k].count, chorusFloat32, chorusSum, &opts, job.comm(),
                                  nullptr),
                "chorusAllReduceEx", job.comm());
      }
      if (r >= 0) t[k][static_cast<size_t>(r)] = seconds_since(t0) / batch;
    }
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    check(chorusAllReduce(t[k].data(), t[k].data(), t[k].size(), chorusFloat64, chorusSum, job.comm(), nullptr),
          "chorusAllReduce", job.comm());
    for (double& v : t[k]) v /= job.nranks();
    kinds[k].measured_s = median(t[k]);
  }
}

algo::SimOptions sim_options() {
  algo::SimOptions s;
  s.slice_bytes = static_cast<size_t>(param_int(Param::SliceBytes));
  s.fifo_depth = static_cast<int>(param_int(Param::FifoDepth));
  return s;
}

// The program the communicator runs for an all-reduce with `algorithm`, or nullptr when it does not apply.
std::shared_ptr<const algo::Program> all_reduce_program(const topo::Topology& t, const char* algorithm) {
  const algo::AlgorithmInfo* info = algo::find_algorithm(algo::Coll::AllReduce, algorithm);
  if (info == nullptr) return nullptr;
  try {
    const algo::ProgramParams p{t.nranks(), 0, static_cast<int>(param_int(Param::NChannels)), t.host_of_rank()};
    return algo::get_program(*info, p);
  } catch (const std::exception&) {
    return nullptr;
  }
}

double predict(const algo::Program& prog, const topo::Topology& t, size_t count) {
  return algo::simulate(prog, t, count, sizeof(float), sim_options()).seconds;
}

// The dearest link class measured: the one the surcharge goes to.
topo::LinkClass dearest_class(const std::vector<ClassResult>& classes) {
  topo::LinkClass dear = topo::LinkClass::SameProcess;
  for (const ClassResult& c : classes) dear = std::max(dear, c.cls);
  return dear;
}

// The extra latency d per message of the dearest class present (network when there are several hosts) with which the
// simulator predicts `measured_s` for `prog`: bisection, since the prediction grows with every alpha. Clamped to
// [-0.9 * smallest pair alpha, measured_s].
double calibrate_surcharge(const algo::Program& prog, const topo::Topology& base, std::vector<ClassResult>& classes,
                           size_t count, double measured_s) {
  const topo::LinkClass dear = dearest_class(classes);
  double min_alpha = std::numeric_limits<double>::infinity();
  for (const ClassResult& c : classes)
    if (c.cls == dear) min_alpha = c.fit.alpha_s;
  auto predict_with = [&](double d) {
    topo::Topology t = base;
    for (const ClassResult& c : classes)
      t.links[static_cast<size_t>(c.cls)].alpha_s = c.fit.alpha_s + (c.cls == dear ? d : 0.0);
    return predict(prog, t, count);
  };
  double lo = -0.9 * min_alpha, hi = measured_s;
  if (predict_with(lo) >= measured_s) return lo;
  if (predict_with(hi) <= measured_s) return hi;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (predict_with(mid) < measured_s ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

struct Kernels {
  double reduce_Bps = 0;
  double copy_Bps = 0;
};

// The library's CPU reduction (float32 sum, a + b -> c) and memcpy on 4 MiB, best of 10 each, after the buffers
// are touched (first-touch faults are not the kernels' cost).
Kernels measure_kernels() {
  const size_t n = kKernelBytes / sizeof(float);
  std::vector<float> a(n), b(n), c(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 1024), b[i] = 1.0f;
  kernels::Reducer red(kernels::ReduceSpec{});
  double best_reduce = std::numeric_limits<double>::infinity(), best_copy = best_reduce;
  for (int i = 0; i <= kKernelRuns; ++i) {
    const auto t0 = Clock::now();
    red.reduce(c.data(), a.data(), b.data(), n, false, false);
    const double s = seconds_since(t0);
    if (i > 0) best_reduce = std::min(best_reduce, s);
  }
  volatile float sink = c[n / 2];
  for (int i = 0; i <= kKernelRuns; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(c.data(), a.data(), kKernelBytes);
    const double s = seconds_since(t0);
    if (i > 0) best_copy = std::min(best_copy, s);
    sink = sink + c[(n / 3 + static_cast<size_t>(i)) % n];
  }
  (void)sink;
  return {static_cast<double>(kKernelBytes) / best_reduce, static_cast<double>(kKernelBytes) / best_copy};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Writes `text` to a temporary file beside `path`, then renames it over `path`. Throws Failure.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = cat(path, ".tmp.", getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Failure(cat("cannot create ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      std::remove(tmp.c_str());
      throw Failure(cat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Failure(cat("cannot write ", tmp, ": ", std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Failure(cat("cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
}

// Rank 0 checks that it can create a file beside the output before anything is measured; every rank learns the
// answer, so a bad path fails the job at once.
bool output_writable(Job& job, const std::string& path) {
  int32_t ok = 1;
  if (job.rank() == 0) {
    struct stat st {};
    const std::string probe = cat(path, ".tmp.", getpid());
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "chorus-tune: -o %s is a directory (give a file name)\n", path.c_str());
      ok = 0;
    } else {
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) {
        std::fprintf(stderr, "chorus-tune: cannot write %s: %s\n", probe.c_str(), std::strerror(errno));
        ok = 0;
      } else {
        ::close(fd);
        std::remove(probe.c_str());
      }
    }
  }
  job.broadcast(&ok, 1, chorusInt32, 0);
  return ok != 0;
}

constexpr const char* kMethod =
    "pair: the lowest pair of each link class ping-pongs (chorusSend/chorusRecv) messages of 8 B .. max-bytes "
    "(powers of 4) while every other rank waits in a barrier; one-way time = fastest round trip / 2 (sweep: "
    "[bytes, fastest, median] us); pair alpha = median one-way time of the sizes <= 1 KiB; bandwidth_GBps = 1 / slope "
    "through the sizes >= max-bytes/64 "
    "(Theil-Sen: median of the slopes between every two of them). links.*.alpha_us = pair alpha, plus d for "
    "the dearest class present (network when there are several hosts), found so that the simulator predicts the "
    "measured time of a ring all-reduce of nranks floats run "
    "by all ranks at once (median over rounds of the rank-averaged time per call of back-to-back calls, as the perf "
    "tools measure): the "
    "per-message cost of the call, the executor and the scheduler when every rank is active. overhead_us: the "
    "default per-message CPU overhead (LogGP o), not measured; the calibration uses it. reduce_GBps: the "
    "library's float32 sum a + b -> c, copy_GBps: memcpy; 4 MiB, rank 0, best of 10.";

int run(Job& job, const Options& opt) {
  const bool root = job.rank() == 0;
  if (!output_writable(job, opt.output)) return kExitFailed;
  const topo::Topology base = gather_topology(job);
  const int n = job.nranks();
  const std::vector<size_t> sizes = sweep_sizes(opt.max_bytes);
  // Touched once here, so first-touch page faults stay out of the timings.
  std::vector<char> sbuf(n > 1 ? opt.max_bytes : 0), rbuf(sbuf.size());
  for (size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<char>(i * 131 + static_cast<size_t>(job.rank()));
  std::memset(rbuf.data(), 0, rbuf.size());

  if (root && n == 1)
    std::printf("chorus-tune: 1 rank: no pairs of ranks, only the reduce and copy rates\n");
  else if (root)
    std::printf("chorus-tune: %d ranks on %d host%s; ping-pong %s .. %s, %d round trips per size (fewer above %s)\n", n,
                base.nhosts(), base.nhosts() == 1 ? "" : "s", human_bytes(sizes.front()).c_str(),
                human_bytes(sizes.back()).c_str(), opt.iters, human_bytes(kFullItersLimit).c_str());

  // 1. One flow per class: the lowest pair of each class present.
  std::vector<ClassResult> classes;
  for (int c = 0; c < topo::kLinkClasses; ++c) {
    const auto cls = static_cast<topo::LinkClass>(c);
    ClassResult res;
    res.cls = cls;
    res.pair = {-1, -1};
    for (int a = 0; a < n && res.pair.first < 0; ++a)
      for (int b = a + 1; b < n; ++b)
        if (base.link(a, b) == cls) {
          res.pair = {a, b};
          break;
        }
    if (res.pair.first < 0) continue;
    // Per size: the fastest one-way time (fitted: on a shared machine interference only adds time) and the median.
    const size_t ns = sizes.size();
    std::vector<double> stats(2 * ns, 0.0);
    for (size_t i = 0; i < ns; ++i) {
      const std::vector<double> rt = ping_pong(job, {res.pair}, sizes[i], iters_at(sizes[i], opt.iters), sbuf, rbuf);
      if (!rt.empty()) {
        stats[i] = *std::min_element(rt.begin(), rt.end()) / 2;
        stats[ns + i] = median(rt) / 2;
      }
      job.barrier();  // the other ranks wait here, one size at a time (well inside CHORUS_TIMEOUT_MS)
    }
    job.broadcast(stats.data(), stats.size(), chorusFloat64, res.pair.first);
    res.one_way_s.assign(stats.begin(), stats.begin() + static_cast<std::ptrdiff_t>(ns));
    res.one_way_median_s.assign(stats.begin() + static_cast<std::ptrdiff_t>(ns), stats.end());
    res.fit = fit_hockney(sizes, res.one_way_s);
    res.alpha_s = res.fit.alpha_s;

    // All disjoint pairs of the class at once (greedy in rank order), largest size.
    std::vector<std::pair<int, int>> pairs;
    std::vector<bool> used(static_cast<size_t>(n), false);
    for (int a = 0; a < n; ++a) {
      if (used[static_cast<size_t>(a)]) continue;
      for (int b = a + 1; b < n; ++b)
        if (!used[static_cast<size_t>(b)] && base.link(a, b) == cls) {
          pairs.emplace_back(a, b);
          used[static_cast<size_t>(a)] = used[static_cast<size_t>(b)] = true;
          break;
        }
    }
    if (pairs.size() >= 2) {
      job.barrier();
      const std::vector<double> rt = ping_pong(job, pairs, sizes.back(), iters_at(sizes.back(), opt.iters), sbuf, rbuf);
      const double mine = rt.empty() ? 0 : *std::min_element(rt.begin(), rt.end()) / 2;
      std::vector<double> all(static_cast<size_t>(n));
      job.all_gather(&mine, all.data(), 1, chorusFloat64);
      std::vector<double> per_pair;
      for (const auto& p : pairs) per_pair.push_back(all[static_cast<size_t>(p.first)]);
      res.concurrent_pairs = static_cast<int>(pairs.size());
      res.concurrent_one_way_s = median(per_pair);
    }
    classes.push_back(std::move(res));
  }

  // 2. Reduction and copy rates on rank 0 (the others wait in the barrier).
  Kernels k;
  if (root) k = measure_kernels();
  job.barrier();
  job.broadcast(&k, 2, chorusFloat64, 0);

  // 3. Collectives with every rank running: calibrate the per-message surcharge on a small ring all-reduce, then
  // check the result on a small tree all-reduce and a larger ring all-reduce.
  topo::Topology tuned = base;
  tuned.reduce_Bps = k.reduce_Bps;
  tuned.copy_Bps = k.copy_Bps;
  // The per-message overhead is not measured: the default stays, so the surcharge below is calibrated with the
  // overhead the library will use.
  for (const ClassResult& c : classes) {
    topo::LinkParams& lp = tuned.links[static_cast<size_t>(c.cls)];
    lp.alpha_s = c.fit.alpha_s;
    lp.bandwidth_Bps = c.fit.bandwidth_Bps;
  }
  const int rounds = std::max(10, 2 * opt.iters);
  double surcharge_s = 0;
  std::vector<Timed> checks;  // [0] barrier, [1] the calibration (small ring), then the checks
  const size_t small_count = static_cast<size_t>(n);
  if (n >= 2 && !classes.empty()) {
    const auto ring = all_reduce_program(base, "ring");
    if (!ring) throw Failure("no ring all-reduce program for this job");
    const auto tree = all_reduce_program(base, "tree");
    const size_t big_count = std::min<size_t>(opt.max_bytes, size_t{1} << 20) / sizeof(float);
    checks.push_back({nullptr, 0});
    checks.push_back({"ring", small_count});
    if (tree) checks.push_back({"tree", small_count});
    // The small calls are timed in their own rounds: interleaved after a large one they would start behind its
    // queued bytes (a shaped link's queue and token bucket take milliseconds to drain).
    std::vector<Timed> big = {{"ring", big_count}};
    time_calls(job, checks, rounds);
    time_calls(job, big, rounds);
    checks.push_back(big[0]);
  }
  if (!root) return 0;

  if (!checks.empty()) {  // rank 0 alone: the simulator needs no other rank
    const auto ring = all_reduce_program(base, "ring");
    const auto tree = all_reduce_program(base, "tree");
    topo::Topology pair_only = tuned;
    surcharge_s = calibrate_surcharge(*ring, tuned, classes, small_count, checks[1].measured_s);
    const topo::LinkClass dear = dearest_class(classes);
    for (ClassResult& c : classes) {
      c.alpha_s = c.fit.alpha_s + (c.cls == dear ? surcharge_s : 0.0);
      tuned.links[static_cast<size_t>(c.cls)].alpha_s = c.alpha_s;
    }
    for (size_t i = 1; i < checks.size(); ++i) {
      const algo::Program& prog = std::string(checks[i].algorithm) == "tree" ? *tree : *ring;
      checks[i].predicted_s = predict(prog, tuned, checks[i].count);
      checks[i].predicted_pair_s = predict(prog, pair_only, checks[i].count);
    }
  }

  // 4. The table and the file.
  if (!classes.empty())
    std::printf("\n%-12s %-7s %12s %14s %16s %14s\n", "class", "pair", "alpha(us)", "bandwidth(GB/s)", "pair alpha(us)",
                "concurrent");
  for (const ClassResult& c : classes) {
    std::string conc = "-";
    if (c.concurrent_pairs >= 2) {
      const double t = c.concurrent_one_way_s - c.fit.alpha_s;
      const double bw = t > 0 ? static_cast<double>(sizes.back()) / t / 1e9 : 0;
      conc = cat(c.concurrent_pairs, " x ", round_sig(bw, 3), " GB/s");
    }
    std::printf("%-12s %-7s %12.2f %14.4g %16.2f %14s\n", topo::link_class_name(c.cls),
                cat(c.pair.first, "-", c.pair.second).c_str(), c.alpha_s * 1e6, c.fit.bandwidth_Bps / 1e9,
                c.fit.alpha_s * 1e6, conc.c_str());
  }
  std::printf("reduce %.3g GB/s, copy %.3g GB/s (rank 0, %s, best of %d)\n", k.reduce_Bps / 1e9, k.copy_Bps / 1e9,
              human_bytes(kKernelBytes).c_str(), kKernelRuns);
  if (!checks.empty())
    std::printf(
        "barrier %.1f us; per-message surcharge in collectives d = %.2f us (dearest class: alpha = pair alpha + d)\n",
        checks[0].measured_s * 1e6, surcharge_s * 1e6);

  if (!classes.empty()) {
    std::printf(
        "\nsweep: one-way time (us): fastest and median round trip / 2, and the model pair alpha + "
        "b / bandwidth\n%10s",
        "");
    for (const ClassResult& c : classes) std::printf(" %32s", topo::link_class_name(c.cls));
    std::printf("\n%10s", "bytes");
    for (size_t i = 0; i < classes.size(); ++i) std::printf(" %10s %10s %10s", "fastest", "median", "model");
    std::printf("\n");
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%10zu", sizes[i]);
      for (const ClassResult& c : classes) {
        const double model = c.fit.alpha_s + static_cast<double>(sizes[i]) / c.fit.bandwidth_Bps;
        std::printf(" %10.2f %10.2f %10.2f", c.one_way_s[i] * 1e6, c.one_way_median_s[i] * 1e6, model * 1e6);
      }
      std::printf("\n");
    }
  }
  if (!checks.empty()) {
    std::printf(
        "\nall-reduce, all %d ranks (float): measured vs simulated with the written values (and with pair "
        "alphas only)\n",
        n);
    for (size_t i = 1; i < checks.size(); ++i) {
      const Timed& c = checks[i];
      // Rounded first, so that a difference below 0.5% prints as +0%, not -0%.
      const double off_percent = std::round(100 * (c.predicted_s / c.measured_s - 1)) + 0.0;
      std::printf("  %-5s %10s %10.1f us  predicted %10.1f us (%+.0f%%)  pair alphas only %10.1f us\n", c.algorithm,
                  human_bytes(c.count * sizeof(float)).c_str(), c.measured_s * 1e6, c.predicted_s * 1e6, off_percent,
                  c.predicted_pair_s * 1e6);
    }
  }

  nlohmann::ordered_json j;
  j["comment"] =
      "written by chorus-tune; CHORUS_TUNE_FILE and chorus-plan --tune read links, reduce_GBps and copy_GBps, the "
      "rest is the record of the measurement";
  nlohmann::ordered_json links = nlohmann::ordered_json::object();
  for (const ClassResult& c : classes)
    links[topo::link_class_name(c.cls)] = {
        {"alpha_us", round_sig(c.alpha_s * 1e6, 4)},
        {"bandwidth_GBps", round_sig(c.fit.bandwidth_Bps / 1e9, 4)},
        {"overhead_us", round_sig(tuned.links[static_cast<size_t>(c.cls)].overhead_s * 1e6, 4)}};
  j["links"] = links;
  j["reduce_GBps"] = round_sig(k.reduce_Bps / 1e9, 4);
  j["copy_GBps"] = round_sig(k.copy_Bps / 1e9, 4);
  j["measured_at"] = utc_now();
  j["nranks"] = n;
  j["hosts"] = base.nhosts();
  j["method"] = kMethod;
  nlohmann::ordered_json pairs = nlohmann::ordered_json::object(), sweep = nlohmann::ordered_json::object();
  for (const ClassResult& c : classes) {
    nlohmann::ordered_json p = {{"ranks", {c.pair.first, c.pair.second}},
                                {"alpha_us", round_sig(c.fit.alpha_s * 1e6, 4)},
                                {"bandwidth_GBps", round_sig(c.fit.bandwidth_Bps / 1e9, 4)}};
    if (c.concurrent_pairs >= 2)
      p["concurrent"] = {{"pairs", c.concurrent_pairs},
                         {"bytes", sizes.back()},
                         {"one_way_us", round_sig(c.concurrent_one_way_s * 1e6, 4)}};
    pairs[topo::link_class_name(c.cls)] = p;
    nlohmann::ordered_json pts = nlohmann::ordered_json::array();
    for (size_t i = 0; i < sizes.size(); ++i)
      pts.push_back({sizes[i], round_sig(c.one_way_s[i] * 1e6, 4), round_sig(c.one_way_median_s[i] * 1e6, 4)});
    sweep[topo::link_class_name(c.cls)] = pts;
  }
  j["pairs"] = pairs;
  j["sweep"] = sweep;
  if (!checks.empty()) {
    nlohmann::ordered_json coll = {{"surcharge_us", round_sig(surcharge_s * 1e6, 4)},
                                   {"barrier_us", round_sig(checks[0].measured_s * 1e6, 4)}};
    nlohmann::ordered_json all_reduce = nlohmann::ordered_json::array();
    for (size_t i = 1; i < checks.size(); ++i) {
      const Timed& c = checks[i];
      all_reduce.push_back({{"algorithm", c.algorithm},
                            {"bytes", c.count * sizeof(float)},
                            {"measured_us", round_sig(c.measured_s * 1e6, 4)},
                            {"predicted_us", round_sig(c.predicted_s * 1e6, 4)},
                            {"predicted_pair_alpha_us", round_sig(c.predicted_pair_s * 1e6, 4)}});
    }
    coll["all_reduce"] = all_reduce;
    j["collective"] = coll;
  }
  write_atomically(opt.output, j.dump(2) + "\n");
  std::printf("\nwrote %s\n", opt.output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int env_rank = 0;
  const bool from_env = launched(&env_rank);
  Options opt;
  if (const int rc = parse_args(argc, argv, &opt, !from_env || env_rank == 0); rc >= 0) return rc;

  chorusComm_t comm = nullptr;
  chorusResult_t r;
  if (from_env) {
    r = chorusCommInitFromEnv(&comm);
  } else {
    chorusUniqueId id;
    r = chorusGetUniqueId(&id);
    if (r == chorusSuccess) r = chorusCommInitRank(&comm, 1, id, 0);
  }
  if (r != chorusSuccess) {
    std::fprintf(stderr, "chorus-tune: communicator init failed: %s (%s)\n", chorusGetErrorString(r),
                 chorusGetLastError(nullptr));
    return kExitFailed;
  }
  int rc = kExitFailed;
  try {
    Job job(comm);
    rc = run(job, opt);
  } catch (const Failure& e) {
    std::fprintf(stderr, "chorus-tune: rank %d: %s\n", env_rank, e.what());
    chorusCommAbort(comm);
    return kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-tune: rank %d: %s\n", env_rank, e.what());
    chorusCommAbort(comm);
    return kExitFailed;
  }
  chorusCommDestroy(comm);
  return rc;
}
