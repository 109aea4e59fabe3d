#include "transports/ibverbs/slots.h"

#include "core/error.h"

namespace chorus::ib {

uint32_t encode_imm(Imm imm) {
  CHORUS_ASSERT((imm.value & ~kImmValueMask) == 0);
  return (imm.kind == ImmKind::Credit ? 0x80000000u : 0u) | imm.value;
}

Imm decode_imm(uint32_t raw) { return {(raw & 0x80000000u) ? ImmKind::Credit : ImmKind::Data, raw & kImmValueMask}; }

uint64_t unwrap_count(uint64_t base, uint32_t low) {
  const uint64_t delta = (uint64_t{low} - base) & kImmValueMask;
  return base + delta;
}

SendWindow::SendWindow(uint32_t depth) : depth_(depth), busy_(depth, 0) { CHORUS_ASSERT(depth >= 1); }

bool SendWindow::can_post() const { return posted_ - credited_ < depth_ && busy_[posted_ % depth_] == 0; }

uint64_t SendWindow::post() {
  CHORUS_ASSERT(can_post());
  const uint64_t seq = posted_++;
  busy_[seq % depth_] = seq + 1;
  ++outstanding_;
  return seq;
}

bool SendWindow::on_write_done(uint32_t seq_low) {
  if (posted_ == 0) return false;
  // The latest sequence number with these low 32 bits: outstanding writes are the last `depth` posted.
  const uint64_t seq = (posted_ - 1) - ((uint64_t{static_cast<uint32_t>(posted_ - 1)} - seq_low) & 0xffffffffu);
  uint64_t& b = busy_[seq % depth_];
  if (b != seq + 1) return false;
  b = 0;
  --outstanding_;
  return true;
}

bool SendWindow::on_credit(uint32_t value, std::string* why) {
  const uint64_t c = unwrap_count(credited_, value);
  if (c > posted_) {
    *why = cat("credit for ", c, " messages but only ", posted_, " were sent");
    return false;
  }
  credited_ = c;  // credits are cumulative: a stale one (c == credited_) changes nothing
  return true;
}

RecvWindow::RecvWindow(uint32_t depth) : depth_(depth), arrived_(depth, false) { CHORUS_ASSERT(depth >= 1); }

std::optional<uint64_t> RecvWindow::on_data(uint32_t value, std::string* why) {
  const uint64_t seq = unwrap_count(consumed_, value);
  if (seq >= consumed_ + depth_) {
    *why = cat("message ", seq, " arrived while messages ", consumed_, "..", consumed_ + depth_ - 1,
               " fit the ring (the sender overran its credit)");
    return std::nullopt;
  }
  if (arrived_[seq % depth_]) {
    *why = cat("message ", seq, " arrived twice");
    return std::nullopt;
  }
  arrived_[seq % depth_] = true;
  return seq;
}

bool RecvWindow::ready() const { return arrived_[consumed_ % depth_]; }

uint32_t RecvWindow::release() {
  CHORUS_ASSERT(ready());
  arrived_[consumed_ % depth_] = false;
  ++consumed_;
  return static_cast<uint32_t>(consumed_ & kImmValueMask);
}

uint64_t encode_wr_id(WrId id) {
  CHORUS_ASSERT(id.conn <= 0xffffff && id.qp <= 15);
  return (uint64_t{static_cast<uint8_t>(id.kind)} << 60) | (uint64_t{id.qp} << 56) | (uint64_t{id.conn} << 32) | id.seq;
}

std::optional<WrId> decode_wr_id(uint64_t raw) {
  const uint8_t k = static_cast<uint8_t>(raw >> 60);
  if (k < static_cast<uint8_t>(WrKind::Data) || k > static_cast<uint8_t>(WrKind::Recv)) return std::nullopt;
  return WrId{static_cast<WrKind>(k), static_cast<uint8_t>((raw >> 56) & 0xf),
              static_cast<uint32_t>((raw >> 32) & 0xffffff), static_cast<uint32_t>(raw)};
}

}  // namespace chorus::ib
