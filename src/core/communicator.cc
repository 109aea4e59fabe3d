#include "core/communicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "algorithms/algorithms.h"
#include "bootstrap/root.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/log.h"
#include "kernels/cpu/float_types.h"
#include "kernels/cpu/reduce.h"
#include "runtime/executor.h"
#include "topology/topology.h"

namespace chorus {

using algo::BufKind;
using algo::Coll;

namespace {

constexpr uint32_t kTagConnect = Bootstrap::kTagConnect;
constexpr uint32_t kTagConnected = 2;
constexpr uint32_t kTagSplit = 3;
constexpr uint32_t kTagSplitId = 4;

[[noreturn]] void bad_arg(const std::string& what) { throw Error(chorusInvalidArgument, Subsys::Core, what); }

// Sets what a communicator is doing (CommImpl::activity_, read by peers' status questions) for a scope.
struct ActivityScope {
  std::atomic<uint8_t>& now;
  ActivityScope(std::atomic<uint8_t>& a, uint8_t doing) : now(a) { now.store(doing, std::memory_order_relaxed); }
  ~ActivityScope() { now.store(0, std::memory_order_relaxed); }
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool is_reduction(Coll c) { return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce; }

// Bytes of `count` elements of `dtype` times `mult`, or an error naming `what` if that overflows.
size_t checked_bytes(size_t count, size_t mult, chorusDataType_t dtype, const char* what) {
  size_t esz = dtype_size(dtype);
  if (count != 0 && (mult > std::numeric_limits<size_t>::max() / count ||
                     count * mult > static_cast<size_t>(std::numeric_limits<int64_t>::max()) / esz))
    bad_arg(cat(what, "=", count, " overflows: ", count, " x ", mult, " elements of ", esz, " bytes"));
  return count * mult * esz;
}

// `text` without a leading "rank N: " (the rank that reports it), for an error that a caller re-words.
std::string without_rank_prefix(const std::string& text) {
  size_t i = 5;
  if (text.rfind("rank ", 0) != 0) return text;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  if (i == 5 || text.compare(i, 2, ": ") != 0) return text;
  return text.substr(i + 2);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "CHORUS_NCHANNELS='2' here but '4'" for each NAME=value of two settings lines (space-separated) that differs.
std::string settings_difference(const std::string& mine, const std::string& theirs) {
  auto fields = [](const std::string& line) {
    std::map<std::string, std::string> out;
    size_t start = 0;
    while (start < line.size()) {
      size_t end = line.find(" CHORUS_", start);
      if (end == std::string::npos) end = line.size();
      const std::string field = line.substr(start, end - start);
      const size_t eq = field.find('=');
      out[field.substr(0, eq)] = eq == std::string::npos ? std::string() : field.substr(eq + 1);
      start = end + 1;
    }
    return out;
  };
  const auto a = fields(mine), b = fields(theirs);
  std::string diff;
  for (const auto& [name, value] : a) {
    auto it = b.find(name);
    const std::string other = it == b.end() ? std::string("(unset)") : it->second;
    if (other != value) diff += cat(diff.empty() ? "" : "; ", name, "='", value, "' here but '", other, "'");
  }
  for (const auto& [name, value] : b)
    if (!a.count(name)) diff += cat(diff.empty() ? "" : "; ", name, "=(unset) here but '", value, "'");
  return diff.empty() ? cat("'", mine, "' here but '", theirs, "'") : diff;
}

// The selector of communicator `comm_id` (its unique id's secret: fresh for every communicator, splits included)
// with `nranks` ranks and these settings, if another rank of this process made one and still holds it; else the one
// `make` returns, kept for the others.
std::shared_ptr<algo::Selector> shared_selector(uint64_t comm_id, int nranks, const std::string& settings,
                                                const std::function<std::shared_ptr<algo::Selector>()>& make) {
  static std::mutex mu;
  static auto* selectors =  // never freed: communicators may be destroyed during static destruction
      new std::map<std::tuple<uint64_t, int, std::string>, std::weak_ptr<algo::Selector>>();
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = selectors->begin(); it != selectors->end();) it = it->second.expired() ? selectors->erase(it) : ++it;
  std::weak_ptr<algo::Selector>& slot = (*selectors)[{comm_id, nranks, settings}];
  if (std::shared_ptr<algo::Selector> held = slot.lock()) return held;
  std::shared_ptr<algo::Selector> made = make();
  slot = made;
  return made;
}
}  // namespace

CommImpl::CommImpl(const UniqueIdData& id, int nranks, int rank, const topo::Topology* topology,
                   const std::function<void()>& check_stop)
    : rank_(rank), nranks_(nranks), secret_(id.secret) {
  if (nranks < 1) bad_arg(cat("nranks=", nranks, " must be at least 1"));
  if (rank < 0 || rank >= nranks) bad_arg(cat("rank=", rank, " is out of range [0, ", nranks, ")"));
  // The settings, read once here. A refused one names this rank: under a launcher every process prints its own
  // error, and a setting may be wrong on one rank only.
  algo::AlgoOverrides overrides;
  try {
    slice_bytes_ = slice_bytes_setting();
    fifo_depth_ = fifo_depth_setting();
    nchannels_ = nchannels_setting();
    timeout_ms_ = param_int(Param::TimeoutMs);
    const int64_t yield = param_int(Param::YieldUs);
    if (yield < 0 || yield > 10000000) bad_arg(cat("CHORUS_YIELD_US=", yield, " must be between 0 and 1e7"));
    yield_us_ = static_cast<int>(yield);
    if (timeout_ms_ <= 0) bad_arg(cat("CHORUS_TIMEOUT_MS=", timeout_ms_, " must be positive"));
    overrides = algo::parse_algo_overrides(param_str(Param::Algo));
    if (switch_setting(Param::Deterministic)) algo::add_deterministic_rules(overrides);
    fp32_partials_ = switch_setting(Param::Fp32Partials);
    // Read at each CUDA call (the GPU tests and benchmark switch it between calls); checked here once.
    (void)switch_setting(Param::CudaDirect);
    // From the secret alone: every rank has the same secret, while the root address each rank resolved itself may
    // differ (a host name that resolves to 127.0.1.1 on its own host).
    comm_id_ = fnv1a(id.secret.data(), id.secret.size());

    std::vector<std::string> names = split_list(param_str(Param::Transports));
    for (size_t i = 0; i < names.size(); ++i) {
      if (std::find(names.begin(), names.begin() + i, names[i]) != names.begin() + i)
        bad_arg(cat("CHORUS_TRANSPORTS='", param_str(Param::Transports), "' lists '", names[i], "' twice"));
      transports_.push_back(make_transport(names[i], secret_));
    }
    if (transports_.empty()) bad_arg("CHORUS_TRANSPORTS lists no transport");
  } catch (const Error& e) {
    throw Error(e.code(), e.subsys(), cat("rank ", rank, ": ", e.what()));
  }
  PeerInfo self = local_peer_info(rank);
  self.hosts_root = root_serving_here(id.secret);
  for (auto& t : transports_) {
    t->describe(self);
    const std::string why = t->unavailable_reason();
    if (!why.empty()) CHORUS_INFO(Transport, "rank %d: transport %s is unavailable: %s", rank, t->name(), why.c_str());
  }
  self.settings =
      cat("CHORUS_SLICE_BYTES=", slice_bytes_, " CHORUS_FIFO_DEPTH=", fifo_depth_, " CHORUS_NCHANNELS=", nchannels_,
          " CHORUS_TRANSPORTS=", param_str(Param::Transports), " CHORUS_ALGO=", param_str(Param::Algo),
          " CHORUS_DETERMINISTIC=", param_int(Param::Deterministic),
          " CHORUS_FP32_PARTIALS=", param_int(Param::Fp32Partials), " CHORUS_TOPO_FILE=", param_str(Param::TopoFile),
          " CHORUS_TUNE_FILE=", param_str(Param::TuneFile));

  bootstrap_ = Bootstrap::join(id, rank, nranks, self.serialize(), Deadline::after_ms(timeout_ms_), check_stop);
  // Past the rendezvous every peer's init succeeds; a failure here must reach them, or their first call would wait
  // for this rank until the timeout.
  try {
    bootstrap_->set_status([this] {
      Blob b(sizeof(uint64_t) + 1);
      const uint64_t started = started_.load(std::memory_order_relaxed);
      std::memcpy(b.data(), &started, sizeof(started));
      b[sizeof(started)] = std::byte{activity_.load(std::memory_order_relaxed)};
      return b;
    });
    for (const Blob& b : bootstrap_->peer_info()) peers_.push_back(PeerInfo::deserialize(b));
    // Settings that choose programs, slot sizes or transports must agree, or ranks would run different programs.
    for (const PeerInfo& p : peers_)
      if (p.settings != self.settings)
        throw Error(chorusInvalidUsage, Subsys::Core,
                    cat("rank ", rank, ": settings differ between ranks: ",
                        settings_difference(self.settings, p.settings), " on rank ", p.rank));
    // Spinning only pays when every rank on this host has a core: with more ranks than cores a spinning rank
    // holds the core the rank it waits for needs, so sleep almost at once.
    int local_ranks = 0;
    for (const PeerInfo& p : peers_) local_ranks += p.host_id == peers_[rank].host_id ? 1 : 0;
    cpu_set_t cpus;
    int ncpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    oversubscribed_ = local_ranks > ncpus;
    // A split's communicator takes its parent's view (the file describes the parent's ranks); only the first
    // communicator dumps it.
    topo::Topology view = topology ? *topology : make_topology();
    if (rank == 0 && !topology && param_is_set(Param::TopoDumpFile)) {
      try {
        topo::dump_file(view, param_str(Param::TopoDumpFile));
      } catch (const Error& e) {
        bad_arg(cat("CHORUS_TOPO_DUMP_FILE=", param_str(Param::TopoDumpFile), ": ", e.what()));
      }
    }
    selector_ = shared_selector(comm_id_, nranks, self.settings, [&] {
      return std::make_shared<algo::Selector>(std::move(view), algo::SimOptions{slice_bytes_, fifo_depth_}, nchannels_,
                                              std::move(overrides));
    });
  } catch (const std::exception& e) {
    bootstrap_->set_status(nullptr);  // its service thread must not read this half-built object
    if (!bootstrap_->failed()) bootstrap_->report_failure(cat("rank ", rank, ": communicator init failed: ", e.what()));
    throw;
  }
  lifeline_->comm = this;  // before any call: nothing else holds it yet
  CHORUS_INFO(Core, "rank %d/%d: communicator %016llx ready (slice %zu bytes, fifo depth %d, %d channel(s)%s)", rank,
              nranks, static_cast<unsigned long long>(comm_id_), slice_bytes_, fifo_depth_, nchannels_,
              oversubscribed_ ? ", more ranks than cores: yielding" : "");
}

topo::Topology CommImpl::make_topology() const {
  topo::Topology t;
  if (param_is_set(Param::TopoFile)) {
    const std::string path = param_str(Param::TopoFile);
    t = topo::load_file(path);
    if (t.nranks() != nranks_)
      bad_arg(cat("CHORUS_TOPO_FILE=", path, " places ", t.nranks(), " ranks but the communicator has ", nranks_));
  } else {
    // Hosts in order of their first rank; processes of a host in order of their first rank.
    std::map<std::string, int> host_index;
    std::vector<std::map<uint64_t, int>> procs;  // per host: process token -> index
    std::vector<int> nlocal;                     // per host: ranks placed so far
    for (const PeerInfo& p : peers_) {
      auto [it, added] = host_index.emplace(p.host_id, static_cast<int>(t.hosts.size()));
      if (added) {
        topo::Host h;
        h.id = p.host_id;
        // "hostname/boot id/netns:inode" -> "hostname (netns inode)" for people.
        const size_t slash = p.host_id.find('/'), ns = p.host_id.rfind("netns:");
        h.name = p.host_id.substr(0, slash);
        if (ns != std::string::npos) h.name += cat(" (netns ", p.host_id.substr(ns + 6), ")");
        t.hosts.push_back(h);
        procs.emplace_back();
        nlocal.push_back(0);
      }
      const int host = it->second;
      topo::RankPlace place;
      place.host = host;
      place.local_rank = nlocal[host]++;
      place.process = procs[host].emplace(p.process_token, static_cast<int>(procs[host].size())).first->second;
      t.ranks.push_back(place);
    }
  }
  topo::apply_default_costs(t);
  if (param_is_set(Param::TuneFile)) topo::apply_tune_file(t, param_str(Param::TuneFile));
  t.validate();
  return t;
}

CommImpl::~CommImpl() {
  {
    std::lock_guard<std::mutex> lock(lifeline_->mu);
    lifeline_->comm = nullptr;
  }
  {
    // No post can come now: a place still waiting for one fails, so the worker completes it (and releases its
    // stream) instead of waiting for ever. (chorusCommDestroy drains first, and abort() failed the places of its
    // time, reserve() those after it: this only guards other ends.)
    std::unique_lock<std::mutex> lock(q_mu_);
    fail_unposted_places();
    stop_ = true;
    q_cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  if (bootstrap_ != nullptr) bootstrap_->set_status(nullptr);  // its service thread must not read a dying object
  // Peers still in (or yet to make) a later collective learn from this note that this rank will not come.
  if (bootstrap_ != nullptr && !aborted_.load()) bootstrap_->leave_note(seq_);
  // The programs only this communicator used go with it.
  selector_.reset();
  algo::release_unused_programs();
}

CommImpl::Guard::Guard(CommImpl& c) : c_(c) {
  std::thread::id none{};
  if (!c.owner_.compare_exchange_strong(none, std::this_thread::get_id()) && none != std::this_thread::get_id())
    throw Error(chorusInvalidUsage, Subsys::Core,
                cat("rank ", c.rank_, ": communicator used by two threads at once (one thread at a time)"));
}

CommImpl::Guard::~Guard() { c_.owner_.store(std::thread::id{}); }

void CommImpl::validate_p2p_op(const P2POp& op) const {
  if (!dtype_valid(op.dtype)) bad_arg(cat("datatype=", static_cast<int>(op.dtype), " is not valid"));
  if (op.peer < 0 || op.peer >= nranks_) bad_arg(cat("peer=", op.peer, " is out of range [0, ", nranks_, ")"));
  const size_t bytes = checked_bytes(op.count, 1, op.dtype, "count");
  if (op.buf == nullptr && bytes > 0)
    bad_arg(cat(op.is_send ? "sendbuff" : "recvbuff", " is NULL with a non-zero count"));
}

void CommImpl::validate(CollArgs& a) const {
  const int n = nranks_;
  if (a.coll != Coll::SendRecv && a.coll != Coll::Barrier) {
    if (!dtype_valid(a.dtype)) bad_arg(cat("datatype=", static_cast<int>(a.dtype), " is not a valid chorusDataType_t"));
  }
  if (is_reduction(a.coll)) {
    int op = static_cast<int>(a.op);
    if (op < 0 || (op >= chorusNumOps && premul_.find(op) == premul_.end()))
      bad_arg(cat("op=", op, " is not a valid chorusRedOp_t or a live pre-multiplied sum of this communicator"));
    if (op >= chorusNumOps) {
      const PreMul& pm = premul_.at(op);
      if (pm.dtype != a.dtype)
        bad_arg(cat("op=", op, " was created for ", dtype_name(pm.dtype), ", not ", dtype_name(a.dtype)));
      a.premul = true;
      a.premul_f = pm.f;
      a.premul_i = pm.i;
    }
  }
  if (algo::rooted(a.coll)) {
    if (a.root < 0 || a.root >= n) bad_arg(cat("root=", a.root, " is out of range [0, ", n, ")"));
  }
  if (a.compressed) {
    validate_compression(a);
  } else if (!a.algorithm.empty()) {
    const algo::AlgorithmInfo* info = algo::find_algorithm(a.coll, a.algorithm);
    if (info == nullptr)
      bad_arg(cat("options->algorithm='", a.algorithm, "' is not an algorithm for ", algo::coll_name(a.coll),
                  " (known: ", algo::algorithm_names(a.coll), ")"));
    // A program that does not apply (one-shot beyond 64 ranks) is a bad argument of this call, not a failure of
    // the communicator. The program is cached, so the call that follows does not generate it again.
    try {
      selector_->program(*info, algo::rooted(a.coll) ? a.root : 0);
    } catch (const std::invalid_argument& e) {
      bad_arg(cat("options->algorithm='", a.algorithm, "' does not apply to this communicator: ", e.what()));
    }
  }
  auto need = [&](const void* p, size_t bytes, const char* name) {
    if (p == nullptr && bytes > 0) bad_arg(cat(name, " is NULL with a non-zero count"));
  };
  switch (a.coll) {
    case Coll::AllReduce: {
      size_t b = checked_bytes(a.count, 1, a.dtype, "count");
      need(a.send, b, "sendbuff");
      need(a.recv, b, "recvbuff");
      break;
    }
    case Coll::Broadcast: {
      size_t b = checked_bytes(a.count, 1, a.dtype, "count");
      if (rank_ == a.root) need(a.send, b, "sendbuff");
      need(a.recv, b, "recvbuff");
      break;
    }
    case Coll::Reduce: {
      size_t b = checked_bytes(a.count, 1, a.dtype, "count");
      need(a.send, b, "sendbuff");
      if (rank_ == a.root) need(a.recv, b, "recvbuff");
      break;
    }
    case Coll::AllGather: {
      need(a.send, checked_bytes(a.count, 1, a.dtype, "sendcount"), "sendbuff");
      need(a.recv, checked_bytes(a.count, n, a.dtype, "sendcount"), "recvbuff");
      break;
    }
    case Coll::ReduceScatter: {
      need(a.send, checked_bytes(a.count, n, a.dtype, "recvcount"), "sendbuff");
      need(a.recv, checked_bytes(a.count, 1, a.dtype, "recvcount"), "recvbuff");
      break;
    }
    case Coll::AllToAll: {
      size_t b = checked_bytes(a.count, n, a.dtype, "count");
      need(a.send, b, "sendbuff");
      need(a.recv, b, "recvbuff");
      break;
    }
    case Coll::Gather: {
      need(a.send, checked_bytes(a.count, 1, a.dtype, "sendcount"), "sendbuff");
      const size_t b = checked_bytes(a.count, n, a.dtype, "sendcount");
      if (rank_ == a.root) need(a.recv, b, "recvbuff");
      break;
    }
    case Coll::Scatter: {
      const size_t b = checked_bytes(a.count, n, a.dtype, "recvcount");
      if (rank_ == a.root) need(a.send, b, "sendbuff");
      need(a.recv, checked_bytes(a.count, 1, a.dtype, "recvcount"), "recvbuff");
      break;
    }
    case Coll::AllToAllv: {
      if (a.sendcounts.size() != static_cast<size_t>(n) || a.recvcounts.size() != static_cast<size_t>(n) ||
          a.sdispls.size() != static_cast<size_t>(n) || a.rdispls.size() != static_cast<size_t>(n))
        bad_arg("sendcounts, sdispls, recvcounts and rdispls must be non-NULL arrays of nranks entries");
      bool any_send = false, any_recv = false;
      // Element counts whose bytes fit in int64_t; names are built only for an entry that fails (this runs on every
      // call, for every rank).
      const size_t max_elems = static_cast<size_t>(std::numeric_limits<int64_t>::max()) / dtype_size(a.dtype);
      for (int i = 0; i < n; ++i) {
        size_t send_end = 0, recv_end = 0;
        const bool fits = !__builtin_add_overflow(a.sdispls[i], a.sendcounts[i], &send_end) &&
                          !__builtin_add_overflow(a.rdispls[i], a.recvcounts[i], &recv_end) && send_end <= max_elems &&
                          recv_end <= max_elems;
        if (!fits) {  // says which bound it broke
          checked_bytes(a.sendcounts[i], 1, a.dtype, cat("sendcounts[", i, "]").c_str());
          checked_bytes(a.recvcounts[i], 1, a.dtype, cat("recvcounts[", i, "]").c_str());
          if (__builtin_add_overflow(a.sdispls[i], a.sendcounts[i], &send_end))
            bad_arg(cat("sdispls[", i, "] + sendcounts[", i, "] overflows"));
          if (__builtin_add_overflow(a.rdispls[i], a.recvcounts[i], &recv_end))
            bad_arg(cat("rdispls[", i, "] + recvcounts[", i, "] overflows"));
          checked_bytes(send_end, 1, a.dtype, cat("sdispls[", i, "] + sendcounts[", i, "]").c_str());
          checked_bytes(recv_end, 1, a.dtype, cat("rdispls[", i, "] + recvcounts[", i, "]").c_str());
        }
        any_send |= a.sendcounts[i] > 0;
        any_recv |= a.recvcounts[i] > 0;
      }
      need(a.send, any_send, "sendbuff");
      need(a.recv, any_recv, "recvbuff");
      if (a.send != nullptr && a.send == a.recv)
        bad_arg("all-to-allv in place (sendbuff == recvbuff) is not supported");
      {
        // No element of the receive buffer is written twice (as MPI_Alltoallv requires): which rank's data would
        // be there depends on arrival order. Send regions may overlap (they are only read).
        std::vector<int> order;
        for (int i = 0; i < n; ++i)
          if (a.recvcounts[i] > 0) order.push_back(i);
        const auto before = [&](int x, int y) {
          return a.rdispls[x] != a.rdispls[y] ? a.rdispls[x] < a.rdispls[y] : x < y;
        };
        if (!std::is_sorted(order.begin(), order.end(), before))  // the usual layout is in rank order
          std::sort(order.begin(), order.end(), before);
        for (size_t k = 1; k < order.size(); ++k) {
          const int i = order[k - 1], j = order[k];
          if (a.rdispls[i] + a.recvcounts[i] > a.rdispls[j])
            bad_arg(cat("the receive regions of ranks ", std::min(i, j), " and ", std::max(i, j), " overlap (rdispls[",
                        i, "]=", a.rdispls[i], ", recvcounts[", i, "]=", a.recvcounts[i], "; rdispls[", j,
                        "]=", a.rdispls[j], ", recvcounts[", j, "]=", a.recvcounts[j], ")"));
        }
      }
      break;
    }
    case Coll::SendRecv: {
      for (const P2POp& op : a.p2p) validate_p2p_op(op);
      // Sends to itself pair with receives from itself in order, of equal sizes (the whole set is known here: one
      // call, or a group at chorusGroupEnd).
      std::vector<size_t> self_send, self_recv;
      for (const P2POp& op : a.p2p)
        if (op.peer == rank_) (op.is_send ? self_send : self_recv).push_back(op.count * dtype_size(op.dtype));
      if (self_send.size() != self_recv.size())
        bad_arg(cat("peer=", rank_, " (this rank): ", self_send.size(), " send(s) to itself but ", self_recv.size(),
                    " receive(s) from itself"));
      for (size_t i = 0; i < self_send.size(); ++i)
        if (self_send[i] != self_recv[i])
          bad_arg(cat("peer=", rank_, " (this rank): send ", i, " to itself of ", self_send[i],
                      " bytes meets a receive of ", self_recv[i], " bytes"));
      break;
    }
    case Coll::Barrier: break;
    case Coll::Count: bad_arg("invalid collective");
  }
  check_overlap(a);
}

CommImpl::Extents CommImpl::extents(const CollArgs& a) const {
  const size_t esz = dtype_size(a.dtype), n = static_cast<size_t>(nranks_);
  const bool root = rank_ == a.root;
  Extents e;
  switch (a.coll) {
    case Coll::AllReduce: e.send = e.recv = a.count * esz; break;
    case Coll::AllToAll: e.send = e.recv = a.count * esz * n; break;
    case Coll::Broadcast:
      e.send = root ? a.count * esz : 0;
      e.recv = a.count * esz;
      break;
    case Coll::Reduce:
      e.send = a.count * esz;
      e.recv = root ? a.count * esz : 0;
      break;
    case Coll::AllGather:
      e.send = a.count * esz;
      e.recv = e.send * n;
      break;
    case Coll::ReduceScatter:
      e.recv = a.count * esz;
      e.send = e.recv * n;
      break;
    case Coll::Gather:
      e.send = a.count * esz;
      e.recv = root ? e.send * n : 0;
      break;
    case Coll::Scatter:
      e.recv = a.count * esz;
      e.send = root ? e.recv * n : 0;
      break;
    case Coll::AllToAllv:
      // Only entries that move bytes: a count-0 entry's displacement points nowhere the call touches.
      for (size_t i = 0; i < n; ++i) {
        if (a.sendcounts[i] > 0) e.send = std::max(e.send, (a.sdispls[i] + a.sendcounts[i]) * esz);
        if (a.recvcounts[i] > 0) e.recv = std::max(e.recv, (a.rdispls[i] + a.recvcounts[i]) * esz);
      }
      break;
    default: break;
  }
  return e;
}

kernels::ReduceSpec CommImpl::reduce_spec(const CollArgs& a) const {
  kernels::ReduceSpec spec;
  spec.dtype = a.coll == Coll::Barrier ? chorusUint8 : a.dtype;
  switch (a.coll == Coll::Barrier ? chorusSum : a.op) {
    case chorusSum: spec.kind = kernels::ReduceKind::Sum; break;
    case chorusProd: spec.kind = kernels::ReduceKind::Prod; break;
    case chorusMax: spec.kind = kernels::ReduceKind::Max; break;
    case chorusMin: spec.kind = kernels::ReduceKind::Min; break;
    case chorusAvg:
      spec.kind = kernels::ReduceKind::Sum;
      spec.avg_divisor = nranks_;
      break;
    default:
      CHORUS_ASSERT(a.premul);
      spec.kind = kernels::ReduceKind::Sum;
      spec.premul = true;
      spec.scalar_f = a.premul_f;
      spec.scalar_i = a.premul_i;
  }
  return spec;
}

bool CommImpl::all_ranks_in_this_process() const {
  for (const PeerInfo& p : peers_)
    if (p.host_id != peers_[rank_].host_id || p.process_token != peers_[rank_].process_token) return false;
  return true;
}

bool CommImpl::ranks_are_processes_on_this_host() const {
  std::vector<uint64_t> tokens;
  for (const PeerInfo& p : peers_) {
    if (p.host_id != peers_[rank_].host_id) return false;
    tokens.push_back(p.process_token);
  }
  std::sort(tokens.begin(), tokens.end());
  return std::adjacent_find(tokens.begin(), tokens.end()) == tokens.end();
}

void CommImpl::check_overlap(const CollArgs& a) const {
  // Buffers may overlap only in a collective's exact in-place form; anything else would read bytes it already wrote.
  if (a.send == nullptr || a.recv == nullptr) return;
  const size_t r = static_cast<size_t>(rank_);
  auto* s = static_cast<const std::byte*>(a.send);
  auto* d = static_cast<const std::byte*>(a.recv);
  const Extents ext = extents(a);
  const size_t sbytes = ext.send, rbytes = ext.recv;
  const char* in_place = "sendbuff == recvbuff";
  bool exact = s == d;
  switch (a.coll) {
    case Coll::AllGather:
      exact = s == d + r * sbytes;
      in_place = "sendbuff == recvbuff + rank * sendcount";
      break;
    case Coll::ReduceScatter:
      exact = d == s + r * rbytes;
      in_place = "recvbuff == sendbuff + rank * recvcount";
      break;
    case Coll::Gather:  // at the root; elsewhere recvbuff is not used
      exact = s == d + r * sbytes;
      in_place = "sendbuff == recvbuff + root * sendcount";
      break;
    case Coll::Scatter:  // at the root; elsewhere sendbuff is not used
      exact = d == s + r * rbytes;
      in_place = "recvbuff == sendbuff + root * recvcount";
      break;
    case Coll::AllToAllv:
      exact = false;
      in_place = "(all-to-allv has no in-place form)";
      break;
    default: break;
  }
  if (exact || sbytes == 0 || rbytes == 0) return;
  if (s < d + rbytes && d < s + sbytes)
    bad_arg(cat("sendbuff and recvbuff overlap but are not the in-place form ", in_place));
}

void CommImpl::check_abort() const {
  if (aborted_.load(std::memory_order_relaxed))
    throw Error(chorusInvalidUsage, Subsys::Core, cat("rank ", rank_, ": communicator was aborted"));
  if (bootstrap_->failed()) throw Error(chorusRemoteError, Subsys::Core, peer_failure_text());
}

std::string CommImpl::peer_failure_text() const { return cat("rank ", rank_, ": peer failure: ", peer_failure_what()); }

std::string CommImpl::peer_failure_what() const {
  PeerFailure f = peer_failure();
  // Name the rank even when the text does not.
  std::string who = f.rank >= 0 && f.text.find(cat("rank ", f.rank)) == std::string::npos
                        ? cat("rank ", f.rank, " is gone: ")
                        : std::string();
  return who + f.text;
}

PeerFailure CommImpl::peer_failure() const {
  PeerFailure f = bootstrap_->failure();
  if (!f.root_lost) return f;
  // The root's connection closed: its process is gone. Name the rank whose process hosted it, if one did.
  f.rank = -1;
  for (const PeerInfo& p : peers_)
    if (p.hosts_root && p.rank != rank_) {
      f.rank = p.rank;
      f.text = cat("rank ", p.rank, " is gone (its process hosted the bootstrap root): ", f.text);
      break;
    }
  return f;
}

void CommImpl::fail(const Error& e) {
  std::lock_guard<std::mutex> lock(err_mu_);
  if (broken_ != chorusSuccess) return;
  broken_ = e.code();
  broken_text_ = e.what();
  is_broken_.store(true, std::memory_order_release);
  // Tell everyone, unless the failure came from elsewhere and is already known.
  if (!bootstrap_->failed() && !aborted_) bootstrap_->report_failure(broken_text_);
}

chorusResult_t CommImpl::async_error(std::string* text) const {
  std::lock_guard<std::mutex> lock(err_mu_);
  if (broken_ == chorusSuccess && bootstrap_->failed()) {
    if (text) *text = peer_failure_text();
    return chorusRemoteError;
  }
  if (text) *text = broken_text_;
  return broken_;
}

void CommImpl::abort() {
  aborted_ = true;
  bootstrap_->abort();
  {
    // Places reserved for stream-ordered calls that were never posted fail now (their streams are released), so
    // that nothing waits for a stream that may never get there: a call of another thread queued behind one, first.
    std::lock_guard<std::mutex> lock(q_mu_);
    fail_unposted_places();
  }
  // A call inside the communicator (another thread) sees the flag within a millisecond or so; wait for it to leave
  // so the caller may free the communicator.
  const auto me = std::this_thread::get_id();
  Deadline leave = Deadline::after_ms(timeout_ms_);
  for (;;) {
    std::thread::id owner = owner_.load();
    if (owner == std::thread::id{} || owner == me || leave.passed()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(err_mu_);
  if (broken_ == chorusSuccess) {
    broken_ = chorusInvalidUsage;
    broken_text_ = cat("rank ", rank_, ": communicator was aborted");
    is_broken_.store(true, std::memory_order_release);
  }
}

std::string CommImpl::stop_reason() const {
  if (aborted_.load(std::memory_order_acquire)) return "communicator was aborted";
  if (bootstrap_ != nullptr && bootstrap_->failed()) return peer_failure().text;
  return std::string();
}

void CommImpl::drain() const {
  while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

Transport& CommImpl::choose_transport(int peer) {
  for (auto& t : transports_)
    if (t->can_connect(peers_[rank_], peers_[peer])) return *t;
  // Say why each listed transport cannot: most often it cannot run here at all (not built, no device).
  std::string why;
  for (auto& t : transports_) {
    std::string r = t->unavailable_reason();
    if (r.empty()) r = t->unreachable_reason(peers_[rank_], peers_[peer]);
    if (r.empty()) {
      // Transports that publish what they found (ucx, ibverbs) may be missing on the peer.
      const bool mine = peers_[rank_].transport_caps.count(t->name()) > 0;
      const bool theirs = peers_[peer].transport_caps.count(t->name()) > 0;
      r = mine && !theirs ? cat("unavailable on rank ", peer) : "cannot reach it from here";
    }
    why += cat(why.empty() ? "" : "; ", t->name(), ": ", r);
  }
  throw Error(chorusSystemError, Subsys::Transport,
              cat("rank ", rank_, ": no transport in CHORUS_TRANSPORTS='", param_str(Param::Transports),
                  "' can reach rank ", peer, " (", why, ")"));
}

void CommImpl::for_each_waiting_header(const std::function<void(int, const WireHeader&)>& visit) const {
  // Data at the head of every connection. A connection whose peer has closed it (done with its last call,
  // destroyed) says nothing of a call: only the waits that need that peer report it.
  for (const auto& [pc, conn] : conns_) {
    MessageView m;
    try {
      m = conn->recv_peek();
    } catch (const Error&) {
      continue;
    }
    if (m.header) visit(pc.first, *m.header);
  }
  // Requests for connections, queued in the bootstrap.
  for (const auto& [peer, msg] : bootstrap_->peek(kTagConnect)) {
    if (msg.size() < sizeof(WireHeader)) continue;  // malformed: reported when it is received
    WireHeader h;
    std::memcpy(&h, msg.data(), sizeof(h));
    visit(peer, h);
  }
}

std::vector<std::pair<int, uint64_t>> CommImpl::leave_notes() const {
  std::vector<std::pair<int, uint64_t>> out;
  for (const auto& [peer, note] : bootstrap_->peek(Bootstrap::kTagLeft)) {
    uint64_t last = 0;
    if (note.size() != sizeof(last)) continue;
    std::memcpy(&last, note.data(), sizeof(last));
    out.emplace_back(peer, last);
  }
  return out;
}

void CommImpl::check_peer_calls(const WireHeader& call) const {
  // A peer that destroyed its communicator before this collective (point-to-point calls need not involve it).
  if ((call.seq >> 63) == 0)
    for (const auto& [peer, last] : leave_notes()) {
      if (last < call.seq)
        throw Error(chorusRemoteError, Subsys::Runtime,
                    cat("rank ", peer, " destroyed its communicator after its collective #", last,
                        ", so it takes no part in ", describe_header(call)));
    }
  // A message of this very call with another fingerprint.
  for_each_waiting_header([&](int peer, const WireHeader& theirs) {
    if (theirs.comm_id == call.comm_id && theirs.seq == call.seq && !same_call(theirs, call))
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat("mismatched collective: this rank called ", describe_header(call), " but rank ", peer, " called ",
                      describe_header(theirs)));
  });
}

void CommImpl::check_gone_past(int peer, const WireHeader& call) const {
  if ((call.seq >> 63) != 0) {
    // Point-to-point calls are not sequenced, but a peer that destroyed its communicator takes part in none.
    for (const auto& [from, last] : leave_notes()) {
      if (from != peer) continue;
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat("rank ", peer, " destroyed its communicator (after its collective #", last,
                      "), so it takes no part in ", describe_header(call)));
    }
    return;
  }
  for_each_waiting_header([&](int from, const WireHeader& theirs) {
    if (from == peer && theirs.comm_id == call.comm_id && (theirs.seq >> 63) == 0 && theirs.seq > call.seq)
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat("mismatched collective: this rank called ", describe_header(call),
                      " and needs a connection to rank ", peer, ", but rank ", peer, " went on to ",
                      describe_header(theirs), " without it: it called the first with other arguments"));
  });
}

void CommImpl::ensure_connections(const std::vector<std::pair<int, int>>& needed, const WireHeader& call,
                                  Deadline deadline) {
  std::vector<std::pair<int, int>> missing;
  for (const auto& pc : needed)
    if (!conns_.count(pc)) missing.push_back(pc);
  if (missing.empty()) return;
  // Lower peers first: as the higher rank we connect (tcp) and waits only point to lower ranks, so none cycle.
  std::sort(missing.begin(), missing.end());
  auto spec_of = [&](int peer, int ch) {
    ConnectSpec s;
    s.comm_id = comm_id_;
    s.rank = rank_;
    s.peer = peer;
    s.channel = ch;
    s.slot_bytes = slice_bytes_;
    s.fifo_depth = fifo_depth_;
    s.peer_info = &peers_[peer];
    s.check_abort = [this] { check_abort(); };
    return s;
  };
  std::vector<Transport*> chosen;
  for (auto [peer, ch] : missing) {
    Transport& t = choose_transport(peer);
    chosen.push_back(&t);
    std::vector<std::byte> data = t.prepare(spec_of(peer, ch));
    std::string name = t.name();
    // [the call's header][transport name, NUL][transport data]
    Blob msg(sizeof(WireHeader) + name.size() + 1 + data.size());
    std::memcpy(msg.data(), &call, sizeof(WireHeader));
    std::memcpy(msg.data() + sizeof(WireHeader), name.c_str(), name.size() + 1);
    if (!data.empty()) std::memcpy(msg.data() + sizeof(WireHeader) + name.size() + 1, data.data(), data.size());
    bootstrap_->send(peer, kTagConnect, msg);
  }
  for (size_t i = 0; i < missing.size(); ++i) {
    auto [peer, ch] = missing[i];
    Blob msg;
    // In slices, between which the requests of other peers are checked: a peer that called this collective with
    // other arguments may never ask this rank for the connection waited for here.
    for (bool got = false; !got;) {
      try {
        msg = bootstrap_->recv(peer, kTagConnect, Deadline::after_ms(std::min(100, deadline.remaining_ms())));
        got = true;
      } catch (const Error& e) {
        if (e.code() != chorusTimeout) throw;
        check_peer_calls(call);
        check_gone_past(peer, call);
        if (deadline.passed())
          throw Error(chorusTimeout, Subsys::Transport,
                      cat("timed out waiting for rank ", peer, " to connect (channel ", ch, "): ",
                          (call.seq >> 63) != 0 ? "it has not called a send or receive with this rank"
                                                : "it has not called this collective, or called it with arguments "
                                                  "that need no connection to this rank"));
      }
    }
    if (msg.size() < sizeof(WireHeader) + 1)
      throw Error(chorusRemoteError, Subsys::Transport, cat("rank ", peer, " sent a malformed connection request"));
    WireHeader theirs;
    std::memcpy(&theirs, msg.data(), sizeof(theirs));
    if (!same_call(theirs, call))
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat("mismatched collective: this rank called ", describe_header(call), " but rank ", peer, " called ",
                      describe_header(theirs)));
    msg.erase(msg.begin(), msg.begin() + sizeof(WireHeader));
    auto nul = std::find(msg.begin(), msg.end(), std::byte{0});
    std::string name(reinterpret_cast<const char*>(msg.data()), static_cast<size_t>(nul - msg.begin()));
    if (nul == msg.end() || name != chosen[i]->name())
      throw Error(chorusInvalidUsage, Subsys::Transport,
                  cat("rank ", rank_, ": rank ", peer, " chose transport '", name, "' but this rank chose '",
                      chosen[i]->name(), "' (CHORUS_TRANSPORTS differs between ranks?)"));
    std::vector<std::byte> data(nul + 1, msg.end());
    try {
      conns_[{peer, ch}] = chosen[i]->connect(spec_of(peer, ch), data, deadline);
    } catch (const Error& e) {
      throw Error(e.code(), Subsys::Transport,
                  cat("connecting to rank ", peer, " (channel ", ch, ") over ", name, ": ", e.what()));
    }
    CHORUS_INFO(Transport, "rank %d: connected to rank %d channel %d over %s", rank_, peer, ch, name.c_str());
  }
  for (auto [peer, ch] : missing) bootstrap_->send(peer, kTagConnected, {});
  for (size_t i = 0; i < missing.size(); ++i) {
    auto [peer, ch] = missing[i];
    bootstrap_->recv(peer, kTagConnected, deadline);
    chosen[i]->finish(spec_of(peer, ch));
  }
}

void CommImpl::throw_if_broken() const {
  if (is_broken_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(err_mu_);
    throw Error(broken_, Subsys::Core, broken_text_);
  }
}

void CommImpl::run(const CollArgs& a) {
  throw_if_broken();
  try {
    check_abort();
  } catch (const Error& e) {
    // The first call to find a failure that happened elsewhere names itself, and breaks the communicator with
    // that error: every later call (and the async error) returns it unchanged.
    const std::string call =
        a.coll == Coll::SendRecv ? std::string("SendRecv") : cat(algo::coll_name(a.coll), " #", seq_ + 1);
    Error named(e.code(), e.subsys(), cat("rank ", rank_, ": ", call, ": ", without_rank_prefix(e.what())));
    fail(named);
    throw named;
  }
  WireHeader hdr;
  hdr.comm_id = comm_id_;
  hdr.coll = static_cast<uint8_t>(a.coll);
  ActivityScope in_call(activity_, a.coll == Coll::SendRecv ? kInPointToPoint : kInCollective);
  // Every failure of a call breaks the communicator and is told to every rank, whatever threw it.
  try {
    run_call(a, hdr);
  } catch (const Error& e) {
    fail_call(e, hdr);
  } catch (const std::bad_alloc&) {
    fail_call(Error(chorusSystemError, Subsys::Core, "out of memory"), hdr);
  } catch (const std::exception& e) {
    fail_call(Error(chorusInternalError, Subsys::Core, cat("internal error: ", e.what())), hdr);
  }
}

CommImpl::Diagnosis CommImpl::diagnose_timeout(const WireHeader* call) {
  try {
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_) bootstrap_->send(r, Bootstrap::kTagStatus, {});
  } catch (const Error&) {
    return {};
  }
  // A point-to-point group is not sequenced: what matters is whether its peers were in a point-to-point call at all.
  const bool p2p = call != nullptr && (call->seq >> 63) != 0;
  // The root relays every question and answer: a little longer for more ranks.
  const int64_t window_ms = std::min<int64_t>(1000 + 2 * nranks_, 10000);
  const Deadline answers = Deadline::after_ms(window_ms);
  std::vector<std::string> absent, silent, left, in_p2p;
  // A point-to-point group's own peers are listed first, then the ranks they may be waiting for.
  std::vector<int> order;
  if (p2p)
    for (int peer : p2p_peers_) order.push_back(peer);
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && std::find(order.begin(), order.end(), r) == order.end()) order.push_back(r);
  Diagnosis d;
  auto group_peer = [&](int r) {
    return p2p && std::find(p2p_peers_.begin(), p2p_peers_.end(), r) != p2p_peers_.end();
  };
  for (int r : order) {
    Blob b;
    try {
      b = bootstrap_->recv(r, Bootstrap::kTagStatusReply, answers);
    } catch (const Error& e) {
      if (e.code() != chorusTimeout) return {};  // a failure elsewhere: it will be the error
      silent.push_back(cat(r));
      d.group_peer_stuck = d.group_peer_stuck || group_peer(r);
      continue;
    }
    uint64_t started = 0;
    if (b.size() == 1) {  // the root answered for a rank that has left (Bootstrap::kTagStatusReply)
      left.push_back(cat(r));
      continue;
    }
    if (b.size() != sizeof(started) + 1) continue;
    std::memcpy(&started, b.data(), sizeof(started));
    const auto doing = static_cast<uint8_t>(b[sizeof(started)]);
    const char* now = doing == kInCollective     ? "running collective #"
                      : doing == kInSplit        ? "in chorusCommSplit after collective #"
                      : doing == kInPointToPoint ? "in a point-to-point call after collective #"
                                                 : "idle after collective #";
    if (p2p) {
      if (doing == kInPointToPoint) {
        in_p2p.push_back(cat(r));
      } else {
        absent.push_back(cat(r, " (", now, started, ")"));
        d.group_peer_stuck = d.group_peer_stuck || group_peer(r);
      }
    } else if (call != nullptr && started < call->seq) {
      absent.push_back(cat(r, " (its last was #", started,
                           doing == kInCollective     ? ", still running"
                           : doing == kInSplit        ? ", in chorusCommSplit"
                           : doing == kInPointToPoint ? ", in a point-to-point call"
                                                      : ", now idle",
                           ")"));
    } else if (call == nullptr && doing != kInSplit) {
      absent.push_back(cat(r, " (", now, started, ")"));
    }
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 8; ++i) s += cat(i ? ", " : "", v[i]);
    return v.size() > 8 ? cat(s, " and ", v.size() - 8, " more") : s;
  };
  std::string& out = d.suffix;
  const std::string what = p2p               ? std::string("a point-to-point call")
                           : call != nullptr ? cat("collective #", call->seq)
                                             : std::string("chorusCommSplit");
  if (!absent.empty()) out += cat("; at the timeout, rank(s) ", list(absent), " had not called ", what);
  if (p2p && !in_p2p.empty())
    out += cat("; rank(s) ", list(in_p2p), " were in a point-to-point call too (waiting on a rank, or in a cycle)");
  if (!left.empty()) out += cat("; rank(s) ", list(left), " had left (destroyed its communicator, or exited)");
  if (!silent.empty() && silent.size() == static_cast<size_t>(nranks_ - 1)) {
    out += cat("; no rank answered a status question within ", window_ms,
               " ms (the bootstrap root, which relays them, may be stopped or unreachable: it runs in the process "
               "that made the unique id, rank 0's under launchers)");
  } else if (!silent.empty()) {
    const std::string key = cat("rank(s) ", list(silent), " did not answer a status question");
    const std::string clause = cat(key, " within ", window_ms, " ms (stopped, hung, slow or unreachable)");
    // Every rank that answered had called this collective: the silent ones are what it waits for, whichever
    // neighbour this rank's own wait names (that one is often waiting too).
    if (out.empty()) {
      d.lead = clause;
      d.lead_key = key;
    } else {
      out += "; " + clause;
    }
  }
  if (out.empty() && d.lead.empty()) out = cat("; at the timeout, every rank had called ", what);
  return d;
}

