// The host executor: runs one rank's program for one call (DESIGN.md, "One collective, end to end", step 5).
//
// Chunks are mapped to bytes by a Layout. Every run of chunks a step names is cut into slices of at most
// `slice_elems` elements; a lane runs slice-major within each phase (slice 0 through all the phase's steps, then
// slice 1, ...; Step::fence starts a phase), so step i of slice s waits only for slice s of its inputs while
// neighbours already work on slice s+1: that is the pipelining. Lanes progress concurrently
// in one thread; a step runs when its message has arrived and its outgoing slot is free, and the reduction is
// fused with the copy into the outgoing slot (zero-copy receive, one pass over the data per hop).
//
// Errors: a mismatched header (another collective, count, dtype, op or root) throws chorusRemoteError showing both
// fingerprints; a deadline throws chorusTimeout naming the peer waited for; `check_abort` is polled and throws
// when the communicator failed or was aborted. Thread-safety: one call at a time per communicator.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/program.h"
#include "core/deadline.h"
#include "kernels/cpu/reduce.h"
#include "transports/transport.h"

namespace chorus {

struct Span {
  std::byte* ptr = nullptr;
  size_t elems = 0;
};

// Chunk -> bytes for one call: each buffer is a list of blocks (pointer, elements), each cut into `parts` chunks
// of balanced sizes (they differ by at most one element).
class Layout {
 public:
  struct Buffer {
    // Uniform blocks (no allocation): base + b * block_elems elements.
    std::byte* base = nullptr;
    size_t block_elems = 0;
    int nblocks = 0;
    // Explicit blocks (all-to-allv, point-to-point), used when non-empty.
    std::vector<std::byte*> block_ptr;
    std::vector<size_t> block_elem;
    int parts = 1;
  };
  // `nblocks` consecutive blocks of `block_elems` elements from `base`.
  void set_uniform(algo::BufKind kind, void* base, int nblocks, size_t block_elems, int parts);
  void set_blocks(algo::BufKind kind, std::vector<std::byte*> ptrs, std::vector<size_t> elems, int parts);
  Span chunk(const algo::ChunkRef& ref) const;
  size_t elem_size = 1;

 private:
  Buffer bufs_[3];
};

// The codec of a compressed call, as the executor uses it: fp32 values to one message of codes and scales and
// back (kernels/cpu/codec.h does the work). Encoding is deterministic for a given `key`, so two encodes of the
// same values with the same key give the same bytes. Thread-safety: const methods, no shared state.
class WireCodec {
 public:
  virtual ~WireCodec() = default;
  // Bytes of the message that carries `elems` values.
  virtual size_t encoded_bytes(size_t elems) const = 0;
  // Elements per scale block; slices are cut at multiples of it so no block straddles two slices or chunks.
  virtual size_t block_elems() const = 0;
  // `first_elem` places the slice in this rank's buffers (a distinct range per buffer, chunk and slice) for
  // stochastic rounding; the codec adds the rank and the call's step.
  virtual void encode(const float* in, size_t elems, std::byte* out, uint64_t first_elem) const = 0;
  virtual void decode(const std::byte* in, size_t elems, float* out) const = 0;
  // acc[i] += decoded element i.
  virtual void decode_accumulate(const std::byte* in, size_t elems, float* acc) const = 0;
};

struct StepConns {
  Connection* recv = nullptr;
  Connection* send = nullptr;
};

struct ExecPlan {
  const algo::RankProgram* program = nullptr;
  const Layout* layout = nullptr;
  const kernels::Reducer* reducer = nullptr;  // nullptr: the collective only copies
  // Compressed programs: the codec (float32 elements only) and the error-feedback residuals, laid out like the
  // input and the scratch (`residual` maps BufKind::Input and BufKind::Scratch chunks to them), or nullptr.
  const WireCodec* codec = nullptr;
  const Layout* residual = nullptr;
  size_t slice_elems = 1;
  WireHeader header;                                           // template for every message (bytes filled per message)
  const std::vector<std::vector<StepConns>>* conns = nullptr;  // [lane][step]
  const std::vector<Connection*>* all_conns = nullptr;         // every connection used (pumped and flushed)
  Deadline deadline = Deadline::never();
  std::function<void()> check_abort;  // throws when the communicator failed or was aborted
  std::function<void()> check_peers;  // while stalled: throws on a peer's request showing it called another call
  int rank = 0;                       // for error messages ("rank 2: AllReduce #5: ...")
  int spin_us = 20;                   // spin this long, then
  int yield_us = 0;                   // yield the core this long, then sleep on the stalled connection
};

// "rank 2: AllReduce #5" (or "rank 2: SendRecv"): how errors of this call begin.
std::string describe_call(int rank, const WireHeader& h);

void execute(const ExecPlan& plan);

// "AllReduce(count=10, float, sum, root=0)" from a header, for mismatch reports.
std::string describe_header(const WireHeader& h);
// True if two headers describe the same call (communicator, sequence, collective, count, dtype, op, root).
bool same_call(const WireHeader& a, const WireHeader& b);

}  // namespace chorus
