// ibverbs connection data: what one rank sends its peer through the bootstrap so the peer can bring its RC queue
// pairs to RTR and RDMA-write into this rank's receive ring (transports/ibverbs/ibverbs.cc). Device-free, so it is
// unit-tested on machines without RDMA.
//
// Wire form (little-endian, fixed layout, kMagic first): the parser checks the magic, version and exact length,
// and every field's range, and says which one is wrong; data from the network is never trusted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chorus::ib {

constexpr int kMaxQpsPerConnection = 16;

// Link layers as libibverbs numbers them (IBV_LINK_LAYER_*).
enum class LinkLayer : uint8_t { InfiniBand = 1, Ethernet = 2 };
const char* link_layer_name(LinkLayer l);

struct QpAddr {
  uint32_t qpn = 0;  // 24 bits
  uint32_t psn = 0;  // 24 bits: the first packet sequence number this side sends with
  bool operator==(const QpAddr&) const = default;
};

struct ConnData {
  static constexpr uint32_t kMagic = 0x43484942;  // "CHIB"
  static constexpr uint32_t kVersion = 1;
  LinkLayer link_layer = LinkLayer::InfiniBand;
  uint8_t port = 1;
  uint16_t lid = 0;  // InfiniBand: the port's LID (non-zero); RoCE: 0
  uint8_t mtu = 0;   // enum ibv_mtu: 1 (256 B) .. 5 (4096 B), the port's active MTU
  int32_t gid_index = -1;
  std::array<uint8_t, 16> gid{};  // RoCE: the GID to route to (non-zero); InfiniBand: used when the peer is off-subnet
  std::vector<QpAddr> qps;        // 1..kMaxQpsPerConnection
  uint64_t ring_addr = 0;         // the receive ring the peer writes into
  uint32_t ring_rkey = 0;
  uint32_t slots = 0;        // slots in the ring (the FIFO depth)
  uint64_t slot_stride = 0;  // bytes from one slot to the next (header + slice, rounded)

  bool operator==(const ConnData&) const = default;
};

std::vector<std::byte> serialize(const ConnData& d);
// Throws chorus::Error (chorusRemoteError) naming the field that is malformed or out of range.
ConnData parse_conn_data(std::span<const std::byte> wire);
// Whether a peer's data fits this side's: same link layer, QP count, slot count and stride. Returns "" when it
// does, else what differs (and which setting is the likely cause).
std::string incompatibility(const ConnData& local, const ConnData& remote);

// 256 << (mtu - 1) bytes for an ibv_mtu value; 0 when out of range.
int mtu_bytes(uint8_t mtu);
// "fe80::...": a GID for messages.
std::string gid_text(const std::array<uint8_t, 16>& gid);

}  // namespace chorus::ib
