// The selector: CHORUS_ALGO parsing, precedence (per call > CHORUS_ALGO > cost model), near-ties, memoization.
#include "algorithms/selector.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"

namespace chorus::algo {
namespace {

topo::Topology one_host(int n) {
  topo::Topology t;
  topo::Host h;
  h.name = h.id = "host0";
  h.cores = n;
  t.hosts.push_back(h);
  for (int r = 0; r < n; ++r) t.ranks.push_back(topo::RankPlace{0, r, r, -1, -1});
  for (auto& lp : t.links) lp = {2e-6, 10e9};
  t.copy_Bps = 10e9;
  t.reduce_Bps = 5e9;
  return t;
}

// Runs `f`, expects chorus::Error(chorusInvalidArgument), returns its text.
template <typename F>
std::string invalid_text(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(AlgoOverrides, ParsesRangesAndBareNames) {
  AlgoOverrides o = parse_algo_overrides("allreduce:0-64K:oneshot,64K-:ring;allgather:ring;reducescatter:1M-:ring");
  const auto& ar = o.rules[static_cast<size_t>(Coll::AllReduce)];
  ASSERT_EQ(ar.size(), 2u);
  EXPECT_EQ(ar[0].lo, 0u);
  EXPECT_EQ(ar[0].hi, 65536u);
  EXPECT_EQ(ar[0].algorithm, "oneshot");
  EXPECT_EQ(ar[0].text, "allreduce:0-64K:oneshot");
  EXPECT_EQ(ar[1].lo, 65536u);
  EXPECT_EQ(ar[1].hi, UINT64_MAX);
  EXPECT_EQ(o.find(Coll::AllReduce, 0)->algorithm, "oneshot");
  EXPECT_EQ(o.find(Coll::AllReduce, 65535)->algorithm, "oneshot");
  EXPECT_EQ(o.find(Coll::AllReduce, 65536)->algorithm, "ring");  // half-open
  EXPECT_EQ(o.find(Coll::AllGather, 1)->algorithm, "ring");
  EXPECT_EQ(o.find(Coll::AllGather, uint64_t{1} << 40)->algorithm, "ring");
  EXPECT_EQ(o.find(Coll::ReduceScatter, (1 << 20) - 1), nullptr);
  EXPECT_EQ(o.find(Coll::ReduceScatter, 1 << 20)->algorithm, "ring");
  EXPECT_EQ(o.find(Coll::Broadcast, 100), nullptr);
  EXPECT_FALSE(o.empty());

  // Blanks, case, an open lower end, a trailing ';'.
  o = parse_algo_overrides(" AllReduce : -1M : oneshot ; alltoall:pairwise;");
  EXPECT_EQ(o.find(Coll::AllReduce, (1 << 20) - 1)->algorithm, "oneshot");
  EXPECT_EQ(o.find(Coll::AllReduce, 1 << 20), nullptr);
  EXPECT_EQ(o.find(Coll::AllToAll, 7)->algorithm, "pairwise");
  EXPECT_TRUE(parse_algo_overrides("").empty());
  EXPECT_TRUE(parse_algo_overrides("  ").empty());
  // Overlaps: the first rule wins.
  o = parse_algo_overrides("allreduce:0-1K:oneshot,ring");
  EXPECT_EQ(o.find(Coll::AllReduce, 10)->algorithm, "oneshot");
  EXPECT_EQ(o.find(Coll::AllReduce, 1 << 20)->algorithm, "ring");
}

TEST(AlgoOverrides, BadSpecsNameTheVariableAndThePart) {
  std::string e = invalid_text([] { parse_algo_overrides("allreduc:ring"); });
  EXPECT_TRUE(has(e, "CHORUS_ALGO")) << e;
  EXPECT_TRUE(has(e, "'allreduc'")) << e;
  EXPECT_TRUE(has(e, "allreduce, allgather, reducescatter, broadcast, reduce, alltoall, alltoallv")) << e;

  e = invalid_text([] { parse_algo_overrides("allreduce:0-64K:tre"); });
  EXPECT_TRUE(has(e, "CHORUS_ALGO")) << e;
  EXPECT_TRUE(has(e, "'tre'")) << e;
  EXPECT_TRUE(has(e, "allreduce:0-64K:tre")) << e;
  EXPECT_TRUE(has(e, algorithm_names(Coll::AllReduce))) << e;
  EXPECT_TRUE(has(algorithm_names(Coll::AllReduce), "ring")) << e;

  e = invalid_text([] { parse_algo_overrides("allreduce:64K-1K:ring"); });
  EXPECT_TRUE(has(e, "empty range '64K-1K'")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce:1Q-:ring"); });
  EXPECT_TRUE(has(e, "bad size in 'allreduce:1Q-:ring'")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce:64K:ring"); });
  EXPECT_TRUE(has(e, "has no '-'")) << e;
  // A comma where a ';' belongs: the second collective's rule is named as such.
  e = invalid_text([] { parse_algo_overrides("allreduce:ring,allgather:bruck"); });
  EXPECT_TRUE(has(e, "'allgather:bruck' in 'allreduce:ring,allgather:bruck' is a rule for another collective")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce:ring,allgather:0-1M:bruck"); });
  EXPECT_TRUE(has(e, "'allgather:0-1M:bruck' in 'allreduce:ring,allgather:0-1M:bruck' is a rule for another")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce"); });
  EXPECT_TRUE(has(e, "'allreduce' has no ':'")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce:0-1K:"); });
  EXPECT_TRUE(has(e, "no algorithm named")) << e;
  e = invalid_text([] { parse_algo_overrides("allreduce:ring,,oneshot"); });
  EXPECT_TRUE(has(e, "empty rule")) << e;
  // A name that exists for another collective only.
  e = invalid_text([] { parse_algo_overrides("allgather:pairwise"); });
  EXPECT_TRUE(has(e, "unknown algorithm 'pairwise' for allgather")) << e;
  // Names match without regard to case, and errors quote the rule as it was written.
  const AlgoOverrides upper = parse_algo_overrides("AllReduce:0-1K:RING");
  ASSERT_NE(upper.find(Coll::AllReduce, 100), nullptr);
  EXPECT_EQ(upper.find(Coll::AllReduce, 100)->algorithm, "ring");
  e = invalid_text([] { parse_algo_overrides("AllReduce:RINGX"); });
  EXPECT_TRUE(has(e, "unknown algorithm 'ringx' for allreduce in 'AllReduce:RINGX'")) << e;
}

TEST(SelectionBytes, AreNcclTestsBytes) {
  EXPECT_EQ(selection_bytes(Coll::AllReduce, 100, 4, 8), 400u);
  EXPECT_EQ(selection_bytes(Coll::Broadcast, 100, 4, 8), 400u);
  EXPECT_EQ(selection_bytes(Coll::AllGather, 100, 4, 8), 3200u);
  EXPECT_EQ(selection_bytes(Coll::ReduceScatter, 100, 4, 8), 3200u);
  EXPECT_EQ(selection_bytes(Coll::AllToAll, 100, 2, 8), 1600u);
}

TEST(Selector, CostModelSimulatesEveryCandidate) {
  const topo::Topology t = one_host(8);
  Selector sel(t, {}, 1);
  for (size_t count : {size_t{1}, size_t{1} << 22}) {
    auto c = sel.choose(Coll::AllReduce, count, 4, 0);
    EXPECT_EQ(c->reason, ChoiceReason::CostModel);
    EXPECT_EQ(c->bytes, count * 4);
    // Every table entry of the collective, in table order, with the time simulate() gives.
    size_t i = 0;
    double best = 1e300;
    for (const AlgorithmInfo& a : algorithm_table()) {
      if (a.coll != Coll::AllReduce) continue;
      ASSERT_LT(i, c->candidates.size());
      const Candidate& cand = c->candidates[i++];
      EXPECT_EQ(cand.algorithm, &a);
      if (!cand.applicable) {
        EXPECT_FALSE(cand.note.empty()) << a.name;
        continue;
      }
      auto prog = get_program(a, {8, 0, 1, t.host_of_rank()});
      EXPECT_EQ(cand.predicted_s, simulate(*prog, t, count, 4).seconds) << a.name;
      best = std::min(best, cand.predicted_s);
    }
    EXPECT_EQ(i, c->candidates.size());
    EXPECT_LE(c->predicted_s, best * 1.03);
    ASSERT_NE(c->program, nullptr);
    EXPECT_EQ(c->program->algorithm, c->algorithm->name);
    EXPECT_TRUE(has(c->why, "cost model")) << c->why;
  }
  // One-shot is one hop: it wins small all-reduces; the ring moves 2(N-1)/N of the data instead of N-1 times it.
  EXPECT_STREQ(sel.choose(Coll::AllReduce, 1, 4, 0)->algorithm->name, "oneshot");
  EXPECT_STREQ(sel.choose(Coll::AllReduce, 1 << 22, 4, 0)->algorithm->name, "ring");
}

// With the default costs (per-message overhead included), small gathers and scatters go through the binomial tree
// on many ranks, where the linear root would post or drain every message itself, and stay linear on few ranks and
// for large blocks, where the tree's forwarding costs more than it saves.
TEST(Selector, SmallRootedCallsUseTheTreeOnlyAtScale) {
  for (Coll coll : {Coll::Gather, Coll::Scatter}) {
    Selector few(topo::make_cluster({4}, 0), {}, 1);
    Selector many(topo::make_cluster(std::vector<int>(16, 8), 0), {}, 1);
    EXPECT_STREQ(few.choose(coll, 1, 4, 0)->algorithm->name, "linear");
    EXPECT_STREQ(many.choose(coll, 1, 4, 0)->algorithm->name, "binomial") << many.choose(coll, 1, 4, 0)->why;
    EXPECT_STREQ(many.choose(coll, size_t{1} << 16, 4, 5)->algorithm->name, "linear");
  }
}

// AlgorithmInfo::floor is a lower bound of what the simulator predicts, for any count, rank count and host layout:
// checked with latency alone (hops) and with overhead alone (the busiest rank's messages).
TEST(CostFloor, NeverExceedsTheSimulatedTime) {
  const double alpha = 1e-6, o = 1e-6;
  for (int n = 1; n <= 33; ++n)
    for (int hosts : {1, 2, 3})
      for (const AlgorithmInfo& a : algorithm_table()) {
        if (a.floor == nullptr || n % hosts != 0) continue;
        const CostFloor f = a.floor(n);
        EXPECT_GE(f.hops, 0);
        EXPECT_GE(f.rank_messages, 0);
        topo::Topology t = topo::make_cluster(std::vector<int>(static_cast<size_t>(hosts), n / hosts), 0);
        std::shared_ptr<const Program> prog;
        try {
          prog = get_program(a, {n, n / 2, 1 + n % 2, t.host_of_rank()});
        } catch (const std::invalid_argument&) {
          continue;  // does not apply (one-shot beyond 64 ranks)
        }
        for (size_t count : {size_t{0}, size_t{1}, size_t{1000}}) {
          for (auto& lp : t.links) lp = {alpha, 0, 0};
          t.copy_Bps = t.reduce_Bps = 0;
          EXPECT_GE(simulate(*prog, t, count, 4).seconds, static_cast<double>(f.hops) * alpha * (1 - 1e-12))
              << coll_name(a.coll) << " " << a.name << " " << n << " ranks, " << hosts << " hosts, count " << count;
          for (auto& lp : t.links) lp = {0, 0, o};
          EXPECT_GE(simulate(*prog, t, count, 4).seconds, static_cast<double>(f.rank_messages) * o * (1 - 1e-12))
              << coll_name(a.coll) << " " << a.name << " " << n << " ranks, " << hosts << " hosts, count " << count;
          // Direct exchanges: only the network costs o, each rank pays it for 2 (N - N/hosts) messages.
          for (auto& lp : t.links) lp = {0, 0, 0};
          t.links[static_cast<size_t>(topo::LinkClass::Network)].overhead_s = o;
          if (f.direct) {
            EXPECT_GE(simulate(*prog, t, count, 4).seconds, 2.0 * (n - n / hosts) * o * (1 - 1e-12))
                << coll_name(a.coll) << " " << a.name << " " << n << " ranks, " << hosts << " hosts, count " << count;
          }
        }
      }
}

// Skipping candidates by their floor never changes a decision: the cost model picks what picking among every
// simulated candidate picks.
TEST(Selector, CostFloorsDoNotChangeDecisions) {
  int skipped = 0;
  for (auto [n, hosts] : {std::pair{4, 1}, std::pair{8, 1}, std::pair{16, 2}, std::pair{64, 8}}) {
    Selector sel(topo::make_cluster(std::vector<int>(static_cast<size_t>(hosts), n / hosts), 0), {}, 1);
    for (Coll coll : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce,
                      Coll::AllToAll, Coll::Gather, Coll::Scatter, Coll::Barrier})
      for (size_t count : {size_t{1}, size_t{64}, size_t{4096}, size_t{1} << 18}) {
        const size_t c = coll == Coll::Barrier ? 0 : count;
        const int root = rooted(coll) ? n - 1 : 0;
        const int all = pick_candidate(sel.evaluate(coll, decision_count(c), 4, root));
        ASSERT_GE(all, 0);
        auto choice = sel.choose(coll, c, 4, root);
        EXPECT_EQ(choice->algorithm, sel.evaluate(coll, c, 4, root)[static_cast<size_t>(all)].algorithm)
            << coll_name(coll) << " " << n << " ranks, count " << c << ": " << choice->why;
        for (const Candidate& cand : choice->candidates) skipped += has(cand.note, "cost floor") ? 1 : 0;
        if (coll == Coll::Barrier) break;
      }
  }
  EXPECT_GT(skipped, 20);  // the floors do skip candidates (rings and direct exchanges at small sizes)
}

TEST(Selector, PerCallBeatsOverrideBeatsModel) {
  const topo::Topology t = one_host(4);
  Selector sel(t, {}, 1, parse_algo_overrides("allreduce:0-64K:ring"));
  // Small: the model would pick one-shot; CHORUS_ALGO says ring.
  auto c = sel.choose(Coll::AllReduce, 16, 4, 0);
  EXPECT_STREQ(c->algorithm->name, "ring");
  EXPECT_EQ(c->reason, ChoiceReason::Override);
  EXPECT_TRUE(has(c->why, "allreduce:0-64K:ring")) << c->why;
  // The call names one-shot: that wins over CHORUS_ALGO.
  c = sel.choose(Coll::AllReduce, 16, 4, 0, "oneshot");
  EXPECT_STREQ(c->algorithm->name, "oneshot");
  EXPECT_EQ(c->reason, ChoiceReason::PerCall);
  // Outside the rule's range: the model.
  c = sel.choose(Coll::AllReduce, 1 << 20, 4, 0);
  EXPECT_EQ(c->reason, ChoiceReason::CostModel);
  // An empty per-call name is no name.
  EXPECT_EQ(sel.choose(Coll::AllReduce, 16, 4, 0, "")->reason, ChoiceReason::Override);

  Selector plain(t, {}, 1);
  EXPECT_STREQ(plain.choose(Coll::AllReduce, 16, 4, 0)->algorithm->name, "oneshot");
  EXPECT_EQ(plain.choose(Coll::AllReduce, 16, 4, 0)->reason, ChoiceReason::CostModel);

  // The barrier follows CHORUS_ALGO too (it has no per-call options): the model's one-shot, or the rule's tree.
  EXPECT_STREQ(plain.choose(Coll::Barrier, 0, 1, 0)->algorithm->name, "oneshot");
  Selector tree_barrier(t, {}, 1, parse_algo_overrides("barrier:tree"));
  c = tree_barrier.choose(Coll::Barrier, 0, 1, 0);
  EXPECT_STREQ(c->algorithm->name, "tree");
  EXPECT_EQ(c->reason, ChoiceReason::Override);
}

TEST(Selector, UnknownNamesAreErrors) {
  Selector sel(one_host(4), {}, 1);
  std::string e = invalid_text([&] { sel.choose(Coll::AllReduce, 16, 4, 0, "tree9"); });
  EXPECT_TRUE(has(e, "unknown algorithm 'tree9' for AllReduce")) << e;
  EXPECT_TRUE(has(e, algorithm_names(Coll::AllReduce))) << e;
  e = invalid_text([&] { sel.choose(Coll::AllGather, 16, 4, 0, "pairwise"); });
  EXPECT_TRUE(has(e, "(known: " + algorithm_names(Coll::AllGather) + ")")) << e;
  invalid_text([&] { sel.choose(Coll::Broadcast, 16, 4, 7); });  // root out of range
  invalid_text([&] { sel.choose(Coll::SendRecv, 16, 4, 0); });
  // From many threads at once (thread-ranks share a selector, and wait for a decision another one is making): each
  // gets the error, and the decision that threw is not kept.
  for (int round = 0; round < 2; ++round) {
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&] {
        try {
          sel.choose(Coll::AllReduce, 4096, 4, 0, "tree9");
        } catch (const Error& err) {
          if (err.code() == chorusInvalidArgument && has(err.what(), "unknown algorithm 'tree9'")) ++refused;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(refused.load(), 8);
  }
}

TEST(Selector, MemoizesDecisions) {
  Selector sel(one_host(8), {}, 2);
  auto a = sel.choose(Coll::AllGather, 1000, 4, 0);
  auto b = sel.choose(Coll::AllGather, 1000, 4, 0);
  EXPECT_EQ(a.get(), b.get());
  // Counts of one band share the decision made at the band's top; the next band gets its own.
  EXPECT_EQ(a->count, 1024u);
  EXPECT_EQ(sel.choose(Coll::AllGather, 961, 4, 0).get(), a.get());
  EXPECT_EQ(sel.choose(Coll::AllGather, 1024, 4, 0).get(), a.get());
  EXPECT_NE(sel.choose(Coll::AllGather, 960, 4, 0).get(), a.get());
  EXPECT_NE(sel.choose(Coll::AllGather, 1025, 4, 0).get(), a.get());
  EXPECT_NE(sel.choose(Coll::AllGather, 1000, 2, 0).get(), a.get());
  // Root is part of the key only where it matters.
  EXPECT_EQ(sel.choose(Coll::AllGather, 1000, 4, 3).get(), a.get());
  EXPECT_NE(sel.choose(Coll::Broadcast, 1000, 4, 3).get(), sel.choose(Coll::Broadcast, 1000, 4, 0).get());
  // From many threads at once: one decision.
  std::vector<std::thread> threads;
  std::vector<const Choice*> got(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] { got[static_cast<size_t>(i)] = sel.choose(Coll::AllReduce, 12345, 4, 0).get(); });
  for (auto& th : threads) th.join();
  for (const Choice* c : got) EXPECT_EQ(c, got[0]);
}

TEST(DecisionCount, BandsOfEightPerDoublingWithinAnEighth) {
  for (size_t c = 0; c <= 16; ++c) EXPECT_EQ(decision_count(c), c);
  EXPECT_EQ(decision_count(17), 18u);
  EXPECT_EQ(decision_count(1000), 1024u);
  EXPECT_EQ(decision_count(1025), 1152u);
  EXPECT_EQ(decision_count_low(1024), 961u);
  EXPECT_EQ(decision_count_low(1152), 1025u);
  EXPECT_EQ(decision_count_low(18), 17u);
  const size_t top = std::numeric_limits<size_t>::max();
  EXPECT_EQ(decision_count(top), top);  // no room to round up: its own band
  for (int k = 0; k < 64; ++k) EXPECT_EQ(decision_count(size_t{1} << k), size_t{1} << k);
  // Every count: rounded up by less than an eighth, into a band whose ends map back to it.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const size_t c = rng() >> (rng() % 64);
    const size_t d = decision_count(c);
    ASSERT_GE(d, c);
    if (c > 16 && c < (top >> 4)) {
      ASSERT_LT(d - c, (c + 7) / 8) << c;
    }
    const size_t lo = decision_count_low(d);
    ASSERT_LE(lo, c) << c;
    ASSERT_EQ(decision_count(lo), d) << c;
    if (lo > 0) {
      ASSERT_NE(decision_count(lo - 1), d) << c;
    }
  }
  // The number of decisions from 1 element to 1 Gi elements.
  std::set<size_t> bands;
  for (size_t c = 1; c <= (size_t{1} << 30); c += 1 + c / 64) bands.insert(decision_count(c));
  EXPECT_LE(bands.size(), 16u + 8u * 27u);
}

TEST(Selector, ANamedAlgorithmIsTheOnlyOneGeneratedAndNoneIsSimulated) {
  const topo::Topology t = one_host(8);
  Selector sel(t, {}, 1, parse_algo_overrides("allreduce:0-4000:ring"));
  auto only = [](const Choice& c) {
    int generated = 0;
    for (const Candidate& cand : c.candidates) {
      if (cand.applicable) {
        ++generated;
        EXPECT_EQ(cand.algorithm, c.algorithm);
        // Named: generated, not simulated (a pairwise all-to-all on 4096 ranks took minutes to simulate).
        EXPECT_TRUE(std::isnan(cand.predicted_s)) << cand.predicted_s;
        EXPECT_TRUE(has(cand.note, "was named: generated, not simulated")) << cand.note;
      } else {
        EXPECT_TRUE(has(cand.note, "was not simulated")) << cand.note;
      }
    }
    return generated == 1;
  };
  auto named = sel.choose(Coll::AllReduce, 1 << 20, 4, 0, "tree");
  EXPECT_EQ(named->reason, ChoiceReason::PerCall);
  EXPECT_TRUE(only(*named));
  // 999 and 1001 floats share a band (up to 1024), but the rule's edge (4000 bytes) lies between them: the rule
  // holds the exact size of the first only.
  auto ruled = sel.choose(Coll::AllReduce, 999, 4, 0);
  EXPECT_EQ(ruled->reason, ChoiceReason::Override);
  EXPECT_STREQ(ruled->algorithm->name, "ring");
  EXPECT_TRUE(only(*ruled));
  auto model = sel.choose(Coll::AllReduce, 1001, 4, 0);
  EXPECT_EQ(model->reason, ChoiceReason::CostModel);
  for (const Candidate& cand : model->candidates)
    EXPECT_TRUE(cand.applicable || has(cand.note, "does not apply") || has(cand.note, "cost floor")) << cand.note;
  // evaluate(): every candidate at the exact count, as simulate() gives it.
  const std::vector<Candidate> all = sel.evaluate(Coll::AllReduce, 1001, 4, 0);
  ASSERT_EQ(all.size(), model->candidates.size());
  for (const Candidate& cand : all) {
    if (!cand.applicable) continue;
    auto prog = get_program(*cand.algorithm, {8, 0, 1, t.host_of_rank()});
    EXPECT_EQ(cand.predicted_s, simulate(*prog, t, 1001, 4).seconds) << cand.algorithm->name;
  }
}

TEST(Selector, NearTiesPreferTheEarlierEntry) {
  const AlgorithmInfo* a = &algorithm_table()[0];
  const AlgorithmInfo* b = &algorithm_table()[1];
  auto cand = [](const AlgorithmInfo* info, bool ok, double s) { return Candidate{info, ok, s, ""}; };
  EXPECT_EQ(pick_candidate({cand(a, true, 1.02), cand(b, true, 1.00)}), 0);  // 2% faster: not enough
  EXPECT_EQ(pick_candidate({cand(a, true, 1.03), cand(b, true, 1.00)}), 0);  // exactly 3%
  EXPECT_EQ(pick_candidate({cand(a, true, 1.04), cand(b, true, 1.00)}), 1);  // 4%: the later one wins
  EXPECT_EQ(pick_candidate({cand(a, false, 0.5), cand(b, true, 1.00)}), 1);  // not applicable never wins
  EXPECT_EQ(pick_candidate({cand(a, false, 0.5), cand(b, false, 1.00)}), -1);
  EXPECT_EQ(pick_candidate({cand(a, true, 0.9), cand(b, true, 1.00)}), 0);
}

TEST(Selector, AlgorithmsThatDoNotApplyAreSkipped) {
  // Programs whose generator refuses the communicator are listed as not applicable, not chosen.
  Selector sel(one_host(8), {}, 1);
  for (Coll coll :
       {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce, Coll::AllToAll}) {
    auto c = sel.choose(coll, 4096, 4, 0);
    ASSERT_NE(c->algorithm, nullptr);
    for (const Candidate& cand : c->candidates) {
      if (!cand.applicable && !has(cand.note, "cost floor")) {
        EXPECT_NE(cand.algorithm, c->algorithm);
        EXPECT_TRUE(has(cand.note, "does not apply")) << cand.note;
        const std::string e =
            invalid_text([&] { sel.choose(coll, 4096, 4, 0, cand.algorithm->name); });  // forced: an error
        EXPECT_TRUE(has(e, cand.algorithm->name)) << e;
      }
    }
  }
}

}  // namespace
}  // namespace chorus::algo
