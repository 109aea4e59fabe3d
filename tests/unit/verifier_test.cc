// The verifier proves every registered program for nranks 1..64 (channels 1 and 2, roots first, last and
// one past the middle, in place and out of place), and catches broken programs.
#include <gtest/gtest.h>

#include <cstdio>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"
#include "algorithms/verifier.h"

namespace chorus::algo {
namespace {

TEST(Verifier, EveryProgramForOneTo64Ranks) {
  int proved = 0;
  for (const AlgorithmInfo& algo : algorithm_table()) {
    for (int n = 1; n <= 64; ++n) {
      for (int nch : {1, 2}) {
        if (nch == 2 && n > 16 && n % 7 != 0) continue;  // two channels: a sample of sizes keeps this fast
        std::vector<int> roots = {0};
        if (rooted(algo.coll) && n > 1) roots.push_back(n - 1);
        if (rooted(algo.coll) && n > 2) roots.push_back(n / 2 + 1);  // gather's and scatter's blocks wrap around
        for (int root : roots) {
          Program prog = algo.generate({n, root, nch});
          for (bool in_place : {false, true}) {
            if (in_place && !has_in_place_form(algo.coll)) continue;
            VerifyResult res = verify(prog, {in_place, 2});
            ASSERT_TRUE(res.ok) << algo.name << " " << coll_name(algo.coll) << " nranks=" << n << " nch=" << nch
                                << " root=" << root << " in_place=" << in_place << ": " << res.error;
            ++proved;
          }
        }
      }
    }
  }
  EXPECT_GT(proved, 900);
}

TEST(Verifier, LargerRings) {
  for (int n : {128, 255}) {
    VerifyResult res = verify(ring_allreduce({n, 0, 1}));
    EXPECT_TRUE(res.ok) << res.error;
    EXPECT_EQ(res.messages, int64_t{2} * (n - 1) * n);
  }
}

TEST(Verifier, DetectsMissingStep) {
  Program prog = ring_allreduce({4, 0, 1});
  prog.ranks[2].lanes[0].steps.pop_back();  // rank 2 never receives its last chunk
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("never received"), std::string::npos) << res.error;
}

TEST(Verifier, DetectsDeadlock) {
  Program prog = ring_allgather({3, 0, 1});
  // Every rank receives before it sends: a cycle of waits.
  for (auto& rp : prog.ranks) std::swap(rp.lanes[0].steps[0], rp.lanes[0].steps[2]);
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("deadlock"), std::string::npos) << res.error;
}

TEST(Verifier, DetectsDoubleContribution) {
  Program prog = ring_allreduce({3, 0, 1});
  // Rank 0 reduces its own chunk 0 where it should reduce chunk 2: chunk 0 gets rank 0 twice.
  prog.ranks[0].lanes[0].steps[1].src.chunk = 0;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
}

TEST(Verifier, DetectsReadAfterOverwriteInPlace) {
  Program prog = ring_reduce_scatter({3, 0, 1});
  // Write rank 1's output (input block 1 in place) before it is read: an in-place hazard only.
  auto& steps = prog.ranks[1].lanes[0].steps;
  steps.insert(steps.begin(), Step{OpCode::Copy, -1, -1, {BufKind::Input, 0}, {BufKind::Output, 0}, false});
  EXPECT_FALSE(verify(prog, {true, 2}).ok);
}

TEST(Verifier, DetectsAvgAppliedTwice) {
  Program prog = ring_allreduce({2, 0, 1});
  prog.ranks[0].lanes[0].steps.back().final = true;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("finished"), std::string::npos) << res.error;
}

TEST(Verifier, ReduceNeverWritesNonRootOutput) {
  Program prog = chain_reduce({3, 1, 1});
  prog.ranks[2].lanes[0].steps.push_back(Step{OpCode::Copy, -1, -1, {BufKind::Input, 0}, {BufKind::Output, 0}, false});
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("non-root"), std::string::npos) << res.error;
}

