#include "transports/transport.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <random>

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
  w.str(tcp_addr);
  w.str(settings);
  return w.out;
}

PeerInfo PeerInfo::deserialize(const std::vector<std::byte>& blob) {
  Reader r(blob);
  PeerInfo p;
  p.rank = static_cast<int>(r.u64());
  p.host_id = r.str();
  p.process_token = r.u64();
  p.pid = static_cast<int>(r.u64());
  p.tcp_addr = r.str();
  p.settings = r.str();
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

std::vector<std::string> transport_names() { return {"local", "shm", "tcp"}; }

std::unique_ptr<Transport> make_transport(const std::string& name, const Secret& secret) {
  if (name == "local") return make_local_transport();
  if (name == "shm") return make_shm_transport();
  if (name == "tcp") return make_tcp_transport(secret);
  std::string known;
  for (const auto& n : transport_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(chorusInvalidArgument, Subsys::Transport,
              cat("CHORUS_TRANSPORTS: unknown transport '", name, "' (known: ", known, ")"));
}

}  // namespace chorus
