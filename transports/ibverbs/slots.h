// Slice bookkeeping of the ibverbs connection, device-free so it is unit-tested everywhere.
//
// Protocol (one direction; the connection runs one each way over the same queue pairs):
//  - the receiver owns a ring of `depth` slots registered for remote write and tells the sender its address and
//    rkey (conn_data.h);
//  - message number `seq` goes to slot seq % depth as one RDMA write with immediate of [header, payload] from the
//    sender's own slot seq % depth, on queue pair seq % nqps; the immediate carries seq, so the receiver knows
//    which slot filled even when several queue pairs complete out of order;
//  - the receiver reads slots in order and, for every slot it releases, returns a credit: a zero-byte write with
//    immediate carrying how many messages it has consumed in all;
//  - the sender may post message seq only when slot seq % depth is free at both ends: its local write completed
//    (the send buffer is reusable) and the receiver has consumed message seq - depth (credit).
// Every count is 64-bit on each side; the immediate carries 31 bits of it and the full value is recovered from
// the window, which never exceeds `depth` (<= 64), so wrap-around is unambiguous. A value outside the window is a
// protocol error, reported, never acted on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::ib {

// The 32-bit immediate: bit 31 tells credits from data; bits 0..30 hold the low bits of a count.
enum class ImmKind : uint8_t { Data, Credit };
struct Imm {
  ImmKind kind = ImmKind::Data;
  uint32_t value = 0;  // 31 bits
  bool operator==(const Imm&) const = default;
};
constexpr uint32_t kImmValueMask = 0x7fffffffu;
// Host-order values; the transport converts with htonl/ntohl at the verbs boundary.
uint32_t encode_imm(Imm imm);
Imm decode_imm(uint32_t raw);
// The 64-bit count whose low 31 bits are `low`, closest at or above `base` (base <= result < base + 2^31).
uint64_t unwrap_count(uint64_t base, uint32_t low);

// The sender's side: which slot the next message goes to and when it may go.
class SendWindow {
 public:
  explicit SendWindow(uint32_t depth);
  uint32_t depth() const { return depth_; }
  // Slot seq % depth is free here (local write done) and at the peer (credited).
  bool can_post() const;
  // Claims the next sequence number (can_post() must hold); its write is posted by the caller.
  uint64_t post();
  // The write of the message whose sequence number has these low 32 bits (from its work-request id) completed
  // locally; false if no such write is outstanding.
  bool on_write_done(uint32_t seq_low);
  // A credit immediate arrived; false (window unchanged, *why set) when it claims more than was sent.
  bool on_credit(uint32_t value, std::string* why);
  bool idle() const { return outstanding_ == 0; }  // every posted write completed locally
  uint64_t posted() const { return posted_; }
  uint64_t credited() const { return credited_; }

 private:
  uint32_t depth_;
  uint64_t posted_ = 0, credited_ = 0;
  std::vector<uint64_t> busy_;  // per slot: 1 + seq of its outstanding write, 0 when free
  uint32_t outstanding_ = 0;
};

// The receiver's side: which slots have arrived, in what order they are consumed, what credit to return.
class RecvWindow {
 public:
  explicit RecvWindow(uint32_t depth);
  // A data immediate arrived: the sequence number, or nullopt (*why set) when it is outside the window or a
  // duplicate.
  std::optional<uint64_t> on_data(uint32_t value, std::string* why);
  // The next message in order has arrived.
  bool ready() const;
  uint64_t next() const { return consumed_; }  // its sequence number
  uint32_t next_slot() const { return static_cast<uint32_t>(consumed_ % depth_); }
  // The next message was consumed; returns the credit immediate value to send back.
  uint32_t release();
  uint64_t consumed() const { return consumed_; }

 private:
  uint32_t depth_;
  uint64_t consumed_ = 0;
  std::vector<bool> arrived_;
};

// Work-request ids: what a completion belongs to (a connection's index in the transport, the queue pair, and for a
// data write the message). Layout: [kind: 4][qp: 4][conn: 24][seq: 32].
enum class WrKind : uint8_t { Data = 1, Credit = 2, Recv = 3 };
struct WrId {
  WrKind kind = WrKind::Data;
  uint8_t qp = 0;     // 0..15: the queue pair of the connection it was posted on
  uint32_t conn = 0;  // 24 bits
  uint32_t seq = 0;   // data: the low 32 bits of the message's sequence number (SendWindow::on_write_done)
  bool operator==(const WrId&) const = default;
};
uint64_t encode_wr_id(WrId id);
std::optional<WrId> decode_wr_id(uint64_t raw);

}  // namespace chorus::ib