// Halving/doubling moves one run of chunks per partner and round: log2(N) messages each way per rank, not N - 1.
TEST(VerifierRuns, LogarithmicProgramsSendOneMessagePerRound) {
  EXPECT_EQ(verify(rhd_allreduce({8, 0, 1})).messages, 8 * 2 * 3);
  EXPECT_EQ(verify(rhd_allreduce({64, 0, 1})).messages, 64 * 2 * 6);
  EXPECT_EQ(verify(rhd_allgather({8, 0, 1})).messages, 8 * 3);
  EXPECT_EQ(verify(rhd_reduce_scatter({8, 0, 1})).messages, 8 * 3);
  // Bruck: one run per round, two where the blocks wrap (rank 7 at distance 2, ranks 5-7 at distance 4): 8 + 9 + 11.
  EXPECT_EQ(verify(bruck_allgather({8, 0, 1})).messages, 28);
  // Hierarchical all-reduce, 2 hosts of 4: inside each host one run per part and hop (2 hosts x 4 parts x 3 hops,
  // up and down); across hosts each part's 2 sub-parts go around the owners' ring (4 parts x 2 sub-parts x 1 hop,
  // up and down): 48 + 16, where one chunk per message took 96 inside the hosts.
  EXPECT_EQ(verify(hier_allreduce({8, 0, 1, {0, 0, 0, 0, 1, 1, 1, 1}})).messages, 48 + 16);
  // 6 ranks: two fold into partners (one run there, one back) and four run two rounds each way.
  EXPECT_EQ(verify(rhd_allreduce({6, 0, 1})).messages, 2 * 2 + 4 * 4);
}

// On one host the hierarchical all-gather and reduce-scatter are rings: N (N - 1) messages. They were N^2 (N - 1)
// (every part of every block a message of its own): 20 s and 1 GB to generate at 256 ranks.
TEST(VerifierRuns, HierarchicalAllGatherAndReduceScatterOnOneHostAreRings) {
  for (int n : {2, 5, 8}) {
    EXPECT_EQ(verify(hier_allgather({n, 0, 1})).messages, n * (n - 1)) << n;
    EXPECT_EQ(verify(hier_reduce_scatter({n, 0, 1})).messages, n * (n - 1)) << n;
  }
}

// On several hosts they move whole blocks along rails. 4 hosts of 2: every block crosses 3 hosts (8 x 3), and each
// host passes each of the 8 blocks one hop around its ring (4 x 8 x 1): 56. Per part (before) it was 112. The coded
// reduce-scatter sends each of a block's 2 parts across hosts on its own: 32 + 48.
TEST(VerifierRuns, HierarchicalAllGatherAndReduceScatterMoveWholeBlocksAlongRails) {
  const std::vector<int> hosts = {0, 0, 1, 1, 2, 2, 3, 3};
  EXPECT_EQ(verify(hier_allgather({8, 0, 1, hosts})).messages, 56);
  EXPECT_EQ(verify(hier_reduce_scatter({8, 0, 1, hosts})).messages, 56);
  EXPECT_EQ(verify(hier_reduce_scatter_single_chunks({8, 0, 1, hosts})).messages, 32 + 48);
  // Uneven hosts (3 + 5; P = 5): the member of local index 0 on the smaller host is also rail 3's.
  const std::vector<int> uneven = {0, 0, 0, 1, 1, 1, 1, 1};
  for (bool in_place : {false, true}) {
    EXPECT_TRUE(verify(hier_allgather({8, 0, 2, uneven}), {in_place, 2}).ok);
    EXPECT_TRUE(verify(hier_reduce_scatter({8, 0, 2, uneven}), {in_place, 2}).ok);
  }
}

TEST(VerifierRuns, AMessageAndTheStepTakingItMustCoverAsManyChunks) {
  Program prog = rhd_allreduce({4, 0, 1});
  // Rank 0's first round receives a run of two chunks: make the step take one.
  Step& s = prog.ranks[0].lanes[0].steps[1];
  ASSERT_EQ(s.op, OpCode::RecvReduce);
  ASSERT_EQ(s.dst.count, 2);
  s.src.count = s.dst.count = 1;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("sent a message of 2 chunk(s) where this step takes 1"), std::string::npos) << res.error;
}

