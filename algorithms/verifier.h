// The verifier: symbolic execution of a program on every rank (DESIGN.md, "Programs").
//
// Every chunk holds the multiset of (rank, input chunk) contributions it carries, plus how many times the avg
// division was applied. Messages travel through FIFOs of bounded capacity (one per sender, receiver and channel),
// so the run also proves the absence of deadlock; for these blocking-read programs, completion with a capacity
// implies completion with any larger one. The postcondition of each collective is then checked on every rank:
//  - all-reduce: output chunk c holds (q, c) for every rank q exactly once, finished once;
//  - reduce-scatter: output part p of rank r holds (q, block r part p) for every q, finished once;
//  - reduce: the same at the root for its one block; non-root outputs are never written;
//  - all-gather: output block b part p is an exact copy of rank b's input part p;
//  - broadcast: every output part is an exact copy of the root's; non-root inputs are never read;
//  - all-to-all(v): output block b part p of rank r is an exact copy of rank b's input block r part p;
//  - gather: the root's output block b part p is an exact copy of rank b's input part p; non-root outputs are
//    never written;
//  - scatter: rank r's output part p is an exact copy of the root's input block r part p; non-root inputs are
//    never read.
// Compressed programs (StepCode bits) treat the codec as exact for the contributions, count how many times each
// contribution is quantized, check that coded messages are received as coded, and prove that every rank of a
// compressed all-reduce or all-gather ends with the same bits (values decoded from the same codes or copied).
// In-place mode aliases the input and output chunks the way the API does (e.g. all-gather's input is output
// block r) and additionally proves that no input is read after it was overwritten.
// A second walk cuts every message into slices as the executor does: it proves the absence of deadlock once
// messages no longer fit a FIFO whole, and, with a vector clock per lane, that lanes of one rank which share a chunk
// are ordered by messages wherever one writes what the other reads or writes.
#pragma once

#include <cstdint>
#include <string>

#include "algorithms/program.h"

namespace chorus::algo {

struct VerifyOptions {
  bool in_place = false;
  // Messages in flight per (sender, receiver, channel). Steps that receive and send at once need 2 in a ring
  // where every rank sends first; the executor's FIFOs have at least 2 slots (CHORUS_FIFO_DEPTH >= 2).
  int fifo_capacity = 2;
};

struct VerifyResult {
  bool ok = false;
  std::string error;     // first violation found, naming rank, lane and step
  int64_t messages = 0;  // messages sent in total
  int64_t rounds = 0;    // scheduling rounds until completion (a rough depth measure)
  // Compressed programs: the fewest and most times one contribution went through the codec on its way to an
  // output (0 for uncompressed programs). Quantize-once all-reduce: 2 for every contribution
  // (once on the way to the owner, once in the owner's result); the coded ring: 2 to N.
  int min_quantizations = 0, max_quantizations = 0;
  // Lanes of one rank that share a chunk were proved ordered where they touch it (a chain of messages from each
  // write to every later access by another lane). False when more than SliceWalk's bound of lanes (4096) share
  // chunks and the check was skipped; everything else is still proved.
  bool lanes_ordered = true;
};

VerifyResult verify(const Program& program, const VerifyOptions& options = {});

// True if `coll` has an in-place form the verifier checks (all but all-to-all(v), which the communicator stages).
bool has_in_place_form(Coll coll);

}  // namespace chorus::algo
