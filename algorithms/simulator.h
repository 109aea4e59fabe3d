// The simulator: the verifier's walk of a program with time (DESIGN.md, "Programs"). It predicts how long one call
// of a program takes on a topology, at any scale, without a network.
//
// Model (Hockney's alpha-beta model per message with LogGP's per-message CPU overhead o, plus FIFO servers for the
// resources ranks share):
//  - The walk is the executor's: each rank's lanes run concurrently; within a lane, steps run slice-major within a
//    phase (slice 0 of every step of the phase, then slice 1, ...; a step with fewer slices is skipped for the
//    higher slice indices), and phases (Step::fence) one after another. Chunks
//    map to elements through the same block shapes as the communicator (call_blocks) and chorus::Layout.
//  - A step-slice starts when the previous step-slice of its lane has finished, its incoming message (the k-th on
//    its (sender, receiver, channel) FIFO) has arrived, and its outgoing FIFO has a free slot: at most
//    `fifo_depth` messages in flight per FIFO; a slot frees when the receiver's step-slice that consumed the
//    message finishes.
//  - Local work: each rank is one CPU, a FIFO server shared by its lanes. A step-slice occupies it for
//    bytes / copy_Bps per copy and bytes / reduce_Bps (gamma) per reduction: send, recv, copy = 1 copy;
//    recv_reduce, recv_reduce_send, reduce = 1 reduction; recv_reduce_copy_send = 1 reduction + 1 copy;
//    recv_copy_send = 2 copies. A rate of 0 means free. Each message costs its sender's step-slice, and again its
//    receiver's, the link class's overhead (LinkParams::overhead_s; LogGP's o): a root that posts N-1 messages
//    spends (N-1) o before the last one leaves, which is what makes trees beat direct exchanges at scale for small
//    messages. The step-slice finishes when its work does.
//  - A message leaves when its step-slice finishes and costs alpha + bytes / bandwidth of the pair's link class.
//    Each connection (FIFO) is a server: its messages serialise on the bandwidth term, latency overlaps
//    (LogGP's view of alpha as latency, not occupancy). A message between hosts also needs the sender host's
//    egress and the receiver host's ingress (Host::net_egress_Bps, net_ingress_Bps; 0 = unlimited), FIFO servers
//    taken in the order messages get there once their own connection is free: the transfer starts when the
//    egress and the ingress are both free, holds each for bytes / its own rate, and arrives alpha after the
//    slowest of the three is done. So two flows sharing an egress of the connection's bandwidth each get half of
//    it, and with twice the connection's bandwidth both run at full speed.
//  - Events are processed in time order (ties: lower lane index first), so results are deterministic. When no
//    CPU, egress or ingress is shared by two lanes or connections (one lane per rank or free local work; at most
//    one connection through each limited host link), every time is a max-plus function of its predecessors and
//    the walk runs without an event queue, in any order, with the same result.
//  - Simplifications: a copy is charged even where the executor skips it (in place); a coarsened step (below)
//    pays one overhead per simulated slice, not per real one; all-to-allv is taken as
//    uniform (`count` per peer); every rank has a CPU of its own (Host::cores is not consulted); a link class
//    with bandwidth 0 is unlimited.
//
// Coarsening: simulating every slice of a big call on many ranks is slow. When the program has more
// step-slices than `max_step_slices`, each step is simulated with at most K = max(1, max_step_slices / steps)
// slices (its slice size scaled up to ceil(elements / K)); a program within the budget is sliced exactly as the
// executor slices it. Pipelines deeper than K slices are then predicted somewhat slower than they run.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "algorithms/program.h"
#include "topology/topology.h"

namespace chorus::algo {

struct SimOptions {
  size_t slice_bytes = size_t{256} << 10;  // CHORUS_SLICE_BYTES: bytes per message (>= 1)
  int fifo_depth = 4;                      // CHORUS_FIFO_DEPTH: messages in flight per connection (>= 1)
  // Step-slices simulated at most (see "Coarsening"); 0 = default_step_slices(nranks).
  int64_t max_step_slices = 0;
};

struct SimResult {
  double seconds = 0;     // predicted time of the call: when the last step of any rank finishes
  int critical_rank = 0;  // the rank that finishes last (lowest such rank)
  int64_t messages = 0;   // messages sent, all ranks (one per step-slice that sends)
  std::array<int64_t, topo::kLinkClasses> messages_per_class{};
  std::array<uint64_t, topo::kLinkClasses> bytes_per_class{};  // payload bytes sent per link class
  int64_t step_slices = 0;                                     // step-slices simulated
  int max_slices_per_step = 0;                                 // K of the coarsening; 0 when slicing is exact
  double cpu_busy_max_s = 0;  // the busiest rank's local work (copies and reductions), seconds
};

// Predicts one call of `program` on `topology` with the API's `count` (elements, as passed to the collective:
// per-rank block for all-gather, reduce-scatter and all-to-all) of `elem_size` bytes each.
// Throws chorus::Error: chorusInvalidArgument when the topology's rank count differs from the program's, or
// elem_size, slice_bytes or fifo_depth is 0; chorusInternalError when the program is malformed (peer or chunk
// out of range) or deadlocks with this FIFO depth, naming the stuck ranks.
// The default budget of simulated step-slices: 32768 up to 64 ranks (a few ms per prediction), then 1024 more per
// rank (4096 ranks: 4.2M; a double binary tree keeps about 170 slices per step).
int64_t default_step_slices(int nranks);

SimResult simulate(const Program& program, const topo::Topology& topology, size_t count, size_t elem_size,
                   const SimOptions& options = {});

}  // namespace chorus::algo
