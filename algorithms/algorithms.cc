#include "algorithms/algorithms.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

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
Program tree_barrier(const ProgramParams& p) {
  // A zero-byte double-binary-tree all-reduce: the roots hear from every rank before anyone is released.
  Program prog = tree_allreduce(p);
  prog.coll = Coll::Barrier;
  return prog;
}

// Floors (CostFloor) of the algorithms whose cost grows linearly with the rank count.
CostFloor two_ring_passes(int n) { return {2 * int64_t{n - 1}, 4 * int64_t{n - 1}}; }  // all-reduce: RS then AG
CostFloor one_ring_pass(int n) { return {int64_t{n - 1}, 2 * int64_t{n - 1}}; }
CostFloor chain(int n) { return {int64_t{n - 1}, 0}; }
// N(N-1) messages in all, so on average (and so on the busiest rank) N-1 sent and N-1 received: every block
// travels alone (PAT).
CostFloor n_minus_1_each_way(int n) { return {0, 2 * int64_t{n - 1}}; }
// The same, each message between two different ranks directly (pairwise, one-shot).
CostFloor every_pair_directly(int n) { return {0, 2 * int64_t{n - 1}, true}; }
// The root alone sends or receives N-1 messages.
CostFloor root_of_all(int n) { return {0, int64_t{n - 1}}; }

constexpr AlgorithmInfo kAlgorithms[] = {
    {0, Coll::AllReduce, "ring", "ring reduce-scatter then all-gather, 2(N-1) steps (Patarasuk & Yuan 2009)",
     ring_allreduce, two_ring_passes},
    {1, Coll::AllGather, "ring", "ring all-gather, N-1 steps (Thakur, Rabenseifner and Gropp 2005)", ring_allgather,
     one_ring_pass},
    {2, Coll::ReduceScatter, "ring", "ring reduce-scatter, N-1 steps (Patarasuk and Yuan 2009)", ring_reduce_scatter,
     one_ring_pass},
    {3, Coll::Broadcast, "ring", "pipelined chain from the root around the ring", chain_broadcast, chain},
    {4, Coll::Reduce, "ring", "pipelined chain around the ring ending at the root", chain_reduce, chain},
    {5, Coll::AllToAll, "pairwise", "pairwise exchange, N-1 steps, step t pairs ranks t apart (Thakur et al. 2005)",
     pairwise_alltoall, every_pair_directly},
    {6, Coll::AllToAllv, "pairwise", "pairwise exchange with per-peer counts", pairwise_alltoallv, every_pair_directly},
    {7, Coll::Barrier, "oneshot", "zero-byte one-shot all-reduce: every rank hears from every rank in one hop",
     oneshot_barrier, every_pair_directly},
    {8, Coll::AllReduce, "oneshot",
     "every rank sends its input to every rank and reduces in rank order: one hop, for small messages",
     oneshot_allreduce, every_pair_directly},
    {9, Coll::AllReduce, "tree",
     "double binary tree: reduce up and broadcast down two trees, each carrying half (Sanders et al. 2009)",
     tree_allreduce},
    {10, Coll::Broadcast, "tree", "double binary tree from the root, each tree carrying half", tree_broadcast},
    {11, Coll::Reduce, "tree", "double binary tree towards the root, each tree carrying half", tree_reduce},
    {12, Coll::AllReduce, "rhd",
     "recursive halving reduce-scatter then doubling all-gather, any N (Rabenseifner 2004; Thakur et al. 2005)",
     rhd_allreduce},
    {13, Coll::ReduceScatter, "rhd", "recursive halving, any N (Thakur et al. 2005)", rhd_reduce_scatter},
    {14, Coll::AllGather, "rhd", "recursive doubling, any N (Thakur et al. 2005)", rhd_allgather},
    {15, Coll::AllGather, "bruck", "Bruck: ceil(log2 N) rounds at distances 1, 2, 4... (Bruck et al. 1997)",
     bruck_allgather},
    {16, Coll::AllToAll, "bruck",
     "Bruck: ceil(log2 N) rounds of one packed message each (Bruck et al. 1997; MPICH, Thakur et al. 2005)",
     bruck_alltoall},
    {17, Coll::AllGather, "pat",
     "PAT-style (NCCL 2.23 parallel aggregated trees): binomial trees at halving distances, no buffer", pat_allgather,
     n_minus_1_each_way},
    {18, Coll::ReduceScatter, "pat", "PAT-style (NCCL 2.23): mirrored binomial trees, deepest first, one scratch block",
     pat_reduce_scatter, n_minus_1_each_way},
    {19, Coll::AllReduce, "hier",
     "hierarchical: reduce-scatter in each host, all-reduce across hosts per part, all-gather in each host",
     hier_allreduce},
    {20, Coll::AllGather, "hier", "hierarchical: all-gather in each host, across hosts per part, then in each host",
     hier_allgather},
    {21, Coll::ReduceScatter, "hier", "hierarchical: reduce in each host, across hosts per part, hand to the owner",
     hier_reduce_scatter},
    {22, Coll::AllToAll, "hier",
     "two-level: packed through the host member matching the destination's local index, one message per pair "
     "and level",
     hier_alltoall},
    {23, Coll::Barrier, "tree", "zero-byte double-binary-tree all-reduce: 2 log2(N) hops, for any N", tree_barrier},
    {24, Coll::Gather, "linear", "every rank sends its block straight to the root: N-1 messages into the root",
     linear_gather, root_of_all},
    {25, Coll::Scatter, "linear", "the root sends each rank its block directly: N-1 messages out of the root",
     linear_scatter, root_of_all},
    {26, Coll::Gather, "binomial",
     "binomial tree: each rank forwards its subtree's blocks as one message, ceil(log2 N) rounds (Chan et al. 2007)",
     binomial_gather},
    {27, Coll::Scatter, "binomial",
     "binomial tree: each rank receives its subtree's blocks as one message, ceil(log2 N) rounds (Chan et al. 2007)",
     binomial_scatter},
};