void CommImpl::fail_call(const Error& e, const WireHeader& hdr) {
  // Every error of a call reads "rank R: AllReduce #5: what happened".
  const std::string what = describe_call(rank_, hdr);
  std::string text = e.what();
  const std::string self = cat("rank ", rank_, ": ");
  if (text.rfind(what + ": ", 0) == 0) text.erase(0, what.size() + 2);
  if (text.rfind(self, 0) == 0) text.erase(0, self.size());
  text = what + ": " + text;
  if (aborted_.load(std::memory_order_acquire)) {
    // The abort is the cause, whatever the executor saw first (often the bootstrap's own closed connection, which
    // a failed wait would blame on the peer it waited for).
    Error aborted(chorusInvalidUsage, Subsys::Core, cat(what, ": communicator was aborted"));
    fail(aborted);
    throw aborted;
  }
  // A local symptom (a closed socket, a refused connection, a timeout) usually follows a failure elsewhere that the
  // bootstrap is about to announce; wait briefly for it so the error names the root cause. Errors this rank found
  // itself (a mismatched header: Runtime) are the root cause already.
  const bool symptom = e.subsys() == Subsys::Transport || e.code() == chorusTimeout;
  // A timeout names the peer waited for, which may itself be waiting: ask every rank how far it is.
  bool group_peer_stuck = false;
  const std::string symptom_here = text.substr(what.size() + 2);
  std::string lead_key;  // this rank's diagnosis, as a peer's report that leads with the same one would say it
  if (!aborted_ && e.code() == chorusTimeout && hdr.seq != 0 && !bootstrap_->failed()) {
    const Diagnosis d = diagnose_timeout(&hdr);
    group_peer_stuck = d.group_peer_stuck;
    lead_key = d.lead_key;
    if (d.lead.empty())
      text += d.suffix;
    else
      text = cat(what, ": ", d.lead, d.suffix, " (seen here as: ", text.substr(what.size() + 2), ")");
  }
  // A peer that destroyed its communicator before this collective closed its connections on the way out: the
  // symptom here (over tcp, a connection closed by the peer) has that cause, which its goodbye note tells.
  // Point-to-point groups are not sequenced: there, a peer of the group that left at all is the cause, unless
  // another peer of the group, still there, had not called (the one that left may have done its part first).
  auto departed = [&]() -> std::optional<std::pair<int, uint64_t>> {
    if (hdr.seq == 0) return std::nullopt;
    const bool p2p = (hdr.seq >> 63) != 0;
    if (p2p && group_peer_stuck) return std::nullopt;
    for (const auto& [peer, last] : leave_notes())
      if (p2p ? std::find(p2p_peers_.begin(), p2p_peers_.end(), peer) != p2p_peers_.end() : last < hdr.seq)
        return std::make_pair(peer, last);
    return std::nullopt;
  };
  if (!aborted_ && symptom) {
    Deadline grace = Deadline::after_ms(std::min<int64_t>(1000, timeout_ms_));
    while (!bootstrap_->failed() && !departed() && !grace.passed())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (const auto gone = departed(); gone && !bootstrap_->failed()) {
      Error remote(chorusRemoteError, Subsys::Core,
                   cat(what, ": rank ", gone->first, " destroyed its communicator after its collective #", gone->second,
                       ", so it takes no part in ", describe_header(hdr), " (seen here as: ", text, ")"));
      fail(remote);
      throw remote;
    }
  }
  if (bootstrap_->failed() && text.find("peer failure") == std::string::npos) {
    PeerFailure f = peer_failure();
    if (f.rank != rank_) {
      // A peer's report that leads with this rank's own diagnosis (the same silent ranks) is not said twice: what
      // this rank saw itself follows.
      const std::string peer = peer_failure_what();
      const bool same_lead = !lead_key.empty() && peer.find(lead_key) != std::string::npos;
      Error remote(chorusRemoteError, Subsys::Core,
                   cat(what, ": peer failure: ", peer, " (seen here as: ", same_lead ? symptom_here : text, ")"));
      fail(remote);
      throw remote;
    }
  }
  Error named(e.code(), e.subsys(), text, e.where());
  fail(named);
  throw named;
}

