// The algorithm table: every program generator registers here with an id, a name, what it supports and a
// one-line description (printed by chorus-info). Generators are pure functions of (nranks, root, nchannels).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "algorithms/program.h"

namespace chorus::algo {

struct ProgramParams {
  int nranks = 1;
  int root = 0;
  int nchannels = 1;
  // rank -> host index (hosts numbered 0..H-1), for hierarchical programs; empty means one host. Flat programs
  // ignore it.
  std::vector<int> host_of_rank;
};

// What every run of an algorithm's program on `nranks` ranks pays, from its structure alone, so the selector can
// skip generating and simulating a candidate that cannot win (selector.h). 0 claims nothing.
//  - hops: messages on the longest chain in which each message can only leave once the one before it has arrived
//    (a ring all-gather: N-1). Each costs at least alpha + 2 o of the cheapest link class.
//  - rank_messages: messages the busiest rank sends plus receives (a linear gather's root: N-1). Each costs that
//    rank's CPU at least o of the cheapest class, and a rank's CPU does one thing at a time.
//  - direct: every rank exchanges a message with every other rank, each way (pairwise, one-shot). On several
//    hosts, a rank of the smallest host (m ranks) then pays 2 (N - m) network overheads.
// All are lower bounds for any count, channel count and host layout; tests/unit/selector_test.cc checks them
// against the simulator.
struct CostFloor {
  int64_t hops = 0;
  int64_t rank_messages = 0;
  bool direct = false;
};

struct AlgorithmInfo {
  int id;
  Coll coll;
  const char* name;         // "ring", "pairwise", ...
  const char* description;  // one line, with the source for anything from the literature
  Program (*generate)(const ProgramParams&);
  CostFloor (*floor)(int nranks) = nullptr;  // nullptr: no floor claimed (always simulated)
};

std::span<const AlgorithmInfo> algorithm_table();
// The algorithm named `name` for `coll`, or nullptr.
const AlgorithmInfo* find_algorithm(Coll coll, const std::string& name);
// The default algorithm for `coll` (the only choice until the selector exists).
const AlgorithmInfo& default_algorithm(Coll coll);

// Compressed programs (algorithms/compressed.cc, docs/compression.md): their own table, ids from
// kCompressedIdBase, so the selector and every loop over algorithm_table() see only uncompressed programs.
// A compressed call names one of these (or gets default_compressed_algorithm()).
constexpr int kCompressedIdBase = 64;
std::span<const AlgorithmInfo> compressed_algorithm_table();
const AlgorithmInfo* find_compressed_algorithm(Coll coll, const std::string& name);
// qonce, except reduce-scatter on several hosts with more than one rank on some host: hier.
const AlgorithmInfo& default_compressed_algorithm(Coll coll, const std::vector<int>& host_of_rank);
// Names of the compressed algorithms for `coll`, comma-separated (for error messages).
std::string compressed_algorithm_names(Coll coll);
// The algorithm with wire id `id` in either table, or nullptr.
const AlgorithmInfo* algorithm_by_id(int id);

// Cached program for (coll, algorithm, params); thread-safe; programs are immutable once built. Throws
// std::invalid_argument when the algorithm does not apply (nothing cached then). The cache keeps every program
// until release_unused_programs() drops it: whoever needs a program again holds it (a communicator's Selector
// holds the programs it generated), so a program is generated once per process while it is in use.
std::shared_ptr<const Program> get_program(const AlgorithmInfo& algo, const ProgramParams& params);
// Drops the cached programs that nobody else holds (a communicator calls it as it dies, after its selector).
// Thread-safe.
void release_unused_programs();
// The number of cached programs for `nranks` ranks (tests, diagnostics). Thread-safe.
size_t cached_program_count(int nranks);

// One-shot programs send N(N-1) messages: generated for at most this many ranks.
constexpr int kOneShotMaxRanks = 64;

// An empty program of `coll` for p.nranks ranks (each generator starts from it). Throws std::invalid_argument on
// bad parameters.
Program new_program(Coll coll, const char* name, const ProgramParams& p);

// Generators (exposed for tests). A generator throws std::invalid_argument when the program does not apply.
Program ring_allreduce(const ProgramParams& p);
Program oneshot_allreduce(const ProgramParams& p);
Program ring_allgather(const ProgramParams& p);
Program ring_reduce_scatter(const ProgramParams& p);
Program chain_broadcast(const ProgramParams& p);
Program chain_reduce(const ProgramParams& p);
Program pairwise_alltoall(const ProgramParams& p);
Program tree_allreduce(const ProgramParams& p);
Program tree_broadcast(const ProgramParams& p);
Program tree_reduce(const ProgramParams& p);
Program rhd_allreduce(const ProgramParams& p);
Program rhd_reduce_scatter(const ProgramParams& p);
Program rhd_allgather(const ProgramParams& p);
Program bruck_allgather(const ProgramParams& p);
Program bruck_alltoall(const ProgramParams& p);
Program pat_allgather(const ProgramParams& p);
Program pat_reduce_scatter(const ProgramParams& p);
Program hier_allreduce(const ProgramParams& p);
// hier_allreduce with a direct exchange (not a ring) among the owners of each part across hosts.
Program hier_allreduce_direct(const ProgramParams& p);
Program hier_allgather(const ProgramParams& p);
Program hier_reduce_scatter(const ProgramParams& p);
// hier_reduce_scatter whose messages between hosts carry one chunk each (for coded programs).
Program hier_reduce_scatter_single_chunks(const ProgramParams& p);
Program hier_alltoall(const ProgramParams& p);
Program linear_gather(const ProgramParams& p);
Program linear_scatter(const ProgramParams& p);
Program binomial_gather(const ProgramParams& p);
Program binomial_scatter(const ProgramParams& p);
Program qonce_allreduce(const ProgramParams& p);       // two-level when the ranks span several hosts
Program qonce_flat_allreduce(const ProgramParams& p);  // one level on any topology
Program qonce_reduce_scatter(const ProgramParams& p);
Program qonce_allgather(const ProgramParams& p);
Program coded_ring_allreduce(const ProgramParams& p);
Program coded_ring_reduce_scatter(const ProgramParams& p);
Program coded_ring_allgather(const ProgramParams& p);
Program coded_hier_allreduce(const ProgramParams& p);
Program coded_hier_reduce_scatter(const ProgramParams& p);

}  // namespace chorus::algo
