// Programs: the intermediate representation every collective algorithm is written in (DESIGN.md, "Programs").
//
// A program gives, for one rank, a few lanes of steps. A lane is an ordered list of steps bound to one channel;
// lanes run concurrently. Steps name chunks, never bytes: a buffer (input, output, scratch) is `nblocks` blocks,
// each cut into `parts` chunks, and chunk index = block * parts + part; a step names a run of consecutive chunks
// (ChunkRef). The executor maps chunks to bytes for the actual call (Layout) and cuts every run into slices for
// pipelining.
//
// Matching rule: between two ranks on one channel, the k-th message sent matches the k-th message received.
// Programs are pure data: they are generated, verified (verifier.h) and cached without any network.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::algo {

enum class Coll : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  Reduce,
  AllToAll,
  AllToAllv,
  SendRecv,
  Barrier,
  Gather,   // every rank's block to the root's output (MPI_Gather; RCCL's ncclGather)
  Scatter,  // block r of the root's input to rank r (MPI_Scatter; RCCL's ncclScatter)
  Count
};
const char* coll_name(Coll c);
// Collectives with a root: broadcast, reduce, gather and scatter.
inline bool rooted(Coll c) {
  return c == Coll::Broadcast || c == Coll::Reduce || c == Coll::Gather || c == Coll::Scatter;
}

enum class BufKind : uint8_t { Input, Output, Scratch };

// A run of `count` consecutive chunks of one buffer, from `chunk` (DESIGN.md: "buffer, chunk index, number of
// chunks"). Chunk order is memory order (chunk = block * parts + part, blocks are consecutive), so a run is one
// contiguous range and a step on it moves one message (cut into slices like any chunk): a round of halving/doubling
// that hands a partner half of the buffer costs one message, not one per chunk. Rules the verifier enforces: count
// >= 1; a step's src and dst runs have the same count; a receiving step's run has the count of the message; a
// coded step (StepCode bits) names one chunk; all-to-all(v) runs stay inside one block (all-to-allv blocks lie
// anywhere).
struct ChunkRef {
  BufKind buf = BufKind::Input;
  int32_t chunk = 0;
  int32_t count = 1;
  bool operator==(const ChunkRef&) const = default;
};
// True if two runs share a chunk of one buffer (as named; in-place aliases of the input and output are not seen).
inline bool overlaps(const ChunkRef& a, const ChunkRef& b) {
  return a.buf == b.buf && a.chunk < b.chunk + b.count && b.chunk < a.chunk + a.count;
}

// What a step does with the message it receives (if any), its local operand `src` and its destination `dst`.
enum class OpCode : uint8_t {
  Send,                // msg_out = src
  Recv,                // dst = msg_in
  RecvReduce,          // dst = msg_in (+) src
  RecvReduceSend,      // msg_out = msg_in (+) src
  RecvReduceCopySend,  // dst = msg_out = msg_in (+) src
  RecvCopySend,        // dst = msg_out = msg_in
  Copy,                // dst = src
  Reduce,              // dst = dst (+) src (local; dst must hold data)
};
const char* opcode_name(OpCode op);
inline bool op_receives(OpCode op) { return op != OpCode::Send && op != OpCode::Copy && op != OpCode::Reduce; }
inline bool op_sends(OpCode op) {
  return op == OpCode::Send || op == OpCode::RecvReduceSend || op == OpCode::RecvReduceCopySend ||
         op == OpCode::RecvCopySend;
}
inline bool op_reads_src(OpCode op) {
  return op == OpCode::Send || op == OpCode::RecvReduce || op == OpCode::RecvReduceSend ||
         op == OpCode::RecvReduceCopySend || op == OpCode::Copy || op == OpCode::Reduce;
}
inline bool op_writes_dst(OpCode op) {
  return op == OpCode::Recv || op == OpCode::RecvReduce || op == OpCode::RecvReduceCopySend ||
         op == OpCode::RecvCopySend || op == OpCode::Copy || op == OpCode::Reduce;
}
inline bool op_reduces(OpCode op) {
  return op == OpCode::RecvReduce || op == OpCode::RecvReduceSend || op == OpCode::RecvReduceCopySend ||
         op == OpCode::Reduce;
}