namespace {
// The executor's view of a codec (kernels/cpu/codec.h) for one call: the rank and step key stochastic rounding, and
// the step picks the rotation (a fresh D every step).
class CpuWireCodec final : public WireCodec {
 public:
  CpuWireCodec(const kernels::codec::Codec& c, uint32_t rank, uint64_t step) : c_(c), rank_(rank), step_(step) {
    if (c_.rotation) c_.seed = kernels::codec::rotation_seed_for_step(c.seed, step);
  }
  size_t encoded_bytes(size_t elems) const override { return kernels::codec::encoded_bytes(c_, elems); }
  size_t block_elems() const override { return kernels::codec::record_elems(c_); }
  void encode(const float* in, size_t elems, std::byte* out, uint64_t first_elem) const override {
    kernels::codec::EncodeCtx ctx;
    ctx.step = step_;
    ctx.rank = rank_;
    ctx.first_elem = first_elem;
    kernels::codec::encode(c_, in, elems, out, ctx);
  }
  void decode(const std::byte* in, size_t elems, float* out) const override {
    kernels::codec::decode(c_, in, elems, out);
  }
  void decode_accumulate(const std::byte* in, size_t elems, float* acc) const override {
    kernels::codec::decode_accumulate(c_, in, elems, acc);
  }

