#include "transports/transport.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "bootstrap/socket.h"
#include "core/error.h"
#include "topology/topology.h"
#include "transports/transports.h"

namespace chorus {

namespace {

class Writer {
 public:
  void u64(uint64_t v) { raw(&v, sizeof(v)); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  std::vector<std::byte> out;

 private:
  void raw(const void* p, size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
};

class Reader {
 public:
  explicit Reader(const std::vector<std::byte>& in) : in_(in) {}
  uint64_t u64() {
    uint64_t v;
    raw(&v, sizeof(v));
    return v;
  }
  std::string str() {
    uint64_t n = u64();
    if (n > 4096) bad();
    std::string s(n, '\0');
    raw(s.data(), n);
    return s;
  }

 private:
  [[noreturn]] void bad() { throw Error(chorusRemoteError, Subsys::Transport, "malformed peer info"); }
  void raw(void* p, size_t n) {
    if (pos_ + n > in_.size()) bad();
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  const std::vector<std::byte>& in_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> PeerInfo::serialize() const {
  Writer w;
  w.u64(static_cast<uint64_t>(rank));
  w.str(host_id);
  w.u64(process_token);
  w.u64(static_cast<uint64_t>(pid));
  w.u64(hosts_root ? 1 : 0);
  w.str(tcp_addr);
  w.str(settings);
  w.u64(transport_caps.size());
  for (const auto& [name, caps] : transport_caps) {
    w.str(name);
    w.str(caps);
  }
  return w.out;
}

PeerInfo PeerInfo::deserialize(const std::vector<std::byte>& blob) {
  Reader r(blob);
  PeerInfo p;
  p.rank = static_cast<int>(r.u64());
  p.host_id = r.str();
  p.process_token = r.u64();
  p.pid = static_cast<int>(r.u64());
  p.hosts_root = r.u64() != 0;
  p.tcp_addr = r.str();
  p.settings = r.str();
  const uint64_t ncaps = r.u64();
  if (ncaps > 64) throw Error(chorusRemoteError, Subsys::Transport, "malformed peer info (transport list)");
  for (uint64_t i = 0; i < ncaps; ++i) {
    std::string name = r.str();
    p.transport_caps[name] = r.str();
  }
  return p;
}

PeerInfo local_peer_info(int rank) {
  static const uint64_t token = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  PeerInfo p;
  p.rank = rank;
  p.host_id = topo::host_identity();
  p.process_token = token;
  p.pid = static_cast<int>(getpid());
  return p;
}

short Connection::arm_poll() { return static_cast<short>(POLLIN | (send_idle() ? 0 : POLLOUT)); }

namespace {

// A transport this build does not have: it reaches no peer and says why.
class UnavailableTransport : public Transport {
 public:
  UnavailableTransport(const char* name, std::string why) : name_(name), why_(std::move(why)) {}
  const char* name() const override { return name_; }
  bool can_connect(const PeerInfo&, const PeerInfo&) const override { return false; }
  std::string unavailable_reason() const override { return why_; }
  // Never chosen (can_connect is false), so never asked to connect.
  std::vector<std::byte> prepare(const ConnectSpec&) override { unreachable(); }
  std::unique_ptr<Connection> connect(const ConnectSpec&, const std::vector<std::byte>&, Deadline) override {
    unreachable();
  }

 private:
  [[noreturn]] void unreachable() const {
    throw Error(chorusInternalError, Subsys::Transport, cat(name_, ": asked to connect but ", why_));
  }
  const char* name_;
  std::string why_;
};

#ifndef CHORUS_WITH_UCX
constexpr const char* kNoUcx =
    "not built: this build has no UCX (libucx-dev was not found at configure time, or CHORUS_UCX=OFF)";
#endif
#ifndef CHORUS_WITH_IBVERBS
constexpr const char* kNoIbverbs =
    "not built: this build has no libibverbs (libibverbs-dev was not found at configure time, or CHORUS_IBVERBS=OFF)";
#endif

}  // namespace

std::vector<std::string> transport_names() { return {"local", "shm", "ibverbs", "ucx", "tcp"}; }

std::unique_ptr<Transport> make_transport(const std::string& name, const Secret& secret) {
  if (name == "local") return make_local_transport();
  if (name == "shm") return make_shm_transport();
  if (name == "tcp") return make_tcp_transport(secret);
#ifdef CHORUS_WITH_UCX
  if (name == "ucx") return make_ucx_transport();
#else
  if (name == "ucx") return std::make_unique<UnavailableTransport>("ucx", kNoUcx);
#endif
#ifdef CHORUS_WITH_IBVERBS
  if (name == "ibverbs") return make_ibverbs_transport();
#else
  if (name == "ibverbs") return std::make_unique<UnavailableTransport>("ibverbs", kNoIbverbs);
#endif
  std::string known;
  for (const auto& n : transport_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(chorusInvalidArgument, Subsys::Transport,
              cat("CHORUS_TRANSPORTS: unknown transport '", name, "' (known: ", known, ")"));
}

TransportReport report_transport(const std::string& name) {
  TransportReport r;
  r.name = name;
  if (name == "local") {
    r.description = "ranks that are threads of one process: slot FIFOs in process memory";
    r.found = "always";
  } else if (name == "shm") {
    r.description = "processes on one host: slot FIFOs in POSIX shared memory (mode 0600)";
    r.found = "always";
  } else if (name == "tcp") {
    r.description = "any reachable rank: non-blocking sockets, authenticated by the job secret";
    try {
      r.found = cat("always; listens on ", sockaddr_to_string(default_address()),
                    " (CHORUS_SOCKET_IFNAME's address, else the first interface up that is not loopback or a "
                    "docker*/virbr* bridge)");
    } catch (const Error& e) {  // CHORUS_SOCKET_IFNAME names no interface here
      r.found = e.what();
      r.available = false;
    }
  } else if (name == "ucx") {
    r.description = "UCX UCP tagged messages into a ring of pre-posted receives; UCX picks RDMA, shared memory or TCP";
#ifdef CHORUS_WITH_UCX
    r.found = ucx_probe(&r.available);
#else
    r.found = kNoUcx;
    r.available = false;
#endif
  } else if (name == "ibverbs") {
    r.description = "RDMA write with immediate into the peer's slot ring over RC queue pairs (libibverbs)";
#ifdef CHORUS_WITH_IBVERBS
    r.found = ibverbs_probe(&r.available);
#else
    r.found = kNoIbverbs;
    r.available = false;
#endif
  } else {
    r.found = "unknown transport";
    r.available = false;
  }
  return r;
}

}  // namespace chorus