// Wire coding of a step (compressed collectives, docs/compression.md). Q is the call's codec (quantize to codes and
// scales), D its decoder. Without these flags a message carries the value's elements as they are.
enum StepCode : uint8_t {
  // The received message holds codes: the step uses D(message).
  kCodedIn = 1,
  // The sent message holds codes: Q(value), except that RecvCopySend with kCodedIn forwards the received bytes
  // unchanged (quantized once, forwarded exactly). A step that also writes dst writes D(what it sent), so dst holds
  // exactly what the receivers decode. A Copy with kCodedOut sends nothing and writes dst = D(Q(src)): the value a
  // receiver of Q(src) gets, with the same stochastic-rounding key (the key is a function of the src chunk and
  // slice), so every rank ends with the same bits.
  kCodedOut = 2,
  // With kCodedOut, on a step that reads src: error feedback (Seide et al. 2014; 1-bit Adam, Tang et al. 2021).
  // value += residual[src chunk]; residual[src chunk] = value - D(Q(value)). When src is not the input, src is
  // rewritten to the corrected value, so later encodes of src produce the same bytes. The residual buffer mirrors
  // the input (worker residual) and the scratch (owner residual); the caller owns it.
  kErrorFeedback = 4,
};

struct Step {
  OpCode op = OpCode::Copy;
  int32_t recv_peer = -1;  // rank the message comes from (receiving ops)
  int32_t send_peer = -1;  // rank the message goes to (sending ops)
  ChunkRef src;            // local operand (ops that read src)
  ChunkRef dst;            // destination (ops that write dst)
  // The value produced is complete: the avg division is applied to it (once, where the reduction finishes).
  bool final = false;
  uint8_t code = 0;  // StepCode bits; 0 for every uncompressed program
  // Starts a phase. A lane runs its steps slice-major within a phase (slice 0 of each step, then slice 1, ...)
  // and finishes every slice of a phase before the next begins. Slice s of a step is the s-th slice of its run,
  // so within a phase a step may read what an earlier step wrote only through a run that starts at the same
  // chunk (the verifier checks this); a step that needs whole runs of earlier steps starts a phase.
  bool fence = false;
};

struct Lane {
  int32_t channel = 0;
  std::vector<Step> steps;
};

// The order a lane's step-slices run in, shared by the executor, the simulator and the verifier: slice-major within
// a phase (Step::fence), phases in turn. Call it after step `step` of slice `slice` ran or was skipped (it has no such
// slice); `more` says whether a step of this pass over the phase has slices after `slice`, and `phase` is the first
// step of the current phase. Returns false when the lane is done.
template <class Index>
bool next_step_slice(const Step* steps, Index nsteps, Index& phase, Index& step, Index& slice, bool& more) {
  if (++step < nsteps && !steps[step].fence) return true;
  if (more) {  // the phase's next slice
    step = phase;
    ++slice;
    more = false;
    return true;
  }
  if (step == nsteps) return false;
  phase = step;  // the next phase
  slice = 0;
  return true;
}

struct BufShape {
  int32_t nblocks = 0;
  int32_t parts = 1;
  int32_t nchunks() const { return nblocks * parts; }
};

struct RankProgram {
  BufShape input, output, scratch;
  std::vector<Lane> lanes;
};

// One algorithm's program for every rank of a communicator.
struct Program {
  Coll coll = Coll::AllReduce;
  std::string algorithm;    // e.g. "ring"
  bool compressed = false;  // some steps carry StepCode bits: the call must come with a codec
  int nranks = 0;
  int root = 0;
  int nchannels = 1;
  std::vector<RankProgram> ranks;
};

// Human-readable listing of one rank's program (for chorus-plan, tests and error messages).
std::string to_string(const RankProgram& p);

// The blocks the API fixes for one buffer of a collective call: `nblocks` blocks of `block_elems` elements each.
// `count` is the API's count argument (elements per rank block: all-gather's input, reduce-scatter's output,
// all-to-all's per-peer block, gather's and scatter's per-rank block). Input and output: all-reduce, broadcast,
// reduce, barrier: 1 block; all-gather and gather: 1 in, nranks out; reduce-scatter and scatter: nranks in, 1 out;
// all-to-all: nranks each. All-to-allv has explicit blocks in a real call; here it is taken as uniform (`count`
// per peer), the view the simulator and selector use.
// Scratch: `program.scratch.nblocks` blocks the size of one output block (`count`). Send/receive has no uniform
// shape: returns {0, 0}. The communicator (run_call) and the simulator both map chunks to bytes through this.
struct BlockShape {
  int nblocks = 0;
  size_t block_elems = 0;
};
BlockShape call_blocks(Coll coll, BufKind buf, size_t count, int nranks, const RankProgram& program);

}  // namespace chorus::algo