 private:
  kernels::codec::Codec c_;
  uint32_t rank_;
  uint64_t step_;
};

// Bits 0-3: codec kind + 1; bit 4: stochastic rounding; bit 5: rotation; bits 6-16: block / 32 (2047: larger);
// bits 17-30: a hash of the block, seed and step. executor.cc's header description prints the fields by name.
int32_t codec_fingerprint(const kernels::codec::Codec& c, uint64_t step) {
  const uint32_t block = kernels::codec::block_elems(c);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  const bool seeded = c.stochastic_rounding || c.rotation;
  for (uint64_t v : {uint64_t{block}, seeded ? c.seed : 0, seeded ? step : 0}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
  }
  return static_cast<int32_t>((static_cast<uint32_t>(c.kind) + 1) | (c.stochastic_rounding ? 16u : 0u) |
                              (c.rotation ? 32u : 0u) | std::min<uint32_t>(block / 32, 2047u) << 6 |
                              static_cast<uint32_t>((h >> 40) & 0x3fffu) << 17);
}

}  // namespace

const algo::AlgorithmInfo& CommImpl::compressed_algorithm(const CollArgs& a) const {
  // Error feedback and the majority vote live in the one-level quantize-once schedule (a residual and a vote per
  // rank): an all-reduce that asks for them (or for qonce) with them runs qonce-flat.
  const bool per_rank = a.error_feedback || a.codec.kind == kernels::codec::CodecKind::SignVote;
  if (per_rank && (a.algorithm.empty() || a.algorithm == "qonce"))
    return *algo::find_compressed_algorithm(a.coll, a.coll == Coll::AllReduce ? "qonce-flat" : "qonce");
  if (a.algorithm.empty()) return algo::default_compressed_algorithm(a.coll, selector_->host_of_rank());
  const algo::AlgorithmInfo* info = algo::find_compressed_algorithm(a.coll, a.algorithm);
  if (info == nullptr)
    bad_arg(cat("options->algorithm='", a.algorithm, "' is not a compressed schedule for ", algo::coll_name(a.coll),
                " (known: ", algo::compressed_algorithm_names(a.coll), ")"));
  return *info;
}

