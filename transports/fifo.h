// A single-producer single-consumer FIFO of fixed-size slots laid out in one memory region: the shared core of
// the local (threads) and shm (processes) transports. The sender writes a slot, publishes it by storing the
// message's number in the slot's `ready` word (release), then advances `head`; the receiver polls the `ready` word
// of the slot it expects next, reads the slot in place and frees it by advancing `tail` (release). Polling the slot
// itself, not `head`, means a small message costs the receiver one cache line (ready word, header and up to 16
// payload bytes share it), as the fast boxes of Open MPI's shared-memory transport do; `head` is read only by a
// receiver about to sleep. The region may be process-shared memory: it holds only lock-free atomics and bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "transports/transport.h"

namespace chorus {

class SlotFifo {
 public:
  // Bytes a region needs for `depth` slots of `slot_bytes` payload each.
  static size_t region_bytes(size_t slot_bytes, int depth);
  // Lays the FIFO over `region` (64-byte aligned, region_bytes() long); `initialize` on exactly one side.
  SlotFifo(void* region, size_t slot_bytes, int depth, bool initialize);

  std::byte* send_slot();  // nullptr when full
  void send_commit(const WireHeader& header);
  MessageView recv_peek();  // {nullptr, nullptr} when empty
  void recv_release();
  // Sleep (futex) until the other side advances its counter or `timeout_us` passes. With more ranks than cores
  // a waiting rank must give its core to the rank it waits for.
  void wait_recv(int timeout_us);
  void wait_send(int timeout_us);

 private:
  // Counters are 32-bit so they can be futex words; they wrap, and only differences (at most depth) are used.
  // Each counter shares its line with the flag its writer reads on every advance, so that read hits locally;
  // the other side writes the flag only when it goes to sleep.
  struct alignas(64) Control {
    alignas(64) std::atomic<uint32_t> head;  // written by the sender
    std::atomic<uint32_t> head_waiting;      // set by the receiver while it sleeps on head
    alignas(64) std::atomic<uint32_t> tail;  // written by the receiver
    std::atomic<uint32_t> tail_waiting;      // set by the sender while it sleeps on tail
  };
  static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4);
  // A slot: the WireHeader (40 bytes), the ready word (4 bytes: the number of the message in the slot plus one,
  // so the zeroed region reads as empty), then the payload at a 16-byte boundary. Up to 16 payload bytes share
  // the header's cache line, so a small message moves one line, not two.
  static constexpr size_t kReadyOffset = sizeof(WireHeader);
  static constexpr size_t kHeaderSpace = 48;
  static_assert(kReadyOffset + sizeof(std::atomic<uint32_t>) <= kHeaderSpace);
  std::atomic<uint32_t>* ready(std::byte* slot) const {
    return std::launder(reinterpret_cast<std::atomic<uint32_t>*>(slot + kReadyOffset));
  }

  std::byte* slot(uint32_t i) const { return slots_ + (i % depth_) * stride_; }

  Control* ctl_;
  std::byte* slots_;
  size_t stride_;
  uint32_t depth_;
  // Each side's own copy of the counter it advances, and the sender's cached view of `tail`.
  uint32_t head_ = 0, tail_ = 0, cached_tail_ = 0;
};

// A Connection over two SlotFifos (one per direction) living in memory kept alive by `keepalive`.
class FifoConnection : public Connection {
 public:
  FifoConnection(int peer, int channel, size_t slot_bytes, SlotFifo send, SlotFifo recv,
                 std::shared_ptr<void> keepalive)
      : Connection(peer, channel, slot_bytes), send_(send), recv_(recv), keepalive_(std::move(keepalive)) {}
  std::byte* send_slot() override { return send_.send_slot(); }
  void send_commit(const WireHeader& h) override { send_.send_commit(h); }
  MessageView recv_peek() override { return recv_.recv_peek(); }
  void recv_release() override { recv_.recv_release(); }
  void wait_recv(int timeout_us) override { recv_.wait_recv(timeout_us); }
  void wait_send(int timeout_us) override { send_.wait_send(timeout_us); }

 private:
  SlotFifo send_, recv_;
  std::shared_ptr<void> keepalive_;
};

}  // namespace chorus
