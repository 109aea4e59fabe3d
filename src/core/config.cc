#include "core/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {
// Order must follow enum Param.
constexpr ParamInfo kParams[] = {
    {Param::Debug, "CHORUS_DEBUG", "string", "WARN", "Log level: NONE, WARN, INFO or TRACE."},
    {Param::DebugSubsys, "CHORUS_DEBUG_SUBSYS", "string", "ALL",
     "Comma-separated subsystems whose INFO and TRACE messages to log (CORE, BOOTSTRAP, TRANSPORT, RUNTIME, "
     "ALGORITHMS, KERNELS, TOPOLOGY, TOOLS, ALL); a leading ^ excludes the listed ones. Warnings are always logged."},
    {Param::DebugFile, "CHORUS_DEBUG_FILE", "string", "",
     "Write logs to this file instead of stderr; %h is replaced by the host name, %p by the pid."},
    {Param::TimeoutMs, "CHORUS_TIMEOUT_MS", "int", "300000",
     "Deadline in milliseconds for every blocking wait (rendezvous, connection) and for each whole call: a "
     "collective or group must finish within it from its start, however steadily its data moves (it is not an "
     "inactivity timeout: raise it for calls that move much data over slow links). A wait "
     "that passes it fails with chorusTimeout naming the peer that is missing; a collective's error comes up to "
     "about 2 s later (at most 10 s, with thousands of ranks), while the rank asks the others what they were "
     "doing so that the error can say."},
    {Param::Transports, "CHORUS_TRANSPORTS", "string", "local,shm,tcp",
     "Transports allowed, in priority order; for each peer the first that can connect is used. Known: local, shm, "
     "ibverbs, ucx, tcp (chorus-info shows what each finds here). ibverbs and ucx are opted into by listing them, "
     "e.g. local,shm,ibverbs,tcp; one that cannot run here (not built, no RDMA device) reaches no peer and the "
     "next in the list is used."},
    {Param::SocketIfname, "CHORUS_SOCKET_IFNAME", "string", "",
     "Network interface for bootstrap and tcp (e.g. eth0). Default: the first interface that is up and not "
     "loopback or a docker*/virbr* bridge, else such a bridge, else loopback. A name that does not exist is an error "
     "listing the names that do."},
    {Param::UcxTls, "CHORUS_UCX_TLS", "string", "",
     "UCX transports for the ucx transport (passed to UCX as its TLS setting, e.g. sm, tcp, rc,sm, ^cma). Default: "
     "UCX_TLS when set, else UCX's own choice."},
    {Param::IbHca, "CHORUS_IB_HCA", "string", "",
     "RDMA devices and ports for the ibverbs transport: a comma-separated list of device[:port] prefixes "
     "(mlx5_0:1,mlx5_1); a leading = matches names exactly, a leading ^ excludes the listed ones. Default: the "
     "first device with an active port."},
    {Param::IbGidIndex, "CHORUS_IB_GID_INDEX", "string", "auto",
     "GID index for the ibverbs transport (RoCE needs one; InfiniBand uses the LID and GID 0). auto: on RoCE the "
     "first RoCE v2 GID holding an IPv4 address, else RoCE v2, else the first valid one."},
    {Param::IbQpsPerConnection, "CHORUS_IB_QPS_PER_CONNECTION", "int", "1",
     "RC queue pairs per ibverbs connection (1..16); slices are spread over them in turn. Must agree on every "
     "rank."},
    {Param::CudaDirect, "CHORUS_CUDA_DIRECT", "int", "1",
     "CUDA builds: 1 lets collectives on device buffers among ranks that are threads of one process, or processes "
     "on one GPU (through CUDA IPC), read each other's device memory directly (copies and reduction kernels, "
     "docs/cuda.md); 0 stages them through pinned host memory like every other call. Must agree on every rank."},
    {Param::SliceBytes, "CHORUS_SLICE_BYTES", "size", "256K",
     "Pipelining unit: bytes per message on a connection (and per FIFO slot)."},
    {Param::FifoDepth, "CHORUS_FIFO_DEPTH", "int", "4",
     "Slots per connection FIFO (messages in flight): a power of two from 2 to 64."},
    {Param::NChannels, "CHORUS_NCHANNELS", "int", "1", "Parallel channels per collective program."},
    {Param::YieldUs, "CHORUS_YIELD_US", "int", "1000",
     "With more ranks than CPUs on a host, a waiting rank yields its CPU for up to this many microseconds before "
     "it sleeps on the connection it waits for (with a CPU each, it spins 20 us instead)."},
    {Param::TopoFile, "CHORUS_TOPO_FILE", "string", "",
     "Topology file (JSON, docs/topology.md) that stands in for the real machine: hosts, NUMA nodes, GPUs, NICs, "
     "rank placement and link costs. Default: hosts told apart by the ranks' identities (host name, boot id, "
     "network namespace), default link costs."},
    {Param::TopoDumpFile, "CHORUS_TOPO_DUMP_FILE", "string", "",
     "Rank 0 writes the topology it found (discovered or loaded) to this file, in the CHORUS_TOPO_FILE format."},
    {Param::TuneFile, "CHORUS_TUNE_FILE", "string", "",
     "Link costs measured by chorus-tune (JSON: links, reduce_GBps, copy_GBps); they override the defaults and "
     "the topology file's values."},
    {Param::Algo, "CHORUS_ALGO", "string", "",
     "Algorithm overrides per collective and size, e.g. 'allreduce:0-64K:tree,64K-:ring;allgather:bruck' (sizes "
     "in bytes as the perf tools report them; ranges half-open). Default: the cost model chooses. Names: "
     "chorus-info."},
    {Param::Deterministic, "CHORUS_DETERMINISTIC", "int", "0",
     "1 pins the reductions' algorithms across message sizes, so a float result never changes bits because its "
     "size crossed a selection threshold: all-reduce and reduce-scatter run recursive halving (rhd), whose order "
     "of additions for an element does not depend on the count, reduce runs the ring. CHORUS_ALGO rules and "
     "per-call names still come first. Must agree on every rank."},
    {Param::Fp32Partials, "CHORUS_FP32_PARTIALS", "int", "0",
     "1: reductions of fp16, bf16 and fp8 data with sum, avg, prod or a pre-multiplied sum carry fp32 partial sums "
     "between ranks: the data is widened to fp32, reduced as fp32 and rounded to the type once (the fp32 call's "
     "result, rounded; twice the bytes on the wire for 16-bit types, four times for fp8). 0: values travel in the "
     "type and every reduction step rounds. Must agree on every rank."},
    {Param::Rank, "CHORUS_RANK", "int", "", "This process's rank (overrides launcher variables)."},
    {Param::NRanks, "CHORUS_NRANKS", "int", "", "Number of ranks (overrides launcher variables)."},
    {Param::LocalRank, "CHORUS_LOCAL_RANK", "int", "", "Rank within this host (overrides launcher variables)."},
    {Param::RootAddr, "CHORUS_ROOT_ADDR", "string", "",
     "host:port of the rendezvous root, served by rank 0 (overrides MASTER_ADDR/MASTER_PORT)."},
    {Param::Secret, "CHORUS_SECRET", "string", "",
     "32 hex digits shared by all ranks of a job launched from the environment; every connection proves "
     "knowledge of it. chorusrun sets it."},
    {Param::LaunchId, "CHORUS_LAUNCH_ID", "string", "",
     "1 to 16 hex digits naming one launch; chorusrun sets it. The shm transport puts it in the names of its "
     "segments (/dev/shm/chorus-<pid>-<id>-...), so that the launcher removes exactly those a rank of its own "
     "launch left behind, even when jobs in other pid namespaces share /dev/shm."},
};
static_assert(std::size(kParams) == static_cast<size_t>(Param::Count));
}  // namespace