void CommImpl::validate_compression(const CollArgs& a) const {
  if (a.coll != Coll::AllReduce && a.coll != Coll::ReduceScatter && a.coll != Coll::AllGather)
    bad_arg(
        cat("options->compression is for all-reduce, reduce-scatter and all-gather, not ", algo::coll_name(a.coll)));
  try {
    if (a.coll == Coll::AllGather) {
      kernels::codec::validate(a.codec, a.dtype, chorusSum);
      if (a.codec.kind == kernels::codec::CodecKind::SignVote)
        bad_arg("options->compression->codec=sign_vote is a reduction (majority vote): not for all-gather");
    } else {
      if (a.op >= chorusNumOps)
        bad_arg(cat("op=", static_cast<int>(a.op), " is a pre-multiplied sum: compression supports sum and avg"));
      kernels::codec::validate(a.codec, a.dtype, a.op);
      if (a.codec.kind == kernels::codec::CodecKind::SignVote && a.op != chorusSum)
        bad_arg(cat("options->compression->codec=sign_vote needs op=sum (the result is the majority sign), not op=",
                    op_name(a.op)));
    }
  } catch (const Error& e) {
    if (e.code() != chorusInvalidArgument) throw;
    bad_arg(cat("options->compression: ", e.what()));
  }
  const algo::AlgorithmInfo& info = compressed_algorithm(a);
  const std::string name = info.name;
  const bool vote = a.codec.kind == kernels::codec::CodecKind::SignVote;
  if (vote && (a.coll != Coll::AllReduce || name != "qonce-flat"))
    bad_arg(
        cat("options->compression->codec=sign_vote is a majority vote: all-reduce with the qonce schedule only, "
            "not ",
            algo::coll_name(a.coll), " with '", name, "' (partial sums of signs are not votes)"));
  if (vote && a.error_feedback != nullptr)
    bad_arg("options->compression->error_feedback: sign_vote has no error feedback (a vote carries no magnitude)");
  if (name == "hier") {
    const std::vector<int>& hosts = selector_->host_of_rank();
    if (std::all_of(hosts.begin(), hosts.end(), [&](int h) { return h == hosts.front(); }))
      bad_arg(
          "options->algorithm='hier' compresses only between hosts, and every rank is on one host: nothing would "
          "be compressed (use 'qonce')");
  }
  try {
    selector_->program(info, 0);
  } catch (const std::invalid_argument& e) {
    bad_arg(cat("options->algorithm='", info.name, "' does not apply to this communicator: ", e.what()));
  }
  // Slices are whole records; a slice's plain fp32 messages (inside a host for hier) must fit a slot too.
  const size_t rec = kernels::codec::record_elems(a.codec);
  if (rec * sizeof(float) > slice_bytes_)
    bad_arg(cat("options->compression: one record of the codec (", rec, " elements, ", rec * sizeof(float),
                " bytes of float32) does not fit CHORUS_SLICE_BYTES=", slice_bytes_, ": use a smaller block"));
  if (a.error_feedback == nullptr) return;
  if (name != "qonce" && name != "qonce-flat")
    bad_arg(cat("options->compression->error_feedback needs the qonce schedule, not '", info.name, "'"));
  if (a.coll == Coll::AllGather)
    bad_arg("options->compression->error_feedback is for reductions (all-reduce, reduce-scatter), not all-gather");
  const size_t need = error_feedback_elems(a);
  if (a.error_feedback_elems < need)
    bad_arg(cat("options->compression->error_feedback_elems=", a.error_feedback_elems,
                " is too small: ", algo::coll_name(a.coll), " of count ", a.count, " needs ", need));
  // The residual is read and written while the buffers are: it must not share bytes with them.
  const auto* ef = reinterpret_cast<const std::byte*>(a.error_feedback);
  const size_t ef_bytes = need * sizeof(float);
  const size_t in_bytes = (a.coll == Coll::ReduceScatter ? nranks_ : 1) * a.count * dtype_size(a.dtype);
  const size_t out_bytes = a.count * dtype_size(a.dtype);
  auto overlaps = [&](const void* p, size_t bytes) {
    const auto* b = static_cast<const std::byte*>(p);
    return b != nullptr && bytes > 0 && ef < b + bytes && b < ef + ef_bytes;
  };
  if (overlaps(a.send, in_bytes) || overlaps(a.recv, out_bytes))
    bad_arg("options->compression->error_feedback overlaps sendbuff or recvbuff");
}

