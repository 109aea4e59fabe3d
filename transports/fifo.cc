#include "transports/fifo.h"

#include <cstring>
#include <new>

#include "core/error.h"

namespace chorus {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

size_t SlotFifo::region_bytes(size_t slot_bytes, int depth) {
  return sizeof(Control) + static_cast<size_t>(depth) * (kHeaderSpace + round_up(slot_bytes, 64));
}

SlotFifo::SlotFifo(void* region, size_t slot_bytes, int depth, bool initialize)
    : ctl_(static_cast<Control*>(region)),
      slots_(static_cast<std::byte*>(region) + sizeof(Control)),
      stride_(kHeaderSpace + round_up(slot_bytes, 64)),
      depth_(static_cast<uint64_t>(depth)) {
  CHORUS_ASSERT(depth >= 1);
  CHORUS_ASSERT(reinterpret_cast<uintptr_t>(region) % 64 == 0);
  if (initialize) {
    new (&ctl_->head) std::atomic<uint64_t>(0);
    new (&ctl_->tail) std::atomic<uint64_t>(0);
  }
}

std::byte* SlotFifo::send_slot() {
  if (head_ - cached_tail_ >= depth_) {
    cached_tail_ = ctl_->tail.load(std::memory_order_acquire);
    if (head_ - cached_tail_ >= depth_) return nullptr;
  }
  return slot(head_) + kHeaderSpace;
}

void SlotFifo::send_commit(const WireHeader& header) {
  std::memcpy(slot(head_), &header, sizeof(header));
  ++head_;
  ctl_->head.store(head_, std::memory_order_release);
}

MessageView SlotFifo::recv_peek() {
  if (tail_ == cached_head_) {
    cached_head_ = ctl_->head.load(std::memory_order_acquire);
    if (tail_ == cached_head_) return {};
  }
  std::byte* s = slot(tail_);
  return {reinterpret_cast<const WireHeader*>(s), s + kHeaderSpace};
}

void SlotFifo::recv_release() {
  ++tail_;
  ctl_->tail.store(tail_, std::memory_order_release);
}

}  // namespace chorus
