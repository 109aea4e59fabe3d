// What choosing an algorithm costs a call whose size keeps changing (variable sequence lengths, all-gathers of
// variable token counts): the selector decides per band of counts (decision_count, 8 bands per doubling), so a
// new count inside a known band is one memo lookup. Baseline in the same run: Selector::evaluate(), which
// simulates every candidate at one exact count, the price every new count paid when decisions were per count.
//
// Arguments: ranks, hosts. Counts walk 1 Ki - 16 Mi floats in steps of about 0.1% (9,700 counts, no two alike);
// BM_ChooseChangingCounts runs exactly one walk from a fresh selector, so its time per call includes every
// decision the walk needs (the `decisions` counter), and the baseline's time is what each of its calls paid.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

#include "algorithms/selector.h"
#include "topology/topology.h"

namespace chorus::algo {
namespace {

constexpr size_t kFirst = size_t{1} << 10, kLast = size_t{1} << 24;

size_t next_count(size_t c) { return c >= kLast ? kFirst : c + c / 1024 + 1; }

topo::Topology cluster(int ranks, int hosts) {
  return topo::make_cluster(std::vector<int>(static_cast<size_t>(hosts), ranks / hosts), 25e9);
}

size_t walk_length() {
  size_t n = 0;
  for (size_t c = kFirst; c < kLast; c = next_count(c)) ++n;
  return n;
}

void BM_ChooseChangingCounts(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0)), hosts = static_cast<int>(state.range(1));
  Selector sel(cluster(ranks, hosts), {}, 1);
  size_t count = kFirst, decisions = 0;
  const Choice* last = nullptr;
  for (auto _ : state) {
    const Choice* c = sel.choose(Coll::AllReduce, count, 4, 0).get();
    decisions += c != last;
    last = c;
    count = next_count(count);
  }
  state.counters["decisions"] = static_cast<double>(decisions);
}

void BM_SimulateEveryCandidatePerCount(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0)), hosts = static_cast<int>(state.range(1));
  Selector sel(cluster(ranks, hosts), {}, 1);
  sel.choose(Coll::AllReduce, kFirst, 4, 0);  // programs generated once, as a running communicator has them
  size_t count = kFirst;
  for (auto _ : state) {
    benchmark::DoNotOptimize(sel.evaluate(Coll::AllReduce, count, 4, 0));
    count = next_count(count);
  }
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ranks", "hosts"});
  b->Args({8, 1})->Args({64, 8})->Args({256, 32});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_ChooseChangingCounts)->Apply(Shapes)->Iterations(static_cast<benchmark::IterationCount>(walk_length()));
BENCHMARK(BM_SimulateEveryCandidatePerCount)->Apply(Shapes);

}  // namespace
}  // namespace chorus::algo
