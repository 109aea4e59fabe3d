// The selector: which algorithm runs a collective call (DESIGN.md, "One collective, end to end", step 3).
//
// Precedence: an algorithm named for the call (per-call option) > a CHORUS_ALGO rule for the collective and size
// > the cost model. The cost model simulates (simulator.h) every algorithm of the collective's table whose
// generator accepts the communicator (a generator that throws std::invalid_argument, e.g. one-shot beyond 64
// ranks, is not a candidate) and picks the fastest, preferring the earlier table entry unless another is predicted
// more than 3% faster, so near-ties do not flip between sizes.
//
// Sizes are bytes as nccl-tests reports them (selection_bytes): all-reduce, broadcast, reduce: count * elem;
// all-gather and gather (receive bytes), reduce-scatter and scatter (send bytes), all-to-all(v):
// count * nranks * elem.
//
// The cost model decides per band of counts, not per count (decision_count): a job whose sizes keep changing pays
// one simulation per band, 8 bands per doubling of the size, and the memo stays bounded. CHORUS_ALGO ranges apply
// to the call's exact size. A named algorithm (per call, or a CHORUS_ALGO rule) is the only one generated and
// simulated. The cost model skips (neither generates nor simulates) a candidate whose cost floor
// (AlgorithmInfo::floor: hops x (alpha + 2 o), or the busiest rank's messages x o, at the cheapest link class the
// communicator has)
// already loses to the best prediction so far by more than the 3% margin: on 4096 ranks the ring and
// direct-exchange programs hold millions of steps, and at small sizes they cannot win.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/simulator.h"
#include "topology/topology.h"

namespace chorus::algo {

// One CHORUS_ALGO rule: sizes in [lo, hi) bytes use `algorithm`.
struct AlgoRule {
  uint64_t lo = 0;
  uint64_t hi = UINT64_MAX;  // UINT64_MAX: no upper bound
  std::string algorithm;
  std::string text;     // the rule as written, for explanations ("allreduce:0-64K:tree")
  bool pinned = false;  // added by CHORUS_DETERMINISTIC (add_deterministic_rules), not written in CHORUS_ALGO
};

struct AlgoOverrides {
  std::array<std::vector<AlgoRule>, static_cast<size_t>(Coll::Count)> rules;  // per collective, in spec order
  // The first rule of `coll` whose range holds `bytes`, or nullptr.
  const AlgoRule* find(Coll coll, uint64_t bytes) const;
  bool empty() const;
};

// CHORUS_DETERMINISTIC=1: appends, after the collective's own rules, a rule for every size that pins all-reduce
// and reduce-scatter to recursive halving/doubling (rhd; an element's additions happen in an order that does not
// depend on the count) and reduce to the ring, so a float result never changes bits because its size crossed a
// selection threshold. Its rules are marked `pinned`, and choices they make say so (ChoiceReason::Pinned).
void add_deterministic_rules(AlgoOverrides& overrides);

// Parses CHORUS_ALGO: `coll:rule[,rule...][;coll:...]`, rule = `[lo-hi:]algorithm`. Collectives: allreduce,
// allgather, reducescatter, broadcast, reduce, alltoall, alltoallv. Sizes are bytes with an optional K, M or G
// suffix (powers of 1024); `lo-hi` is half-open [lo, hi); either end may be left out (`64K-`, `-1M`); a bare
// algorithm covers every size. Example: `allreduce:0-64K:oneshot,64K-:ring;allgather:ring`. Overlapping rules:
// the first that matches wins. Empty or blank text gives no overrides.
// Throws chorus::Error(chorusInvalidArgument) naming CHORUS_ALGO and the offending part: an unknown collective
// (listing the names), an unknown algorithm for the collective (listing the algorithm table's names), a bad size
// or an empty range (lo >= hi).
AlgoOverrides parse_algo_overrides(const std::string& spec);

// CHORUS_ALGO's name of a collective ("allreduce"), or "" for send/receive and barrier.
const char* coll_spec_name(Coll coll);
// "ring, oneshot": the algorithm table's names for `coll`, in table order.
std::string algorithm_names(Coll coll);
// Bytes of a call as nccl-tests reports them (see above); `count` is the API's count argument.
uint64_t selection_bytes(Coll coll, size_t count, size_t elem_size, int nranks);

// The count the cost model decides a call of `count` elements with: `count` rounded up to 4 significant bits, so
// every count in (decision_count_low(d) - 1, d] shares the decision of d = decision_count(count). Counts below 16
// and powers of two are their own; otherwise the rounding is under 12.5%. Pure and the same on every rank.
size_t decision_count(size_t count);
// The smallest count whose decision_count() is `d` (d must be a value decision_count returns).
size_t decision_count_low(size_t d);

enum class ChoiceReason : uint8_t {
  PerCall,    // the call named its algorithm
  Override,   // a CHORUS_ALGO rule
  Pinned,     // CHORUS_DETERMINISTIC=1's rule
  CostModel,  // the fastest predicted candidate
};
const char* choice_reason_name(ChoiceReason r);  // "per-call", "CHORUS_ALGO", "cost model"

struct Candidate {
  const AlgorithmInfo* algorithm = nullptr;
  bool applicable = false;  // the generator accepted the communicator (and the program simulated, unless named)
  double predicted_s = 0;   // simulated seconds (valid when applicable; NaN for a named algorithm: not simulated)
  std::string note;         // why it is not applicable, or that it was not simulated (another was named)
};

struct Choice {
  const AlgorithmInfo* algorithm = nullptr;  // from algorithm_table()
  std::shared_ptr<const Program> program;    // its program for this communicator (from get_program)
  double predicted_s = 0;                    // the chosen program's simulated seconds; NaN when it was named
  ChoiceReason reason = ChoiceReason::CostModel;
  std::string why;     // one line for logs and chorus-plan
  size_t count = 0;    // the count the candidates were simulated at: decision_count() of the call's count
  uint64_t bytes = 0;  // selection_bytes at `count`
  // Every table entry of the collective, in table order. Under the cost model all were simulated but those whose
  // cost floor loses; when an algorithm was named (per call, or a CHORUS_ALGO rule that applies), only that one
  // was generated, and none was simulated.
  std::vector<Candidate> candidates;
};

// The cost model's pick among `candidates` (table order): the earliest applicable one that no other is predicted
// to beat by more than 3%; -1 when none is applicable.
int pick_candidate(const std::vector<Candidate>& candidates);

// Decides algorithms for one communicator. Thread-safe: choose() may run from any thread; decisions are memoized
// per (collective, decision_count(count), elem_size, root, per-call name, CHORUS_ALGO rule), so a repeated call,
// or a call of another count in the same band, costs one hash lookup.
class Selector {
 public:
  // `topology` must describe the communicator (nranks = topology.nranks(), host_of_rank from it); `nchannels`
  // is CHORUS_NCHANNELS. Throws chorusInvalidArgument when the topology has no ranks or nchannels < 1.
  Selector(topo::Topology topology, SimOptions sim, int nchannels, AlgoOverrides overrides = {});