TEST(VerifierRuns, BrokenRunsAreErrors) {
  auto error_of = [](void (*edit)(Program&), Program prog) {
    edit(prog);
    VerifyResult res = verify(prog);
    EXPECT_FALSE(res.ok);
    return res.error;
  };
  EXPECT_NE(error_of([](Program& p) { p.ranks[0].lanes[0].steps[1].src.count = 1; }, rhd_allreduce({4, 0, 1}))
                .find("src and dst runs differ"),
            std::string::npos);
  EXPECT_NE(error_of([](Program& p) { p.ranks[0].lanes[0].steps[0].src.count = 0; }, rhd_allreduce({4, 0, 1}))
                .find("a run of no chunks"),
            std::string::npos);
  EXPECT_NE(error_of([](Program& p) { p.ranks[0].lanes[0].steps[0].src.count = 9; }, rhd_allreduce({4, 0, 1}))
                .find("out of range"),
            std::string::npos);
  // All-to-allv blocks lie anywhere in memory: a run may not leave its block (all-to-all's are one buffer).
  EXPECT_NE(error_of(
                [](Program& p) {
                  p.coll = Coll::AllToAllv;
                  for (Step& s : p.ranks[0].lanes[0].steps)
                    if (s.op == OpCode::Send && s.src.chunk == 1) {
                      s.src.count = 2;
                      break;
                    }
                },
                pairwise_alltoall({3, 0, 1}))
                .find("crosses a block boundary"),
            std::string::npos);
  // The codec keys one chunk's slices.
  EXPECT_NE(error_of(
                [](Program& p) {
                  for (Step& s : p.ranks[0].lanes[0].steps)
                    if (s.code != 0 && s.op == OpCode::Send) {
                      s.src.count = 2;
                      break;
                    }
                },
                qonce_flat_allreduce({4, 0, 1}))
                .find("a coded step names a run"),
            std::string::npos);
}

// A step's slice s is the s-th slice of its run: reading, within one phase, what a run starting elsewhere wrote
// would need another slice of the writer, which has not run yet. The fences keep halving/doubling correct.
TEST(VerifierRuns, ARoundReadingAnotherRoundsRunNeedsAFence) {
  Program prog = rhd_allreduce({4, 0, 1});
  for (RankProgram& rp : prog.ranks)
    for (Lane& lane : rp.lanes)
      for (Step& s : lane.steps) s.fence = false;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("starts elsewhere"), std::string::npos) << res.error;
}

// Two ranks, an input of four chunks and an output of eight, one lane each: just enough for the hazards below (the walk
// stops at the first).
Program two_ranks(std::vector<Step> r0, std::vector<Step> r1) {
  Program p;
  p.coll = Coll::AllReduce;
  p.algorithm = "test";
  p.nranks = 2;
  p.ranks.resize(2);
  for (RankProgram& rp : p.ranks) {
    rp.input = {1, 4};
    rp.output = {2, 4};  // chunk c is part c % 4
  }
  p.ranks[0].lanes.push_back(Lane{0, std::move(r0)});
  p.ranks[1].lanes.push_back(Lane{0, std::move(r1)});
  return p;
}
Step fenced(Step s) {
  s.fence = true;
  return s;
}
std::string error_of(const Program& p) {
  VerifyResult res = verify(p);
  EXPECT_FALSE(res.ok);
  return res.error;
}

TEST(VerifierRuns, PhasesOfAConnectionMustMatchOnBothEnds) {
  // Rank 0 sends a run of two and one chunk in one phase; rank 1 takes them in two. With one slice per chunk the
  // wire carries A0 B0 A1 while rank 1 expects A0 A1 B0: the data would swap silently.
  const std::string e =
      error_of(two_ranks({send(1, in(0, 2)), send(1, in(2))}, {recv(0, out(0, 2)), fenced(recv(0, out(2)))}));
  EXPECT_NE(e.find("in one phase but this rank takes them in two"), std::string::npos) << e;
}