constexpr AlgorithmInfo kCompressed[] = {
    {kCompressedIdBase + 0, Coll::AllReduce, "qonce",
     "quantize once: direct reduce-scatter of codes, fp32 accumulation at the owner, one re-quantization, "
     "all-gather of the owner's exact codes (ZeRO++, Wang et al. 2023; THC, Li et al. 2024); on several hosts "
     "exact inside each host, quantize-once across hosts",
     qonce_allreduce},
    {kCompressedIdBase + 1, Coll::ReduceScatter, "qonce",
     "direct exchange of codes, fp32 accumulation at the owner: each contribution quantized once",
     qonce_reduce_scatter},
    {kCompressedIdBase + 2, Coll::AllGather, "qonce",
     "every rank quantizes its block once and sends the codes to all (ZeRO++ quantized weight all-gather)",
     qonce_allgather},
    {kCompressedIdBase + 3, Coll::AllReduce, "ring", "ring with every message coded: re-quantizes at every hop",
     coded_ring_allreduce},
    {kCompressedIdBase + 4, Coll::ReduceScatter, "ring", "ring with every message coded: re-quantizes at every hop",
     coded_ring_reduce_scatter},
    {kCompressedIdBase + 5, Coll::AllGather, "ring", "ring forwarding each block's codes unchanged",
     coded_ring_allgather},
    {kCompressedIdBase + 6, Coll::AllReduce, "hier",
     "hierarchical all-reduce with only the messages between hosts coded", coded_hier_allreduce},
    {kCompressedIdBase + 7, Coll::ReduceScatter, "hier",
     "hierarchical reduce-scatter with only the messages between hosts coded", coded_hier_reduce_scatter},
    {kCompressedIdBase + 8, Coll::AllReduce, "qonce-flat",
     "quantize once in one level on any topology: every rank's codes cross the network (error feedback, vote)",
     qonce_flat_allreduce},
};

constexpr bool compressed_ids_follow_base() {
  for (size_t i = 0; i < std::size(kCompressed); ++i)
    if (kCompressed[i].id != kCompressedIdBase + static_cast<int>(i)) return false;
  return std::size(kAlgorithms) <= kCompressedIdBase;
}
static_assert(compressed_ids_follow_base(), "compressed ids must be kCompressedIdBase + index");

constexpr bool ids_are_indices() {
  for (size_t i = 0; i < std::size(kAlgorithms); ++i)
    if (kAlgorithms[i].id != static_cast<int>(i)) return false;
  return true;
}
// The wire header carries the id and error messages index the table with it.
static_assert(ids_are_indices(), "algorithm ids must equal their index in the table");
}  // namespace

