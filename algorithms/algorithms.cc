#include "algorithms/algorithms.h"

#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"

namespace chorus::algo {

namespace {
Program pairwise_alltoallv(const ProgramParams& p) {
  Program prog = pairwise_alltoall(p);
  prog.coll = Coll::AllToAllv;
  return prog;
}
Program oneshot_barrier(const ProgramParams& p) {
  // A zero-byte one-shot all-reduce: no rank finishes before it heard from every rank, in one hop.
  Program prog = oneshot_allreduce(p);
  prog.coll = Coll::Barrier;
  return prog;
}

constexpr AlgorithmInfo kAlgorithms[] = {
    {0, Coll::AllReduce, "ring", "ring reduce-scatter then all-gather, 2(N-1) steps (Patarasuk & Yuan 2009)",
     ring_allreduce},
    {1, Coll::AllGather, "ring", "ring all-gather, N-1 steps", ring_allgather},
    {2, Coll::ReduceScatter, "ring", "ring reduce-scatter, N-1 steps", ring_reduce_scatter},
    {3, Coll::Broadcast, "ring", "pipelined chain from the root around the ring", chain_broadcast},
    {4, Coll::Reduce, "ring", "pipelined chain around the ring ending at the root", chain_reduce},
    {5, Coll::AllToAll, "pairwise", "pairwise exchange, N-1 steps, step t pairs ranks t apart", pairwise_alltoall},
    {6, Coll::AllToAllv, "pairwise", "pairwise exchange with per-peer counts", pairwise_alltoallv},
    {7, Coll::Barrier, "oneshot", "zero-byte one-shot all-reduce: every rank hears from every rank in one hop",
     oneshot_barrier},
    {8, Coll::AllReduce, "oneshot",
     "every rank sends its input to every rank and reduces in rank order: one hop, for small messages",
     oneshot_allreduce},
};
}  // namespace

std::span<const AlgorithmInfo> algorithm_table() { return kAlgorithms; }

const AlgorithmInfo* find_algorithm(Coll coll, const std::string& name) {
  for (const AlgorithmInfo& a : kAlgorithms)
    if (a.coll == coll && name == a.name) return &a;
  return nullptr;
}

const AlgorithmInfo& default_algorithm(Coll coll) {
  for (const AlgorithmInfo& a : kAlgorithms)
    if (a.coll == coll) return a;
  throw Error(chorusNotSupported, Subsys::Algorithms, cat("no algorithm for ", coll_name(coll)));
}

std::shared_ptr<const Program> get_program(const AlgorithmInfo& algo, const ProgramParams& params) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int>, std::shared_ptr<const Program>> cache;
  auto key = std::make_tuple(algo.id, params.nranks, params.root, params.nchannels);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto prog = std::make_shared<const Program>(algo.generate(params));
  cache.emplace(key, prog);
  return prog;
}

}  // namespace chorus::algo
