// The algorithm table: every program generator registers here with an id, a name, what it supports and a
// one-line description (printed by chorus-info). Generators are pure functions of (nranks, root, nchannels).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "algorithms/program.h"

namespace chorus::algo {

struct ProgramParams {
  int nranks = 1;
  int root = 0;
  int nchannels = 1;
};

struct AlgorithmInfo {
  int id;
  Coll coll;
  const char* name;         // "ring", "pairwise", ...
  const char* description;  // one line, with the source for anything from the literature
  Program (*generate)(const ProgramParams&);
};

std::span<const AlgorithmInfo> algorithm_table();
// The algorithm named `name` for `coll`, or nullptr.
const AlgorithmInfo* find_algorithm(Coll coll, const std::string& name);
// The default algorithm for `coll` (the only choice until the selector exists).
const AlgorithmInfo& default_algorithm(Coll coll);

// Cached program for (coll, algorithm, params); thread-safe; programs are immutable once built.
std::shared_ptr<const Program> get_program(const AlgorithmInfo& algo, const ProgramParams& params);

// Generators (exposed for tests).
Program ring_allreduce(const ProgramParams& p);
Program oneshot_allreduce(const ProgramParams& p);
Program ring_allgather(const ProgramParams& p);
Program ring_reduce_scatter(const ProgramParams& p);
Program chain_broadcast(const ProgramParams& p);
Program chain_reduce(const ProgramParams& p);
Program pairwise_alltoall(const ProgramParams& p);

}  // namespace chorus::algo