std::span<const ParamInfo> params() { return kParams; }

const ParamInfo& param_info(Param p) {
  const ParamInfo& info = kParams[static_cast<int>(p)];
  CHORUS_ASSERT(info.id == p);
  return info;
}

bool param_is_set(Param p) {
  const char* v = std::getenv(param_info(p).name);
  return v != nullptr && *v != '\0';
}

std::string param_str(Param p) {
  const ParamInfo& info = param_info(p);
  const char* v = std::getenv(info.name);
  return (v != nullptr && *v != '\0') ? std::string(v) : std::string(info.fallback);
}

int64_t parse_size(const std::string& text, const char* what) {
  // from_chars, unlike strtoll, takes no leading space or '+': the whole text is the number and its suffix.
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range && text[0] != '-')
    throw Error(chorusInvalidArgument, Subsys::Core, cat(what, "='", text, "' is too large"));
  if (ec != std::errc() || end == text.data() || v < 0)
    throw Error(chorusInvalidArgument, Subsys::Core, cat(what, "='", text, "' is not a non-negative size"));
  int64_t mult = 1;
  const std::string suffix(end, text.data() + text.size());
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1 << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mult = 1 << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mult = int64_t{1} << 30;
  else if (!suffix.empty())
    throw Error(chorusInvalidArgument, Subsys::Core, cat(what, "='", text, "' has an unknown suffix '", suffix, "'"));
  if (v > INT64_MAX / mult) throw Error(chorusInvalidArgument, Subsys::Core, cat(what, "='", text, "' is too large"));
  return v * mult;
}