  // Chooses the algorithm of a call of `coll` with the API's `count` (elements) of `elem_size` bytes; `root`
  // matters for broadcast and reduce only; `per_call_algorithm` (may be null or empty) forces a name.
  // Throws chorus::Error: chorusInvalidArgument when per_call_algorithm does not name an algorithm of `coll`
  // (listing the names) or that algorithm does not apply to this communicator (with the generator's reason);
  // chorusInvalidArgument for a collective without algorithms (send/receive); chorusInternalError when no
  // candidate could be simulated.
  std::shared_ptr<const Choice> choose(Coll coll, size_t count, size_t elem_size, int root,
                                       const char* per_call_algorithm = nullptr) const;
  // Every table entry of `coll` simulated at exactly `count` (no bands, no memo), in table order: what chorus-plan
  // prints beside the choice. Throws like choose() for a bad root or a collective without algorithms.
  std::vector<Candidate> evaluate(Coll coll, size_t count, size_t elem_size, int root) const;

  // The program of `algorithm` for this communicator (root: broadcast and reduce; else 0), generated once
  // (get_program) and held while the selector lives. Throws std::invalid_argument when it does not apply.
  std::shared_ptr<const Program> program(const AlgorithmInfo& algorithm, int root) const;

  const topo::Topology& topology() const { return topo_; }
  // rank -> host index of the topology, as the programs are generated with it.
  const std::vector<int>& host_of_rank() const { return host_of_rank_; }
  int nranks() const { return topo_.nranks(); }
  int nchannels() const { return nchannels_; }
  const SimOptions& sim_options() const { return sim_; }
  const AlgoOverrides& overrides() const { return overrides_; }

 private:
  struct Key {
    Coll coll;
    size_t count;
    size_t elem_size;
    int root;
    std::string algorithm;  // per-call name, or ""
    int rule = -1;          // index of the CHORUS_ALGO rule of `coll` that holds the call's exact bytes, or -1
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  std::shared_ptr<const Choice> decide(const Key& key) const;
  // The collective's table entries, each "not simulated" (throws when it has none, or for a bad root).
  std::vector<Candidate> unsimulated(Coll coll, int root) const;
  // The least time any run of `algorithm` takes here (AlgorithmInfo::floor at the cheapest link class present),
  // seconds;
  // 0 without a floor.
  double floor_seconds(const AlgorithmInfo& algorithm) const;
  // Generates (program()) and simulates one candidate in place; `out` receives its program when it applies.
  void simulate_candidate(Candidate& c, int root, size_t count, size_t elem_size,
                          std::shared_ptr<const Program>* out) const;

  topo::Topology topo_;
  SimOptions sim_;
  int nchannels_;
  AlgoOverrides overrides_;
  std::vector<int> host_of_rank_;
  double hop_floor_s_ = 0;       // min over the link classes present of alpha + 2 o
  double overhead_floor_s_ = 0;  // min over the link classes present of o
  double direct_floor_s_ = 0;    // CostFloor::direct: 2 (N - ranks of the smallest host) network o; 0 on one host
  mutable std::shared_mutex mu_;
  mutable std::unordered_map<Key, std::shared_ptr<const Choice>, KeyHash> memo_;
  // Decisions being made, by the first thread that asked: the others (thread-ranks sharing this selector, which
  // call together) wait for it instead of simulating the same candidates again.
  mutable std::unordered_map<Key, std::shared_future<std::shared_ptr<const Choice>>, KeyHash> deciding_;
  // Every program this selector generated or took from the cache, by (algorithm id, root): held, so that the
  // process-wide cache keeps them while this communicator lives and may drop them after.
  mutable std::mutex held_mu_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<const Program>> held_;
};

}  // namespace chorus::algo
