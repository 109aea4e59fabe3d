// Where the dense parameters live: FullParams keeps all of them in one process (the unsharded reference);
// ShardedParams is FSDP / ZeRO-3 over Chorus.
//
// ZeRO-3 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020):
// each unit's flat parameters are padded to a multiple of the shard group's size S and split in S equal
// contiguous shards; rank i of the group keeps shard i of the parameters, of their gradients and of both AdamW
// moments, so that state is 1/S of the model per rank. Around each unit:
//   forward:  all-gather the unit's full parameters, compute, drop them (except the last unit, which the backward
//             needs at once)
//   backward: all-gather them again, compute the unit's full gradient, reduce-scatter it so each rank receives the
//             sum over ranks of its own shard
// The next unit's all-gather is issued with the non-blocking API before the current unit computes (unit u + 1 in
// the forward, u - 1 in the backward), and the reduce-scatter of a unit's gradient runs while the next unit
// computes; two parameter buffers and two gradient buffers of the largest unit's size alternate.
//
// Hybrid sharding (HSDP): with shard groups smaller than the world, parameters are sharded inside a group and
// replicated across groups; after the reduce-scatter inside the group, one all-reduce over the ranks that hold
// the same shard (the replica communicator) sums the gradients of the other groups.
#pragma once

#include <chorus/chorus.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/dist.h"
#include "trainer/model.h"

namespace trainer {

// Every parameter in this process.
class FullParams : public ParamStore {
 public:
  FullParams(const ModelConfig& c, const std::vector<Unit>& units, uint64_t seed);
  void begin_pass(bool) override {}
  const float* forward_params(int u) override { return &params_[off_[u]]; }
  void forward_done(int) override {}
  const float* backward_params(int u) override { return &params_[off_[u]]; }
  float* grads(int u) override;
  void backward_done(int) override {}
  void end_pass() override {}
  std::vector<Segment> segments() override;
  std::vector<StateBuffer> state() override;
  Memory memory() const override;

  // The whole flat parameter vector and its gradient, units in order (the gradient check perturbs parameters).
  std::vector<float>& all_params() { return params_; }
  const std::vector<float>& all_grads() const { return grads_; }

 private:
  const std::vector<Unit>& units_;
  std::vector<size_t> off_;
  std::vector<float> params_, grads_, m_, v_;
};

class ShardedParams : public ParamStore {
 public:
  // prefetch: issue all-gathers ahead and reduce-scatters in the background (the default); without it every
  // collective blocks where it is needed, for comparison.
  // compress: codec name of the gradient reduce-scatter ("int8", "fp8_e4m3", "int4"; empty: fp32); throws
  // std::invalid_argument for another name.
  ShardedParams(const ModelConfig& c, const std::vector<Unit>& units, uint64_t seed, Dist& dist, bool prefetch,
                const std::string& compress = "");

  void begin_pass(bool with_backward) override;
  const float* forward_params(int u) override;
  void forward_done(int u) override;
  const float* backward_params(int u) override;
  float* grads(int u) override;
  void backward_done(int u) override;
  void end_pass() override;
  std::vector<Segment> segments() override;
  std::vector<StateBuffer> state() override;
  Memory memory() const override;

 private:
  // One full-unit buffer. Members are destroyed in reverse order, so a request still in flight (on an error path)
  // is waited for by its destructor before its buffer goes; the shards it reads or writes are members declared
  // before the slots, so they outlive it too.
  struct Slot {
    std::vector<float> buf;
    int unit = -1;            // the unit whose parameters (or gradient) it holds, -1 when free
    chorus::Request pending;  // its all-gather or reduce-scatter, when in flight
    bool in_flight = false;
  };
  void gather(int u);  // issues the all-gather of unit u into its parameter slot
  const float* ensure_gathered(int u);
  void wait(Slot& s);

  const std::vector<Unit>& units_;
  Dist& dist_;
  bool prefetch_, with_backward_ = false;
  bool compressed_ = false;
  chorusCompression_t compression_ = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
  int S_, rank_;
  std::vector<size_t> shard_n_, shard_off_;  // per unit: shard length (padded unit / S) and offset in the vectors
  std::vector<float> params_, grads_, m_, v_;
  std::array<Slot, 2> pslot_, gslot_;  // unit u uses slot u % 2
};

}  // namespace trainer