int64_t param_int(Param p) {
  const ParamInfo& info = param_info(p);
  std::string text = param_str(p);
  if (text.empty()) throw Error(chorusInvalidArgument, Subsys::Core, cat(info.name, " is not set and has no default"));
  if (std::string(info.type) == "size") return parse_size(text, info.name);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range)
    throw Error(chorusInvalidArgument, Subsys::Core, cat(info.name, "='", text, "' is out of range"));
  if (ec != std::errc() || end != text.data() + text.size())
    throw Error(chorusInvalidArgument, Subsys::Core, cat(info.name, "='", text, "' is not an integer"));
  return v;
}

size_t slice_bytes_setting() {
  const int64_t v = param_int(Param::SliceBytes);
  if (v < 64 || v > (int64_t{1} << 30))
    throw Error(chorusInvalidArgument, Subsys::Core, cat("CHORUS_SLICE_BYTES=", v, " must be between 64 and 1G"));
  return static_cast<size_t>(v);
}

int fifo_depth_setting() {
  const int64_t depth = param_int(Param::FifoDepth);
  if (depth < 2 || depth > 64 || (depth & (depth - 1)) != 0)
    throw Error(chorusInvalidArgument, Subsys::Core,
                cat("CHORUS_FIFO_DEPTH=", depth,
                    " must be a power of two between 2 and 64 (steps that receive and send need 2)"));
  return static_cast<int>(depth);
}

int nchannels_setting() {
  const int64_t nch = param_int(Param::NChannels);
  if (nch < 1 || nch > 32)
    throw Error(chorusInvalidArgument, Subsys::Core, cat("CHORUS_NCHANNELS=", nch, " must be between 1 and 32"));
  return static_cast<int>(nch);
}

bool switch_setting(Param p) {
  const int64_t v = param_int(p);
  if (v != 0 && v != 1)
    throw Error(chorusInvalidArgument, Subsys::Core, cat(param_info(p).name, "=", v, " must be 0 or 1"));
  return v == 1;
}

namespace {
// Levenshtein distance (insertions, deletions, substitutions each cost 1).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string UnknownSetting::suggestion(const char* before, const char* after) const {
  if (nearest.empty()) return "";
  std::string text = before;
  for (size_t i = 0; i < nearest.size(); ++i) text += cat(i == 0 ? "did you mean " : " or ", nearest[i]);
  return cat(text, "?", after);
}

std::vector<UnknownSetting> unknown_settings() {
  constexpr std::string_view kPrefix = "CHORUS_";
  std::vector<UnknownSetting> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (!entry.starts_with(kPrefix) || eq == std::string_view::npos) continue;  // getenv never sees one without =
    UnknownSetting u{std::string(entry.substr(0, eq)), {}};
    if (u.name == "CHORUS_BUILD" ||
        std::any_of(std::begin(kParams), std::end(kParams), [&](const ParamInfo& p) { return u.name == p.name; }))
      continue;
    std::string upper = u.name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    size_t best = 3;  // suggest only names at most 3 edits away
    for (const ParamInfo& p : kParams) {
      const size_t d = edit_distance(upper, p.name);
      if (d < best) {
        best = d;
        u.nearest.clear();
      }
      if (d == best) u.nearest.push_back(p.name);
    }
    out.push_back(std::move(u));
  }
  std::sort(out.begin(), out.end(), [](const UnknownSetting& a, const UnknownSetting& b) { return a.name < b.name; });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const UnknownSetting& a, const UnknownSetting& b) { return a.name == b.name; }),
            out.end());
  return out;
}

void warn_unknown_settings_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const UnknownSetting& u : unknown_settings())
      CHORUS_WARN(Core, "%s is set but is not a Chorus setting, so it is ignored%s (chorus-info lists the settings)",
                  u.name.c_str(), u.suggestion("; ").c_str());
  });
}

}  // namespace chorus