size_t CommImpl::error_feedback_elems(const CollArgs& a) const {
  return a.coll == Coll::AllReduce ? 2 * a.count : static_cast<size_t>(nranks_) * a.count;
}

bool CommImpl::widens(const CollArgs& a) const {
  if (a.dtype == chorusFloat32) return false;
  if (a.compressed) return true;  // validated: fp16 or bf16
  return fp32_partials_ && dtype_is_narrow_float(a.dtype) && is_reduction(a.coll) && a.op != chorusMax &&
         a.op != chorusMin;
}

void CommImpl::run_widened(const CollArgs& a, WireHeader& hdr) {
  const size_t n = static_cast<size_t>(nranks_);
  const size_t in_elems = (a.coll == Coll::ReduceScatter ? n : 1) * a.count;
  const size_t out_elems = (a.coll == Coll::AllGather ? n : 1) * a.count;
  // Only a reduce's root receives; elsewhere its recvbuff is not to be written (and may be NULL).
  const bool receives = a.coll != Coll::Reduce || a.root == rank_;
  if (widened_.size() < in_elems + out_elems) {
    try {
      widened_.resize(in_elems + out_elems);
    } catch (const std::bad_alloc&) {
      hdr.seq = seq_ + 1;  // the number the call would have had, as its peers number it
      throw Error(
          chorusSystemError, Subsys::Core,
          cat("out of memory for the float32 copies of this call's data (", (in_elems + out_elems) * 4, " bytes; ",
              a.compressed ? "compressed calls on 16-bit data" : "CHORUS_FP32_PARTIALS=1", " reduce in float32)"));
    }
  }
  CollArgs w = a;
  w.dtype = chorusFloat32;
  w.widened_from = a.dtype;
  w.send = widened_.data();
  w.recv = widened_.data() + in_elems;
  kernels::widen_to_float(a.dtype, a.send, widened_.data(), in_elems);  // before anything is written: in place
  run_call(w, hdr);
  if (receives) kernels::narrow_from_float(a.dtype, widened_.data() + in_elems, a.recv, out_elems);
}

std::string CommImpl::last_algorithm() const {
  const int id = last_algorithm_.load(std::memory_order_relaxed);
  if (id == kDeviceDirect) return "device-direct";
  const algo::AlgorithmInfo* info = id == kNoAlgorithm ? nullptr : algo::algorithm_by_id(id);
  return info != nullptr ? info->name : "";
}

