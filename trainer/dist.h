// The communicators of a training run and the time and bytes it spends in them.
//
// FSDP gathers and reduce-scatters on `shard`, MoE dispatches on `experts`, and everything small (loss sums, the
// gradient norm, checkpoint barriers) goes over `world`. Each is its own communicator so that a prefetched
// all-gather running in the background never makes an expert all-to-allv wait behind it: operations on one
// communicator complete in the order they were issued, operations on different ones independently.
#pragma once

#include <chorus/chorus.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

namespace trainer {

// What a rank spends in collectives. Bytes are the payload the rank hands to each call: an all-gather's full
// output, a reduce-scatter's full input, an all-to-allv's sent plus received rows, an all-reduce's buffer.
struct CommStats {
  double seconds = 0;  // wall time blocked in collectives or waiting for requests
  uint64_t bytes = 0;
  uint64_t calls = 0;

  // Runs a blocking collective, counting its time and `bytes`.
  template <typename F>
  void timed(uint64_t nbytes, F&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes += nbytes;
    ++calls;
  }
  // Counts a non-blocking collective when it is issued.
  void issued(uint64_t nbytes) {
    bytes += nbytes;
    ++calls;
  }
  // Waits for a non-blocking collective (counted when issued) and frees it.
  void wait(chorus::Request& r) {
    const auto t0 = std::chrono::steady_clock::now();
    r.wait();
    r = chorus::Request();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

class Dist {
 public:
  // One process, no communicator: unsharded training.
  Dist() = default;
  // Over `world` (which must outlive this). shard_group: ranks that share one copy of the dense parameters, each
  // holding 1/shard_group of it; groups of consecutive ranks, replicated across groups (hybrid sharding). 0 means
  // every rank (plain FSDP). Collective: every rank calls it with the same shard_group.
  Dist(chorus::Comm& world, int shard_group);

  bool distributed() const { return world_ != nullptr; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  int replicas() const { return nranks_ / shard_size_; }

  chorus::Comm* world() { return world_; }
  chorus::Comm* shard() { return shard_.get(); }
  chorus::Comm* replica() { return replica_.get(); }  // null without hybrid sharding
  chorus::Comm* experts() { return experts_.get(); }

  // Sum of `values` over every rank, in place (no-op in one process).
  void sum_world(std::span<double> values) {
    if (world_) stats.timed(values.size_bytes(), [&] { world_->all_reduce(values, chorus::Op::Sum); });
  }

  CommStats stats;

 private:
  chorus::Comm* world_ = nullptr;
  std::unique_ptr<chorus::Comm> shard_, replica_, experts_;
  int rank_ = 0, nranks_ = 1, shard_rank_ = 0, shard_size_ = 1;
};

}  // namespace trainer