// Whole messages flow, but once they are cut into slices a fence on one side waits for the whole of a message the
// other side sends only after the first slice of the answer: the walk by slices finds it.
TEST(VerifierRuns, AFenceThatWaitsForAWholeMessageOfAPeerWaitingForASliceIsADeadlock) {
  // A two-rank all-gather, right message by message.
  Program p = two_ranks({copy(in(0), out(0), false), send(1, in(0)), recv(1, out(1))},
                        {copy(in(0), out(1), false), recv(0, out(0)), fenced(send(0, in(0)))});
  p.coll = Coll::AllGather;
  for (RankProgram& rp : p.ranks) {
    rp.input = {1, 1};
    rp.output = {2, 1};
  }
  VerifyResult res = verify(p);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("deadlock once messages are cut into slices"), std::string::npos) << res.error;
  // The same exchange without the fence: slice by slice it flows.
  p.ranks[1].lanes[0].steps[2].fence = false;
  res = verify(p);
  EXPECT_TRUE(res.ok) << res.error;
}

TEST(VerifierRuns, OverwritesThroughAnotherRunInOnePhaseAreErrors) {
  // Written twice: slice 1 of the first run (chunk 1) lands after slice 0 of the second and wins.
  std::string e = error_of(two_ranks({send(1, in(0, 2)), send(1, in(1))}, {recv(0, out(0, 2)), recv(0, out(1))}));
  EXPECT_NE(e.find("overwrites a chunk written earlier in the phase"), std::string::npos) << e;
  // Read, then written: slice 1 of the send (chunk 1) would go out after the receive replaced it.
  e = error_of(two_ranks({copy(in(0, 2), out(0, 2), false), fenced(send(1, out(0, 2))), recv(1, out(1))},
                         {send(0, in(1)), recv(0, out(0, 2))}));
  EXPECT_NE(e.find("overwrites a chunk read earlier in the phase"), std::string::npos) << e;
  // Read through two runs: the write lines up with the last read but not with the first.
  e = error_of(
      two_ranks({copy(in(0, 2), out(0, 2), false), fenced(send(1, out(0, 2))), send(1, out(1)), recv(1, out(1))},
                {recv(0, out(0, 2)), recv(0, out(5)), send(0, in(1))}));
  EXPECT_NE(e.find("overwrites a chunk read earlier in the phase"), std::string::npos) << e;
}

// Hierarchical programs for every hosts x ranks-per-host shape up to 8 x 8, and uneven hosts.
std::vector<int> blocks_of(const std::vector<int>& per_host) {
  std::vector<int> hor;
  for (size_t h = 0; h < per_host.size(); ++h) hor.insert(hor.end(), per_host[h], static_cast<int>(h));
  return hor;
}

void prove_hierarchical(const std::vector<int>& per_host, int nch) {
  const std::vector<int> hor = blocks_of(per_host);
  const int n = static_cast<int>(hor.size());
  for (const AlgorithmInfo& algo : algorithm_table()) {
    if (std::string(algo.name) != "hier") continue;
    Program prog = algo.generate({n, 0, nch, hor});
    for (bool in_place : {false, true}) {
      if (in_place && !has_in_place_form(algo.coll)) continue;
      VerifyResult res = verify(prog, {in_place, 2});
      std::string shape;
      for (int m : per_host) shape += std::to_string(m) + " ";
      ASSERT_TRUE(res.ok) << coll_name(algo.coll) << " hosts [" << shape << "] nch=" << nch << " in_place=" << in_place
                          << ": " << res.error;
    }
  }
}

// Two ranks, two lanes each on channels 0 and 1. Rank 1's lane 0 reduces into its output while its lane 1 sends
// that output: the message walk happens to run them in that order and finds the right sums, but nothing orders the
// lanes, so the executor may send a slice before it is reduced.
// An empty hand-written program of `nranks` ranks on two channels.
Program test_program(Coll coll, int nranks) {
  Program p;
  p.coll = coll;
  p.algorithm = "test";
  p.nranks = nranks;
  p.nchannels = 2;
  p.ranks.resize(static_cast<size_t>(nranks));
  return p;
}

Program lanes_unordered() {
  Program p = test_program(Coll::AllReduce, 2);
  for (RankProgram& rp : p.ranks) rp.input = rp.output = {1, 1};
  p.ranks[0].lanes = {Lane{0, {send(1, in(0))}}, Lane{1, {recv(1, out(0))}}};
  p.ranks[1].lanes = {Lane{0, {recv_reduce(0, in(0), out(0), true)}}, Lane{1, {send(0, out(0))}}};
  return p;
}