Program new_program(Coll coll, const char* name, const ProgramParams& p) {
  if (p.nranks < 1) throw std::invalid_argument("nranks must be >= 1");
  if (p.nchannels < 1) throw std::invalid_argument("nchannels must be >= 1");
  if (p.root < 0 || p.root >= p.nranks) throw std::invalid_argument("root out of range");
  if (!p.host_of_rank.empty() && static_cast<int>(p.host_of_rank.size()) != p.nranks)
    throw std::invalid_argument("host_of_rank must have one entry per rank");
  Program prog;
  prog.coll = coll;
  prog.algorithm = name;
  prog.nranks = p.nranks;
  prog.root = p.root;
  prog.nchannels = p.nchannels;
  prog.ranks.resize(p.nranks);
  return prog;
}

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

std::span<const AlgorithmInfo> compressed_algorithm_table() { return kCompressed; }

const AlgorithmInfo* find_compressed_algorithm(Coll coll, const std::string& name) {
  for (const AlgorithmInfo& a : kCompressed)
    if (a.coll == coll && name == a.name) return &a;
  return nullptr;
}

const AlgorithmInfo& default_compressed_algorithm(Coll coll, const std::vector<int>& host_of_rank) {
  bool several_hosts = false, shared_host = false;
  std::map<int, int> per_host;
  for (int h : host_of_rank) shared_host |= ++per_host[h] > 1;
  several_hosts = per_host.size() > 1;
  // qonce all-reduce is itself two-level on several hosts; reduce-scatter's qonce is one level.
  const AlgorithmInfo* hier = find_compressed_algorithm(coll, "hier");
  if (coll != Coll::AllReduce && several_hosts && shared_host && hier) return *hier;
  const AlgorithmInfo* qonce = find_compressed_algorithm(coll, "qonce");
  if (qonce) return *qonce;
  throw Error(chorusNotSupported, Subsys::Algorithms, cat("no compressed algorithm for ", coll_name(coll)));
}

std::string compressed_algorithm_names(Coll coll) {
  std::string s;
  for (const AlgorithmInfo& a : kCompressed)
    if (a.coll == coll) {
      if (!s.empty()) s += ", ";
      s += a.name;
    }
  return s;
}

const AlgorithmInfo* algorithm_by_id(int id) {
  if (id >= 0 && id < static_cast<int>(std::size(kAlgorithms))) return &kAlgorithms[id];
  const int c = id - kCompressedIdBase;
  if (c >= 0 && c < static_cast<int>(std::size(kCompressed))) return &kCompressed[c];
  return nullptr;
}

namespace {

struct ProgramCache {
  std::mutex mu;
  std::map<std::tuple<int, int, int, int, std::vector<int>>, std::shared_ptr<const Program>> programs;
};

ProgramCache& program_cache() {
  static ProgramCache* cache = new ProgramCache;  // never destroyed: communicators may die during static teardown
  return *cache;
}

}  // namespace

std::shared_ptr<const Program> get_program(const AlgorithmInfo& algo, const ProgramParams& params) {
  ProgramCache& cache = program_cache();
  auto key = std::make_tuple(algo.id, params.nranks, params.root, params.nchannels, params.host_of_rank);
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.programs.find(key);
  if (it != cache.programs.end()) return it->second;
  auto prog = std::make_shared<const Program>(algo.generate(params));
  cache.programs.emplace(std::move(key), prog);
  return prog;
}

void release_unused_programs() {
  ProgramCache& cache = program_cache();
  std::vector<std::shared_ptr<const Program>> dropped;  // freed after the lock: hundreds of MB at 1000 ranks
  std::lock_guard<std::mutex> lock(cache.mu);
  // use_count() is exact here: a new holder can only come through get_program, which takes the same lock.
  for (auto it = cache.programs.begin(); it != cache.programs.end();) {
    if (it->second.use_count() == 1) {
      dropped.push_back(std::move(it->second));
      it = cache.programs.erase(it);
    } else {
      ++it;
    }
  }
}

size_t cached_program_count(int nranks) {
  ProgramCache& cache = program_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return static_cast<size_t>(std::count_if(cache.programs.begin(), cache.programs.end(),
                                           [&](const auto& entry) { return std::get<1>(entry.first) == nranks; }));
}

}  // namespace chorus::algo