void CommImpl::run_call(const CollArgs& a, WireHeader& hdr) {
  if (widens(a)) return run_widened(a, hdr);
  const Deadline deadline = Deadline::after_ms(timeout_ms_);
  const int n = nranks_;
  const size_t esz = a.coll == Coll::SendRecv ? 1 : dtype_size(a.coll == Coll::Barrier ? chorusUint8 : a.dtype);

  const algo::Program* shared_prog = nullptr;  // owned by the algorithm cache
  std::shared_ptr<const algo::Program> compressed_prog;
  algo::RankProgram p2p_prog;
  const algo::RankProgram* prog = nullptr;
  Layout layout;
  layout.elem_size = esz;

  if (a.coll == Coll::SendRecv) {
    // Self-sends pair with self-receives in order; everything else becomes one lane per (peer, direction).
    std::vector<const P2POp*> self_send, self_recv;
    std::map<std::pair<int, bool>, algo::Lane> lanes;
    std::vector<std::byte*> in_ptr, out_ptr;
    p2p_peers_.clear();
    for (const P2POp& op : a.p2p)
      if (op.peer != rank_ && std::find(p2p_peers_.begin(), p2p_peers_.end(), op.peer) == p2p_peers_.end())
        p2p_peers_.push_back(op.peer);
    std::vector<size_t> in_len, out_len;
    for (const P2POp& op : a.p2p) {
      size_t bytes = op.count * dtype_size(op.dtype);
      if (op.peer == rank_) {
        (op.is_send ? self_send : self_recv).push_back(&op);
        continue;
      }
      algo::Lane& lane = lanes[{op.peer, op.is_send}];
      if (op.is_send) {
        lane.steps.push_back(
            {algo::OpCode::Send, -1, op.peer, {BufKind::Input, static_cast<int>(in_ptr.size())}, {}, false});
        in_ptr.push_back(static_cast<std::byte*>(op.buf));
        in_len.push_back(bytes);
      } else {
        lane.steps.push_back(
            {algo::OpCode::Recv, op.peer, -1, {}, {BufKind::Output, static_cast<int>(out_ptr.size())}, false});
        out_ptr.push_back(static_cast<std::byte*>(op.buf));
        out_len.push_back(bytes);
      }
    }
    CHORUS_ASSERT(self_send.size() == self_recv.size());  // validate() paired them, of equal sizes
    // Sends read their buffers as they were when the group was issued: a send whose bytes a receive of the same
    // group (from a peer or from itself) may overwrite is staged first.
    std::vector<std::pair<const std::byte*, size_t>> written;
    for (size_t j = 0; j < out_ptr.size(); ++j) written.push_back({out_ptr[j], out_len[j]});
    for (const P2POp* op : self_recv)
      written.push_back({static_cast<const std::byte*>(op->buf), op->count * dtype_size(op->dtype)});
    auto overlap = [](const std::byte* a, size_t al, const std::byte* b, size_t bl) {
      return al > 0 && bl > 0 && a < b + bl && b < a + al;
    };
    size_t staged = 0;
    std::vector<size_t> stage_at(in_ptr.size(), SIZE_MAX);
    for (size_t i = 0; i < in_ptr.size(); ++i)
      for (const auto& [wp, wl] : written)
        if (overlap(in_ptr[i], in_len[i], wp, wl)) {
          stage_at[i] = staged;
          staged += in_len[i];
          break;
        }
    // Self-sends are copies made in group order, before any message from a peer can land in their source; one whose
    // source an earlier self-receive of the group overwrites is staged too.
    std::vector<const std::byte*> self_src(self_send.size());
    std::vector<size_t> self_len(self_send.size()), self_stage_at(self_send.size(), SIZE_MAX);
    for (size_t i = 0; i < self_send.size(); ++i) {
      self_src[i] = static_cast<const std::byte*>(self_send[i]->buf);
      self_len[i] = self_send[i]->count * dtype_size(self_send[i]->dtype);
      for (size_t j = 0; j < i; ++j)
        if (overlap(self_src[i], self_len[i], static_cast<const std::byte*>(self_recv[j]->buf), self_len[j])) {
          self_stage_at[i] = staged;
          staged += self_len[i];
          break;
        }
    }
    if (staged > 0) {
      if (staging_.size() < staged) staging_.resize(staged);
      for (size_t i = 0; i < in_ptr.size(); ++i)
        if (stage_at[i] != SIZE_MAX) {
          std::memcpy(staging_.data() + stage_at[i], in_ptr[i], in_len[i]);
          in_ptr[i] = staging_.data() + stage_at[i];
        }
      for (size_t i = 0; i < self_src.size(); ++i)
        if (self_stage_at[i] != SIZE_MAX) {
          std::memcpy(staging_.data() + self_stage_at[i], self_src[i], self_len[i]);
          self_src[i] = staging_.data() + self_stage_at[i];
        }
    }
    for (size_t i = 0; i < self_send.size(); ++i)
      if (self_len[i] > 0 && self_src[i] != self_recv[i]->buf)
        std::memmove(self_recv[i]->buf, self_src[i], self_len[i]);
    for (auto& [key, lane] : lanes) p2p_prog.lanes.push_back(std::move(lane));
    p2p_prog.input = {static_cast<int>(in_ptr.size()), 1};
    p2p_prog.output = {static_cast<int>(out_ptr.size()), 1};
    layout.set_blocks(BufKind::Input, in_ptr, in_len, 1);
    layout.set_blocks(BufKind::Output, out_ptr, out_len, 1);
    prog = &p2p_prog;
    note_algorithm(kNoAlgorithm);  // a point-to-point call runs no algorithm
    hdr.seq = uint64_t{1} << 63;   // p2p is not sequenced with collectives; sizes are still checked per message
  } else {
    if (a.compressed) {
      // Compressed schedules are named (or defaulted), not chosen by the cost model.
      const algo::AlgorithmInfo& info = compressed_algorithm(a);
      compressed_prog = selector_->program(info, 0);
      shared_prog = compressed_prog.get();
      hdr.algo = static_cast<uint16_t>(info.id);
    } else {
      std::shared_ptr<const algo::Choice> choice =
          selector_->choose(a.coll, a.count, esz, a.root, a.algorithm.empty() ? nullptr : a.algorithm.c_str());
      shared_prog = choice->program.get();
      hdr.algo = static_cast<uint16_t>(choice->algorithm->id);
    }
    note_algorithm(hdr.algo);
    prog = &shared_prog->ranks[rank_];
    hdr.seq = ++seq_;
    started_.store(seq_, std::memory_order_relaxed);
    hdr.count = a.coll == Coll::AllToAllv ? 0 : a.count;
    hdr.dtype = static_cast<uint8_t>(a.widened_from != chorusNumTypes ? a.widened_from : a.dtype);
    hdr.op = static_cast<uint8_t>(is_reduction(a.coll) ? std::min<int>(a.op, chorusNumOps) : 0);
    hdr.root = algo::rooted(a.coll) ? a.root : 0;
    // Compressed calls are not rooted: the root field carries the codec's fingerprint instead, so ranks that
    // pass different codecs, blocks or rounding keys get a mismatch error instead of decoding garbage.
    if (a.compressed) hdr.root = codec_fingerprint(a.codec, a.codec_step);
    // The API fixes the blocks of each buffer (algo::call_blocks, which the simulator maps chunks with too); the
    // program fixes how many parts each block is cut into.
    void* send = const_cast<void*>(a.send);
    const int pin = prog->input.parts, pout = prog->output.parts;
    const algo::BlockShape bin = algo::call_blocks(a.coll, BufKind::Input, a.count, n, *prog);
    const algo::BlockShape bout = algo::call_blocks(a.coll, BufKind::Output, a.count, n, *prog);
    switch (a.coll) {
      case Coll::AllToAll:
        if (send != nullptr && send == a.recv) {
          // In place: the pairwise exchange would overwrite blocks it has yet to send, so stage the input.
          size_t bytes = a.count * n * esz;
          if (staging_.size() < bytes) staging_.resize(bytes);
          if (bytes > 0) std::memcpy(staging_.data(), send, bytes);
          send = staging_.data();
        }
        [[fallthrough]];
      case Coll::AllReduce:
      case Coll::Barrier:
      case Coll::Broadcast:
      case Coll::Reduce:
      case Coll::AllGather:
      case Coll::ReduceScatter:
      case Coll::Gather:
      case Coll::Scatter:
        layout.set_uniform(BufKind::Input, send, bin.nblocks, bin.block_elems, pin);
        layout.set_uniform(BufKind::Output, a.recv, bout.nblocks, bout.block_elems, pout);
        break;
      case Coll::AllToAllv: {
        std::vector<std::byte*> ip(n), op(n);
        for (int i = 0; i < n; ++i) {
          ip[i] = a.send ? static_cast<std::byte*>(send) + a.sdispls[i] * esz : nullptr;
          op[i] = a.recv ? static_cast<std::byte*>(a.recv) + a.rdispls[i] * esz : nullptr;
        }
        layout.set_blocks(BufKind::Input, ip, a.sendcounts, pin);
        layout.set_blocks(BufKind::Output, op, a.recvcounts, pout);
        break;
      }
      default: throw Error(chorusInternalError, Subsys::Core, "unhandled collective");
    }
    if (prog->scratch.nblocks > 0) {
      // Scratch blocks are the size of the output's; the buffer lives as long as the communicator.
      const algo::BlockShape bs = algo::call_blocks(a.coll, BufKind::Scratch, a.count, n, *prog);
      size_t bytes = static_cast<size_t>(bs.nblocks) * bs.block_elems * esz;
      if (scratch_.size() < bytes) scratch_.resize(bytes);
      layout.set_uniform(BufKind::Scratch, scratch_.data(), bs.nblocks, bs.block_elems, prog->scratch.parts);
    }
  }

  std::optional<kernels::Reducer> reducer;
  if (is_reduction(a.coll) || a.coll == Coll::Barrier) reducer.emplace(reduce_spec(a));

  {
    // Connections and per-step connection table: built once per program and cached (the selector holds its
    // programs as long as the communicator lives); point-to-point programs are built per call.
    Wiring scratch_wiring;
    Wiring* wiring = nullptr;
    if (shared_prog) {
      auto it = wirings_.find(prog);
      if (it != wirings_.end()) wiring = &it->second;
    }
    if (wiring == nullptr) {
      std::set<std::pair<int, int>> needed;
      for (const algo::Lane& lane : prog->lanes)
        for (const algo::Step& s : lane.steps) {
          if (algo::op_receives(s.op)) needed.insert({s.recv_peer, lane.channel});
          if (algo::op_sends(s.op)) needed.insert({s.send_peer, lane.channel});
        }
      ensure_connections({needed.begin(), needed.end()}, hdr, deadline);
      wiring = shared_prog ? &wirings_[prog] : &scratch_wiring;
      for (const auto& pc : needed) wiring->all_conns.push_back(conns_.at(pc).get());
      wiring->conns.resize(prog->lanes.size());
      for (size_t l = 0; l < prog->lanes.size(); ++l) {
        const algo::Lane& lane = prog->lanes[l];
        for (const algo::Step& s : lane.steps) {
          StepConns c;
          if (algo::op_receives(s.op)) c.recv = conns_.at({s.recv_peer, lane.channel}).get();
          if (algo::op_sends(s.op)) c.send = conns_.at({s.send_peer, lane.channel}).get();
          wiring->conns[l].push_back(c);
        }
      }
    }

    ExecPlan plan;
    plan.program = prog;
    plan.layout = &layout;
    plan.reducer = reducer ? &*reducer : nullptr;
    plan.slice_elems = std::max<size_t>(1, slice_bytes_ / esz);
    std::optional<CpuWireCodec> codec;
    Layout residual;
    if (a.compressed) {
      codec.emplace(a.codec, static_cast<uint32_t>(rank_), a.codec_step);
      plan.codec = &*codec;
      // Slices end on record boundaries, so no scale block straddles two slices (or two ranks' chunks).
      const size_t rec = codec->block_elems();
      plan.slice_elems = std::max(rec, plan.slice_elems / rec * rec);
      if (a.error_feedback) {
        residual.elem_size = sizeof(float);
        const algo::BlockShape bin = algo::call_blocks(a.coll, BufKind::Input, a.count, n, *prog);
        residual.set_uniform(BufKind::Input, a.error_feedback, bin.nblocks, bin.block_elems, prog->input.parts);
        if (prog->scratch.nblocks > 0) {
          const algo::BlockShape bs = algo::call_blocks(a.coll, BufKind::Scratch, a.count, n, *prog);
          residual.set_uniform(BufKind::Scratch, a.error_feedback + bin.nblocks * bin.block_elems, bs.nblocks,
                               bs.block_elems, prog->scratch.parts);
        }
        plan.residual = &residual;
      }
    }
    plan.header = hdr;
    plan.deadline = deadline;
    plan.check_abort = [this] { check_abort(); };
    plan.check_peers = [this, &hdr] { check_peer_calls(hdr); };
    plan.rank = rank_;
    plan.spin_us = oversubscribed_ ? 0 : 20;
    plan.yield_us = oversubscribed_ ? yield_us_ : 0;
    plan.conns = &wiring->conns;
    plan.all_conns = &wiring->all_conns;
    execute(plan);
  }
}

void CommImpl::run_blocking(CollArgs a) {
  // With nothing pending the call runs here, without a hand-off; the worker does not start queued work (a place a
  // CUDA host function reserves meanwhile) until it is done.
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (pending_.load(std::memory_order_acquire) == 0) here = inline_busy_ = true;
  }
  if (here) {
    struct Done {
      CommImpl& c;
      ~Done() {
        std::lock_guard<std::mutex> lock(c.q_mu_);
        c.inline_busy_ = false;
        c.q_cv_.notify_all();
      }
    } done{*this};
    run(a);
    return;
  }
  auto req = std::make_shared<RequestState>();
  {
    std::unique_lock<std::mutex> lock(q_mu_);
    pending_.fetch_add(1, std::memory_order_acq_rel);
    queue_.push_back(Work{std::move(a), req, true, false, nullptr});
    q_cv_.notify_all();
  }
  std::unique_lock<std::mutex> lock(req->mu);
  req->cv.wait(lock, [&] { return req->done; });
  if (req->result != chorusSuccess) throw Error(req->result, Subsys::Core, req->error);
}