TEST(VerifierLanes, LanesThatShareAChunkWithoutAMessageBetweenThemAreARace) {
  VerifyResult res = verify(lanes_unordered(), {false, 2});
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("rank 1 lane 1 step 0 (send) reads output chunk 0"), std::string::npos) << res.error;
  EXPECT_NE(res.error.find("that lane 0 step 0 (recv_reduce) wrote with nothing ordering the two"), std::string::npos)
      << res.error;
  // In place as well (there rank 0's lane 1 also overwrites the input its lane 0 sends).
  res = verify(lanes_unordered(), {true, 2});
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("with nothing ordering the two"), std::string::npos) << res.error;
}

// Ordered only when messages have several slices. Rank 0's lane 0 sends a run of two chunks to rank 1 and, in
// the same phase, receives output chunk 4 from rank 2; rank 1 bounces the run to rank 0's lane 1, which then (next
// phase) copies output chunk 4. Cut into 3 slices per chunk, lane 0's receive ends before the run's 4th slice
// leaves, so the copy follows it; with one slice per step (small messages) lane 0 sends the run whole and only then
// waits for rank 2, and the copy may read chunk 4 before it lands (found by a review).
Program ordered_by_slices_only() {
  Program p = test_program(Coll::AllGather, 3);
  for (RankProgram& rp : p.ranks) {
    rp.input = {1, 2};
    rp.output = {3, 2};
  }
  p.ranks[0].scratch = {2, 2};
  Step copy_after = copy(out(4), scr(2), false);
  copy_after.fence = true;
  const Step bounce{OpCode::RecvCopySend, 0, 0, {}, out(0, 2), false};
  p.ranks[0].lanes = {
      Lane{0, {send(1, in(0, 2)), recv(2, out(4))}}, Lane{0, {recv(1, scr(0, 2)), copy_after}},
      Lane{1, {copy(in(0, 2), out(0, 2), false), recv(1, out(2, 2)), recv(2, out(5)), send(2, in(0, 2))}}};
  p.ranks[1].lanes = {
      Lane{0, {bounce}},
      Lane{1, {copy(in(0, 2), out(2, 2), false), send(0, in(0, 2)), recv(2, out(4, 2)), send(2, in(0, 2))}}};
  p.ranks[2].lanes = {Lane{0, {send(0, in(0))}}, Lane{1,
                                                      {copy(in(0, 2), out(4, 2), false), send(0, in(1)),
                                                       send(1, in(0, 2)), recv(0, out(0, 2)), recv(1, out(2, 2))}}};
  return p;
}

TEST(VerifierLanes, AnOrderOnlySeveralSlicesGiveIsARaceForSmallMessages) {
  VerifyResult res = verify(ordered_by_slices_only(), {false, 2});
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("rank 0 lane 1 step 1 (copy) reads output chunk 4 (one slice per step) that lane 0 step 1 "
                           "(recv) wrote with nothing ordering the two"),
            std::string::npos)
      << res.error;
}

TEST(VerifierLanes, TwoLanesOnOneEndOfAConnectionAreAnError) {
  // Which lane's message reaches the peer first would depend on timing; the matching rule pairs them by position.
  Program p = lanes_unordered();
  p.ranks[0].lanes[1] = Lane{0, {send(1, in(0))}};
  VerifyResult res = verify(p, {false, 2});
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("rank 0 lanes 0 and 1 both send to rank 1 on channel 0"), std::string::npos) << res.error;
}

TEST(VerifierLanes, TheTreesWayDownIsOrderedAfterItsWayUpByTheRoot) {
  // In place, the way down overwrites the input the way up read, in another lane: ordered through the root.
  for (int n : {2, 3, 8, 13, 64})
    for (int nch : {1, 2}) {
      VerifyResult res = verify(tree_allreduce({n, 0, nch}), {true, 2});
      ASSERT_TRUE(res.ok) << n << " ranks, " << nch << " channels: " << res.error;
      EXPECT_TRUE(res.lanes_ordered);
    }
  // The bound: in place, up to 4 lanes per rank share chunks, and at most 4096 such lanes are checked.
  EXPECT_TRUE(verify(tree_allreduce({1024, 0, 1}), {true, 2}).lanes_ordered);
  EXPECT_FALSE(verify(tree_allreduce({2048, 0, 1}), {true, 2}).lanes_ordered);
}

