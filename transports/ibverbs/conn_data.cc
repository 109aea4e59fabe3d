#include "transports/ibverbs/conn_data.h"

#include <arpa/inet.h>

#include <cstring>

#include "core/error.h"

namespace chorus::ib {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(chorusRemoteError, Subsys::Transport, "ibverbs: malformed connection data: " + what);
}

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto* b = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
  }
  std::vector<std::byte> out;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get(const char* field) {
    T v;
    if (pos_ + sizeof(T) > in_.size()) bad(cat("truncated at ", field, " (", in_.size(), " bytes)"));
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

}  // namespace

const char* link_layer_name(LinkLayer l) {
  switch (l) {
    case LinkLayer::InfiniBand: return "InfiniBand";
    case LinkLayer::Ethernet: return "RoCE";
  }
  return "unknown";
}

int mtu_bytes(uint8_t mtu) { return mtu >= 1 && mtu <= 5 ? 256 << (mtu - 1) : 0; }

std::string gid_text(const std::array<uint8_t, 16>& gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.data(), buf, sizeof(buf)) == nullptr) return "?";
  return buf;
}

std::vector<std::byte> serialize(const ConnData& d) {
  Writer w;
  w.put<uint32_t>(ConnData::kMagic);
  w.put<uint32_t>(ConnData::kVersion);
  w.put<uint8_t>(static_cast<uint8_t>(d.link_layer));
  w.put<uint8_t>(d.port);
  w.put<uint16_t>(d.lid);
  w.put<uint8_t>(d.mtu);
  w.put<uint8_t>(static_cast<uint8_t>(d.qps.size()));
  w.put<uint16_t>(0);  // reserved
  w.put<int32_t>(d.gid_index);
  for (uint8_t b : d.gid) w.put<uint8_t>(b);
  w.put<uint64_t>(d.ring_addr);
  w.put<uint32_t>(d.ring_rkey);
  w.put<uint32_t>(d.slots);
  w.put<uint64_t>(d.slot_stride);
  for (const QpAddr& q : d.qps) {
    w.put<uint32_t>(q.qpn);
    w.put<uint32_t>(q.psn);
  }
  return w.out;
}

ConnData parse_conn_data(std::span<const std::byte> wire) {
  Reader r(wire);
  if (r.get<uint32_t>("magic") != ConnData::kMagic) bad("bad magic (not ibverbs connection data)");
  const uint32_t version = r.get<uint32_t>("version");
  if (version != ConnData::kVersion)
    bad(cat("version ", version, ", this build speaks ", ConnData::kVersion, " (different Chorus versions?)"));
  ConnData d;
  const uint8_t ll = r.get<uint8_t>("link layer");
  if (ll != static_cast<uint8_t>(LinkLayer::InfiniBand) && ll != static_cast<uint8_t>(LinkLayer::Ethernet))
    bad(cat("unknown link layer ", int{ll}));
  d.link_layer = static_cast<LinkLayer>(ll);
  d.port = r.get<uint8_t>("port");
  if (d.port == 0) bad("port 0");
  d.lid = r.get<uint16_t>("lid");
  d.mtu = r.get<uint8_t>("mtu");
  if (mtu_bytes(d.mtu) == 0) bad(cat("mtu ", int{d.mtu}, " is not an ibv_mtu (1..5)"));
  const uint8_t nqps = r.get<uint8_t>("qp count");
  if (nqps < 1 || nqps > kMaxQpsPerConnection) bad(cat(int{nqps}, " queue pairs (1..", kMaxQpsPerConnection, ")"));
  (void)r.get<uint16_t>("reserved");
  d.gid_index = r.get<int32_t>("gid index");
  if (d.gid_index < -1 || d.gid_index > 65535) bad(cat("gid index ", d.gid_index));
  for (uint8_t& b : d.gid) b = r.get<uint8_t>("gid");
  d.ring_addr = r.get<uint64_t>("ring address");
  d.ring_rkey = r.get<uint32_t>("ring rkey");
  d.slots = r.get<uint32_t>("slots");
  d.slot_stride = r.get<uint64_t>("slot stride");
  if (d.ring_addr == 0) bad("null ring address");
  if (d.slots < 2 || d.slots > 64 || (d.slots & (d.slots - 1)) != 0)
    bad(cat(d.slots, " slots (a power of two, 2..64)"));
  if (d.slot_stride < 64 || d.slot_stride % 64 != 0 || d.slot_stride > (uint64_t{1} << 31))
    bad(cat("slot stride ", d.slot_stride, " (a multiple of 64 up to 2 GiB)"));
  if (d.ring_addr + d.slots * d.slot_stride < d.ring_addr) bad("ring wraps around the address space");
  if (r.left() != nqps * 2 * sizeof(uint32_t))
    bad(cat(r.left(), " bytes of queue pairs where ", int{nqps}, " take ", nqps * 2 * sizeof(uint32_t)));
  for (int i = 0; i < nqps; ++i) {
    QpAddr q;
    q.qpn = r.get<uint32_t>("qpn");
    q.psn = r.get<uint32_t>("psn");
    if (q.qpn == 0 || q.qpn > 0xffffff) bad(cat("qpn ", q.qpn, " (24 bits, non-zero)"));
    if (q.psn > 0xffffff) bad(cat("psn ", q.psn, " (24 bits)"));
    d.qps.push_back(q);
  }
  const bool zero_gid = d.gid == std::array<uint8_t, 16>{};
  if (d.link_layer == LinkLayer::InfiniBand && d.lid == 0) bad("InfiniBand port without a LID");
  if (d.link_layer == LinkLayer::Ethernet && (zero_gid || d.gid_index < 0)) bad("RoCE port without a GID");
  return d;
}

std::string incompatibility(const ConnData& local, const ConnData& remote) {
  if (local.link_layer != remote.link_layer)
    return cat("link layers differ (", link_layer_name(local.link_layer), " here, ", link_layer_name(remote.link_layer),
               " there)");
  if (local.qps.size() != remote.qps.size())
    return cat(local.qps.size(), " queue pairs here, ", remote.qps.size(),
               " there (CHORUS_IB_QPS_PER_CONNECTION differs between ranks)");
  if (local.slots != remote.slots)
    return cat(local.slots, " slots here, ", remote.slots, " there (CHORUS_FIFO_DEPTH differs between ranks)");
  if (local.slot_stride != remote.slot_stride)
    return cat("slot stride ", local.slot_stride, " here, ", remote.slot_stride,
               " there (CHORUS_SLICE_BYTES differs between ranks)");
  return {};
}

}  // namespace chorus::ib