std::shared_ptr<RequestState> CommImpl::submit(CollArgs a) {
  auto req = std::make_shared<RequestState>();
  std::unique_lock<std::mutex> lock(q_mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  pending_.fetch_add(1, std::memory_order_acq_rel);
  queue_.push_back(Work{std::move(a), req, true, false, nullptr});
  q_cv_.notify_all();
  return req;
}

std::shared_ptr<RequestState> CommImpl::reserve(std::function<void(chorusResult_t)> on_done) {
  auto req = std::make_shared<RequestState>();
  std::unique_lock<std::mutex> lock(q_mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  pending_.fetch_add(1, std::memory_order_acq_rel);
  // After an abort (which marked the places of that moment) a new place fails at once: no post is waited for.
  const bool dead = aborted_.load();
  queue_.push_back(Work{CollArgs{}, req, dead, dead, std::move(on_done)});
  if (dead) q_cv_.notify_all();
  return req;
}

void CommImpl::fail_unposted_places() {
  for (Work& w : queue_)
    if (!w.ready) {
      w.ready = true;
      w.aborted = true;
    }
  q_cv_.notify_all();
}

bool CommImpl::post(const std::shared_ptr<RequestState>& place, CollArgs a) {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (Work& w : queue_)
    if (w.req == place && !w.ready) {
      w.args = std::move(a);
      w.ready = true;
      q_cv_.notify_all();
      return true;
    }
  // Not waiting for its post: an abort came first, and the place fails without running (its on_done runs on the
  // worker, once); the caller must not complete it a second time.
  return false;
}

bool CommImpl::cancel(const std::shared_ptr<RequestState>& place) {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if (it->req == place && !it->ready) {
      queue_.erase(it);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      q_cv_.notify_all();
      return true;
    }
  return false;
}

void CommImpl::fail_place(const std::shared_ptr<RequestState>& place) noexcept {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (Work& w : queue_)
    if (w.req == place && !w.ready) {
      w.ready = true;
      w.aborted = true;
      q_cv_.notify_all();
      return;
    }
}

void CommImpl::worker_loop() {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (;;) {
    q_cv_.wait(lock,
               [&] { return (stop_ && queue_.empty()) || (!inline_busy_ && !queue_.empty() && queue_.front().ready); });
    if (queue_.empty()) return;  // stop requested and the queue drained
    Work w = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    CollArgs& args = w.args;
    const std::shared_ptr<RequestState>& req = w.req;
    chorusResult_t result = chorusSuccess;
    std::string error;
    try {
      if (w.aborted) throw Error(chorusInvalidUsage, Subsys::Core, cat("rank ", rank_, ": communicator was aborted"));
      run(args);
    } catch (const Error& e) {
      result = e.code();
      error = e.what();
    } catch (const std::exception& e) {
      result = chorusInternalError;
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> rl(req->mu);
      req->done = true;
      req->result = result;
      req->error = error;
    }
    req->cv.notify_all();
    if (w.on_done) w.on_done(result);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    lock.lock();
  }
}

std::unique_ptr<CommImpl> CommImpl::split(int color, int key, bool has_newcomm) {
  throw_if_broken();  // as every call of a broken communicator: the error that broke it
  std::string refusal;
  if (!has_newcomm)
    refusal = "newcomm is NULL";
  else if (color < 0 && color != CHORUS_SPLIT_NOCOLOR)
    refusal = cat("color=", color, " must be non-negative or CHORUS_SPLIT_NOCOLOR");
  Deadline deadline = Deadline::after_ms(timeout_ms_);
  // A rank with a bad argument still joins the exchange, flagged, so that its peers fail at once naming it instead
  // of waiting for it until the timeout. Nobody creates a communicator then, and the parent stays usable.
  int32_t mine[3] = {color, key, refusal.empty() ? 0 : 1};
  Blob blob(sizeof(mine));
  std::memcpy(blob.data(), mine, sizeof(mine));
  ActivityScope in_split(activity_, kInSplit);  // until the split ends: peers that ask meanwhile see it
  std::vector<Blob> all;
  try {
    all = bootstrap_->allgather(kTagSplit, blob, deadline);
  } catch (const Error& e) {
    // Another rank's report (its own timeout, with what each rank was doing) says more than this rank's symptom,
    // also when it arrives while this rank asks the others (which it cuts short).
    if (bootstrap_->failed()) check_abort();
    if (e.code() != chorusTimeout) throw;
    const Diagnosis d = diagnose_timeout(nullptr);
    const std::string diagnosis = d.lead.empty() ? d.suffix : cat("; ", d.lead, d.suffix);
    if (bootstrap_->failed()) check_abort();
    // As a failed collective: the communicator is broken and every rank is told, with what each peer was doing.
    // (The bootstrap's own text names its exchange by tag, which means nothing to the caller.)
    Error timed_out(e.code(), e.subsys(),
                    cat("rank ", rank_, ": chorusCommSplit: timed out after ", timeout_ms_,
                        " ms waiting for every rank's color and key", diagnosis));
    fail(timed_out);
    throw timed_out;
  }
  if (!refusal.empty()) bad_arg(refusal);
  std::vector<std::pair<int32_t, int>> members;  // (key, old rank)
  std::string refused;                           // "2, 5"
  for (int r = 0; r < nranks_; ++r) {
    int32_t theirs[3];
    if (all[r].size() != sizeof(theirs)) throw Error(chorusInternalError, Subsys::Core, "split: malformed entry");
    std::memcpy(theirs, all[r].data(), sizeof(theirs));
    if (theirs[2] != 0) refused += cat(refused.empty() ? "" : ", ", r);
    if (theirs[0] == color && color != CHORUS_SPLIT_NOCOLOR) members.push_back({theirs[1], r});
  }
  if (!refused.empty())
    throw Error(chorusInvalidArgument, Subsys::Core,
                cat("chorusCommSplit: rank(s) ", refused,
                    " passed an invalid argument (their own error says which); no communicator was created"));
  if (color == CHORUS_SPLIT_NOCOLOR) return nullptr;
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
  chorusUniqueId raw;
  if (new_rank == 0) {
    raw = encode_unique_id(create_unique_id());
    Blob id(sizeof(raw));
    std::memcpy(id.data(), &raw, sizeof(raw));
    for (size_t i = 1; i < members.size(); ++i) bootstrap_->send(members[i].second, kTagSplitId, id);
  } else {
    Blob id;
    try {
      id = bootstrap_->recv(members[0].second, kTagSplitId, deadline);
    } catch (const Error& e) {
      check_abort();  // an abort of this communicator, or a peer's failure, named as every call names them
      throw Error(e.code(), Subsys::Core,
                  cat("chorusCommSplit: rank ", members[0].second,
                      ", rank 0 of the new communicator, did not send its unique id: ", without_rank_prefix(e.what())));
    }
    if (id.size() != sizeof(raw)) throw Error(chorusInternalError, Subsys::Core, "split: malformed unique id");
    std::memcpy(&raw, id.data(), sizeof(raw));
  }
  std::vector<int> old_ranks;
  for (const auto& m : members) old_ranks.push_back(m.second);
  const topo::Topology view = selector_->topology().subset(old_ranks);
  // The new communicator's rendezvous stops when this one is aborted or a peer of it fails (a member that never
  // comes would otherwise be waited for until the timeout, and an abort would wait for that).
  auto parent_stopped = [this] {
    try {
      check_abort();
    } catch (const Error& e) {
      throw Error(e.code(), Subsys::Core, cat("the parent communicator stopped: ", without_rank_prefix(e.what())));
    }
  };
  const int new_nranks = static_cast<int>(members.size());
  try {
    return std::make_unique<CommImpl>(decode_unique_id(raw), new_nranks, new_rank, &view, parent_stopped);
  } catch (const Error& e) {
    // Its errors name ranks of the new communicator (the caller's handle is the parent's), except for a stop of the
    // parent, which names the parent's.
    const std::string what = without_rank_prefix(e.what());
    const bool parent = what.rfind("the parent communicator stopped: ", 0) == 0;
    throw Error(
        e.code(), e.subsys(),
        cat("rank ", rank_, ": chorusCommSplit: the new communicator (where this rank is rank ", new_rank, " of ",
            new_nranks, parent ? "" : "; ranks named below are numbered there", ") was not created: ", what));
  }
}

chorusRedOp_t CommImpl::create_premul(const void* scalar, chorusDataType_t dtype) {
  if (!dtype_valid(dtype)) bad_arg(cat("datatype=", static_cast<int>(dtype), " is not a valid chorusDataType_t"));
  if (scalar == nullptr) bad_arg("scalar is NULL");
  PreMul pm;
  pm.dtype = dtype;
  switch (dtype) {
    case chorusInt8: pm.i = *static_cast<const int8_t*>(scalar); break;
    case chorusUint8: pm.i = *static_cast<const uint8_t*>(scalar); break;
    case chorusInt32: pm.i = *static_cast<const int32_t*>(scalar); break;
    case chorusUint32: pm.i = *static_cast<const uint32_t*>(scalar); break;
    case chorusInt64: pm.i = *static_cast<const int64_t*>(scalar); break;
    case chorusUint64: pm.i = static_cast<int64_t>(*static_cast<const uint64_t*>(scalar)); break;
    case chorusFloat64: pm.f = *static_cast<const double*>(scalar); break;
    case chorusFloat32: pm.f = *static_cast<const float*>(scalar); break;
    case chorusFloat16: pm.f = kernels::half_to_float(*static_cast<const uint16_t*>(scalar)); break;
    case chorusBfloat16: pm.f = kernels::bf16_to_float(*static_cast<const uint16_t*>(scalar)); break;
    case chorusFloat8e4m3: pm.f = kernels::e4m3_to_float(*static_cast<const uint8_t*>(scalar)); break;
    case chorusFloat8e5m2: pm.f = kernels::e5m2_to_float(*static_cast<const uint8_t*>(scalar)); break;
    default: bad_arg("invalid datatype");
  }
  // Ids are unique in the process, not per communicator: an op used on a communicator other than its own is
  // refused (it is not among that communicator's ops), never taken for one of them.
  static std::atomic<int> next_id{chorusNumOps};
  const int id = next_id.fetch_add(1);
  if (id < chorusNumOps) throw Error(chorusSystemError, Subsys::Core, "out of pre-multiplied sum ids (2^31 created)");
  premul_[id] = pm;
  return static_cast<chorusRedOp_t>(id);
}

void CommImpl::destroy_premul(chorusRedOp_t op) {
  if (premul_.erase(op) == 0)
    bad_arg(cat("op=", static_cast<int>(op), " is not a live pre-multiplied sum of this communicator"));
}

}  // namespace chorus