TEST(Verifier, HierarchicalEveryHostShapeUpTo8x8) {
  for (int hosts = 1; hosts <= 8; ++hosts)
    for (int per = 1; per <= 8; ++per) prove_hierarchical(std::vector<int>(hosts, per), 1);
  prove_hierarchical({2, 2}, 2);
  prove_hierarchical({4, 4, 4}, 3);
}

TEST(Verifier, HierarchicalUnevenHosts) {
  for (const std::vector<int>& shape : std::vector<std::vector<int>>{
           {3, 5}, {5, 3}, {1, 7}, {7, 1}, {2, 3, 4}, {8, 1, 8}, {1, 1, 2}, {6, 4, 2, 1}, {3, 3, 2}, {5, 8, 3, 7}})
    prove_hierarchical(shape, 1);
  prove_hierarchical({3, 5}, 2);
}

// The packed all-to-alls send one message per pair and level: Bruck ceil(log2 N) per rank; the two-level program
// m - 1 inside a host of m ranks plus one per rank of other hosts it relays to (N - m over a host's members), where
// pairwise sends N - 1 per rank.
TEST(Verifier, PackedAllToAllsSendOneMessagePerPairAndLevel) {
  VerifyResult bruck = verify(bruck_alltoall({64, 0, 2}));
  ASSERT_TRUE(bruck.ok) << bruck.error;
  EXPECT_EQ(bruck.messages, 64 * 6);
  VerifyResult even = verify(hier_alltoall({16, 0, 1, blocks_of({4, 4, 4, 4})}));
  ASSERT_TRUE(even.ok) << even.error;
  EXPECT_EQ(even.messages, 16 * 3 + 4 * 12);
  VerifyResult uneven = verify(hier_alltoall({8, 0, 2, blocks_of({3, 5})}));
  ASSERT_TRUE(uneven.ok) << uneven.error;
  EXPECT_EQ(uneven.messages, (3 * 2 + 5 * 4) + (5 + 3));
  EXPECT_EQ(verify(pairwise_alltoall({16, 0, 1})).messages, 16 * 15);
}

// The two-level all-to-all's sends across hosts run 8 rounds ahead of its receives (hierarchical.cc,
// kRoundsAhead): on 32 hosts x 2 ranks a rank sends to 9 hosts before it waits for one, then alternates, so the
// level costs about 31 / 9 latencies, not 31. Proved deadlock-free at FIFO capacity 2, also on uneven hosts.
TEST(Verifier, TwoLevelAllToAllSendsAheadOfItsReceives) {
  const std::vector<int> hor = blocks_of(std::vector<int>(32, 2));
  const Program p = hier_alltoall({64, 0, 1, hor});
  for (int r = 0; r < 64; ++r) {
    std::string order;  // 'S' or 'R' for every message between hosts, in lane order
    for (const Step& s : p.ranks[r].lanes[0].steps) {
      if (op_sends(s.op) && hor[s.send_peer] != hor[r]) order += 'S';
      if (op_receives(s.op) && hor[s.recv_peer] != hor[r]) order += 'R';
    }
    std::string expected(9, 'S');
    for (int i = 0; i < 31 - 9; ++i) expected += "RS";
    expected += std::string(9, 'R');
    ASSERT_EQ(order, expected) << "rank " << r;
  }
  for (const Program& q :
       {p, hier_alltoall({40, 0, 1, blocks_of({1, 3, 2, 1, 3, 2, 1, 3, 2, 1, 3, 2, 1, 3, 2, 1, 3, 2, 1, 3})})})
    for (bool in_place : {false, true}) {
      const VerifyResult res = verify(q, {in_place, 2});
      EXPECT_TRUE(res.ok) << (in_place ? "in place: " : "out of place: ") << res.error;
    }
}

