#include "transports/fifo.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <new>

#include "core/error.h"

namespace chorus {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

namespace {
// Shared futexes (no FUTEX_PRIVATE_FLAG): the words may live in memory mapped by several processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_us) {
  timespec ts{timeout_us / 1000000, static_cast<long>(timeout_us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
}  // namespace

size_t SlotFifo::region_bytes(size_t slot_bytes, int depth) {
  return sizeof(Control) + static_cast<size_t>(depth) * round_up(kHeaderSpace + slot_bytes, 64);
}

SlotFifo::SlotFifo(void* region, size_t slot_bytes, int depth, bool initialize)
    : ctl_(static_cast<Control*>(region)),
      slots_(static_cast<std::byte*>(region) + sizeof(Control)),
      stride_(round_up(kHeaderSpace + slot_bytes, 64)),
      depth_(static_cast<uint32_t>(depth)) {
  // A power of two: slot i % depth stays continuous when the 32-bit counters wrap (the communicator checks it).
  CHORUS_ASSERT(depth >= 1 && (depth & (depth - 1)) == 0);
  CHORUS_ASSERT(reinterpret_cast<uintptr_t>(region) % 64 == 0);
  if (initialize) {
    new (&ctl_->head) std::atomic<uint32_t>(0);
    new (&ctl_->head_waiting) std::atomic<uint32_t>(0);
    new (&ctl_->tail) std::atomic<uint32_t>(0);
    new (&ctl_->tail_waiting) std::atomic<uint32_t>(0);
    for (uint32_t i = 0; i < depth_; ++i) new (ready(slot(i))) std::atomic<uint32_t>(0);
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
  std::byte* s = slot(head_);
  std::memcpy(s, &header, sizeof(header));
  ++head_;
  ready(s)->store(head_, std::memory_order_release);
  // seq_cst store then load: either the sleeping receiver sees the new head before it sleeps, or we see its flag.
  ctl_->head.store(head_, std::memory_order_seq_cst);
  if (ctl_->head_waiting.load(std::memory_order_seq_cst)) futex_wake(&ctl_->head);
}

MessageView SlotFifo::recv_peek() {
  std::byte* s = slot(tail_);
  if (ready(s)->load(std::memory_order_acquire) != tail_ + 1) return {};
  return {reinterpret_cast<const WireHeader*>(s), s + kHeaderSpace};
}

void SlotFifo::recv_release() {
  ++tail_;
  ctl_->tail.store(tail_, std::memory_order_seq_cst);
  if (ctl_->tail_waiting.load(std::memory_order_seq_cst)) futex_wake(&ctl_->tail);
}

void SlotFifo::wait_recv(int timeout_us) {
  ctl_->head_waiting.store(1, std::memory_order_seq_cst);
  if (ctl_->head.load(std::memory_order_seq_cst) == tail_) futex_wait(&ctl_->head, tail_, timeout_us);
  ctl_->head_waiting.store(0, std::memory_order_relaxed);
}

void SlotFifo::wait_send(int timeout_us) {
  ctl_->tail_waiting.store(1, std::memory_order_seq_cst);
  const uint32_t t = ctl_->tail.load(std::memory_order_seq_cst);
  if (head_ - t >= depth_) futex_wait(&ctl_->tail, t, timeout_us);
  ctl_->tail_waiting.store(0, std::memory_order_relaxed);
}

}  // namespace chorus