// Scratch, in blocks, of the packed all-to-alls (design.md lists every program's): Bruck 2N; two-level the relayed
// blocks plus level 1's runs, whose space level 2's staging reuses, so ranks interleaved across hosts (staged at
// level 2) need no more than consecutive ones. The verifier proves the reuse safe.
TEST(Verifier, PackedAllToAllScratch) {
  auto most = [](const Program& p) {
    int s = 0;
    for (const RankProgram& rp : p.ranks) s = std::max(s, rp.scratch.nblocks);
    return s;
  };
  EXPECT_EQ(most(bruck_alltoall({64, 0, 1})), 2 * 64);
  std::vector<int> consecutive, interleaved;
  for (int r = 0; r < 64; ++r) {
    consecutive.push_back(r / 8);
    interleaved.push_back(r % 8);
  }
  const Program a = hier_alltoall({64, 0, 1, consecutive}), b = hier_alltoall({64, 0, 1, interleaved});
  // 56 relayed, then 7 level-1 messages of 8 blocks each way: 56 + 56 + 56
  EXPECT_EQ(most(a), 168);
  EXPECT_EQ(most(b), 168);
  VerifyResult res = verify(b, {false, 2});
  EXPECT_TRUE(res.ok) << res.error;
}

// Ranks interleaved across hosts (rank r on host r % H): the programs only see the host of each rank.
TEST(Verifier, HierarchicalInterleavedPlacement) {
  std::vector<int> hor;
  for (int r = 0; r < 12; ++r) hor.push_back(r % 3);
  for (const AlgorithmInfo& algo : algorithm_table()) {
    if (std::string(algo.name) != "hier") continue;
    VerifyResult res = verify(algo.generate({12, 0, 1, hor}), {false, 2});
    EXPECT_TRUE(res.ok) << coll_name(algo.coll) << ": " << res.error;
  }
}

// The all-reduce programs chorus-plan chooses for 512 hosts x 8 GPUs (topologies/cluster-512x8.json; the choices
// are in docs/perf/cluster-512x8-plan-*.md): the double binary tree for small sizes, proved at the full 4096
// ranks; the hierarchical program for large ones. Programs whose size grows as N^2 (hierarchical, ring: every
// rank has O(N) steps) are proved at 64 hosts x 8 = 512 ranks, the largest this test proves within its time
// (about 10 s for one; 4096 ranks would take over ten minutes and ~1 GB per program).
TEST(Verifier, ChosenProgramsForTheClusterAtScale) {
  std::vector<int> hor;
  for (int h = 0; h < 512; ++h) hor.insert(hor.end(), 8, h);
  VerifyResult tree = verify(tree_allreduce({4096, 0, 1, hor}));
  ASSERT_TRUE(tree.ok) << tree.error;
  EXPECT_EQ(tree.messages, int64_t{4} * 4095);  // two trees, up and down, one message per edge
  VerifyResult barrier = verify(algorithm_table()[23].generate({4096, 0, 1, hor}));
  EXPECT_TRUE(barrier.ok) << barrier.error;
  hor.resize(512);
  VerifyResult hier = verify(hier_allreduce({512, 0, 1, hor}));
  ASSERT_TRUE(hier.ok) << hier.error;
  std::printf("proved: tree all-reduce and tree barrier at 4096 ranks (512 x 8), hier all-reduce at 512 (64 x 8)\n");
}

}  // namespace
}  // namespace chorus::algo

namespace chorus::algo {
namespace {

// Compressed programs: proved like the others, plus how many times each contribution is quantized and that every
// rank of an all-reduce or all-gather ends with the same bits (checked by verify()).
TEST(VerifierCompressed, EveryCompressedProgramOneTo32RanksAndHostShapes) {
  int proved = 0;
  for (const AlgorithmInfo& algo : compressed_algorithm_table()) {
    for (int n = 1; n <= 32; ++n) {
      for (int nch : {1, 2}) {
        // Flat: one host. Hierarchical shapes: hosts of 2 and 4 ranks (the last host may be short), and 3+5.
        std::vector<std::vector<int>> shapes = {{}};
        for (int per : {2, 4})
          if (n > per) {
            std::vector<int> h;
            for (int r = 0; r < n; ++r) h.push_back(r / per);
            shapes.push_back(h);
          }
        if (n == 8) shapes.push_back({0, 0, 0, 1, 1, 1, 1, 1});
        for (const std::vector<int>& hosts : shapes) {
          Program prog = algo.generate({n, 0, nch, hosts});
          for (bool in_place : {false, true}) {
            VerifyResult res = verify(prog, {in_place, 2});
            ASSERT_TRUE(res.ok) << algo.name << " " << coll_name(algo.coll) << " nranks=" << n << " nch=" << nch
                                << " hosts=" << hosts.size() << " in_place=" << in_place << ": " << res.error;
            const std::string name = algo.name;
            if (n > 1 && (name == "qonce" || name == "qonce-flat")) {
              const int want = algo.coll == Coll::AllReduce ? 2 : 1;
              // Two-level all-reduce on several hosts: a partial summed on the host of its owner is quantized only
              // on its way out (once); every other contribution twice.
              const bool two_level = name == "qonce" && algo.coll == Coll::AllReduce && hosts.size() > 1;
              EXPECT_EQ(res.min_quantizations, two_level ? 1 : want) << coll_name(algo.coll) << " n=" << n;
              EXPECT_EQ(res.max_quantizations, want) << coll_name(algo.coll) << " n=" << n;
            }
            if (n > 2 && name == "ring" && algo.coll == Coll::AllReduce) {
              // The first contribution to a chunk is re-quantized at every hop of the reduce-scatter.
              EXPECT_EQ(res.max_quantizations, n) << "n=" << n;
            }
            ++proved;
          }
        }
      }
    }
  }
  EXPECT_GT(proved, 500);
}

TEST(VerifierCompressed, ReportsTheQuantizationsOfEachSchedule) {
  const std::vector<int> hosts = {0, 0, 1, 1, 2, 2, 3, 3};
  for (const AlgorithmInfo& algo : compressed_algorithm_table()) {
    VerifyResult res = verify(algo.generate({8, 0, 1, hosts}));
    ASSERT_TRUE(res.ok) << res.error;
    std::printf("%-10s %-14s 8 ranks on 4 hosts: each contribution quantized %d to %d times\n", algo.name,
                coll_name(algo.coll), res.min_quantizations, res.max_quantizations);
  }
}

TEST(VerifierCompressed, CatchesRanksThatEndWithDifferentBits) {
  // Quantize-once without the owner keeping D(its codes): the owner's chunk would keep the unquantized sum.
  Program prog = qonce_allreduce({4, 0, 1});
  for (Step& s : prog.ranks[1].lanes[0].steps)
    if (s.op == OpCode::Copy && s.dst.buf == BufKind::Output) s.code = 0;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("same bits"), std::string::npos) << res.error;
}

TEST(VerifierCompressed, CatchesCodedMessagesReceivedAsPlain) {
  Program prog = qonce_allgather({3, 0, 1});
  for (Step& s : prog.ranks[2].lanes[0].steps)
    if (s.op == OpCode::Recv) s.code = 0;
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("coded message"), std::string::npos) << res.error;
}

TEST(VerifierCompressed, CatchesErrorFeedbackAfterTheSends) {
  // The owner folds its residual into the sum after sending it: receivers decode other codes than it keeps.
  Program prog = qonce_allreduce({3, 0, 1});
  auto& steps = prog.ranks[0].lanes[0].steps;
  auto copy_it = std::find_if(steps.begin(), steps.end(),
                              [](const Step& s) { return s.op == OpCode::Copy && s.dst.buf == BufKind::Output; });
  ASSERT_NE(copy_it, steps.end());
  Step c = *copy_it;
  steps.erase(copy_it);
  auto last_send = std::find_if(steps.rbegin(), steps.rend(), [](const Step& s) { return s.op == OpCode::Send; });
  steps.insert(last_send.base(), c);
  VerifyResult res = verify(prog);
  EXPECT_FALSE(res.ok);
  EXPECT_NE(res.error.find("same bits"), std::string::npos) << res.error;
}

}  // namespace
}  // namespace chorus::algo
