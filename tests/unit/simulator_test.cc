// The simulator against closed forms (Hockney's alpha + bytes / bandwidth), shared host limits, CPU costs,
// deadlocks, determinism, coarsening and speed.
#include "algorithms/simulator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "algorithms/algorithms.h"
#include "core/error.h"

namespace chorus::algo {
namespace {

using topo::LinkClass;

// `hosts` hosts of `per_host` ranks (one process each, no NUMA binding: SameNuma within a host). Every intra-host
// class costs `local`, the network `net`; local work is free unless a test sets copy_Bps / reduce_Bps.
topo::Topology cluster(int hosts, int per_host, topo::LinkParams local, topo::LinkParams net = {}, double egress = 0,
                       double ingress = 0) {
  topo::Topology t;
  for (int h = 0; h < hosts; ++h) {
    topo::Host host;
    host.name = host.id = "host" + std::to_string(h);
    host.cores = per_host;
    host.net_egress_Bps = egress;
    host.net_ingress_Bps = ingress;
    t.hosts.push_back(host);
    for (int l = 0; l < per_host; ++l) t.ranks.push_back(topo::RankPlace{h, l, l, -1, -1});
  }
  for (auto& lp : t.links) lp = local;
  t.links[static_cast<int>(LinkClass::Network)] = net;
  return t;
}

Step send_to(int peer, int chunk) { return Step{OpCode::Send, -1, peer, {BufKind::Input, chunk}, {}, false}; }
Step recv_from(int peer, int chunk) { return Step{OpCode::Recv, peer, -1, {}, {BufKind::Output, chunk}, false}; }

// Rank s sends its whole input to rank d for every (s, d) in `flows`; shapes of an all-reduce (one block).
Program flows(int nranks, const std::vector<std::pair<int, int>>& pairs) {
  Program p;
  p.coll = Coll::AllReduce;
  p.algorithm = "test";
  p.nranks = nranks;
  p.ranks.resize(nranks);
  for (auto& rp : p.ranks) {
    rp.input = {1, 1};
    rp.output = {1, 1};
  }
  for (auto [s, d] : pairs) {
    p.ranks[s].lanes.push_back(Lane{0, {send_to(d, 0)}});
    p.ranks[d].lanes.push_back(Lane{0, {recv_from(s, 0)}});
  }
  return p;
}

TEST(Simulator, OneMessageIsAlphaPlusBytesOverBandwidth) {
  const topo::LinkParams lp{5e-6, 1e9};
  topo::Topology t = cluster(1, 2, lp);
  const Program p = flows(2, {{0, 1}});
  SimResult r = simulate(p, t, 1000, 4);
  EXPECT_DOUBLE_EQ(r.seconds, 5e-6 + 4000 / 1e9);
  EXPECT_EQ(r.messages, 1);
  EXPECT_EQ(r.critical_rank, 1);
  EXPECT_EQ(r.bytes_per_class[static_cast<int>(LinkClass::SameNuma)], 4000u);
  EXPECT_EQ(r.messages_per_class[static_cast<int>(LinkClass::SameNuma)], 1);
  EXPECT_EQ(r.max_slices_per_step, 0);  // exact

  // A copy into the slot on the sender and out of it on the receiver.
  t.copy_Bps = 2e9;
  r = simulate(p, t, 1000, 4);
  EXPECT_DOUBLE_EQ(r.seconds, 5e-6 + 4000 / 1e9 + 2 * 4000 / 2e9);
  EXPECT_DOUBLE_EQ(r.cpu_busy_max_s, 4000 / 2e9);
}

TEST(Simulator, PerMessageOverheadIsPaidAtBothEndsAndSerialisesARoot) {
  // LogGP's o: one message costs o of the sender's CPU, alpha + bytes / bandwidth on the wire, o of the receiver's.
  const double alpha = 3e-6, bw = 1e9, o = 0.5e-6;
  SimResult r = simulate(flows(2, {{0, 1}}), cluster(1, 2, {alpha, bw, o}), 1000, 4);
  EXPECT_DOUBLE_EQ(r.seconds, o + alpha + 4000 / bw + o);
  EXPECT_DOUBLE_EQ(r.cpu_busy_max_s, o);

  // A linear scatter of one float per rank: the root posts n-1 messages one after another, so the last leaves at
  // (n-1) o and lands alpha + 4 / bw + o later. Alpha overlaps; the overhead does not.
  for (int n : {4, 64}) {
    const Program lin = linear_scatter({n, 0, 1});
    r = simulate(lin, cluster(1, n, {alpha, bw, o}), 1, 4);
    EXPECT_NEAR(r.seconds, n * o + alpha + 4 / bw, 1e-12) << n;
    EXPECT_NEAR(r.cpu_busy_max_s, (n - 1) * o, 1e-12) << n;
  }
  // So the binomial tree (log2 n rounds of o + alpha + o) loses to the direct exchange at 4 ranks and wins at 256.
  for (auto [n, tree_wins] : {std::pair{4, false}, std::pair{256, true}}) {
    const topo::Topology t = cluster(1, n, {alpha, bw, o});
    const double lin = simulate(linear_scatter({n, 0, 1}), t, 1, 4).seconds;
    const double tree = simulate(binomial_scatter({n, 0, 1}), t, 1, 4).seconds;
    EXPECT_EQ(tree < lin, tree_wins) << n << " ranks: linear " << lin << " s, binomial " << tree << " s";
  }
}

TEST(Simulator, SlicesPipelineOnOneConnection) {
  // 4 MiB in 16 slices of 256 KiB: the connection serialises the bandwidth terms, latency is paid once.
  const topo::LinkParams lp{3e-6, 2e9};
  const Program p = flows(2, {{0, 1}});
  SimResult r = simulate(p, cluster(1, 2, lp), size_t{1} << 20, 4);
  EXPECT_EQ(r.messages, 16);
  EXPECT_NEAR(r.seconds, 3e-6 + (4 << 20) / 2e9, 1e-12);
  // Zero bytes still send one message: pure latency.
  r = simulate(p, cluster(1, 2, lp), 0, 4);
  EXPECT_EQ(r.messages, 1);
  EXPECT_DOUBLE_EQ(r.seconds, 3e-6);
}

TEST(Simulator, RingAllReduceApproachesBandwidthBound) {
  for (int n : {2, 4, 8}) {
    for (int nch : {1, 2}) {
      const double bw = 1e9;
      const size_t count = size_t{16} << 20;  // 64 MiB of floats
      const double bytes = static_cast<double>(count) * 4;
      const Program p = ring_allreduce({n, 0, nch});
      // Pure bandwidth: each rank sends 2(N-1)/N of the data on its one outgoing connection per channel, but
      // channels to the same peer are separate connections here, each at full bandwidth.
      SimResult r = simulate(p, cluster(1, n, {0, bw}), count, 4);
      const double bound = 2.0 * (n - 1) / n * bytes / bw / nch;
      EXPECT_NEAR(r.seconds / bound, 1.0, 0.01) << "n=" << n << " nch=" << nch;
      EXPECT_EQ(r.messages, int64_t{2} * (n - 1) * n * static_cast<int64_t>(bytes / n / nch / (256 << 10)) * nch);
      // With latency, still within a few % at this size.
      r = simulate(p, cluster(1, n, {2e-6, bw}), count, 4);
      EXPECT_NEAR(r.seconds / bound, 1.0, 0.03) << "n=" << n << " nch=" << nch;
      EXPECT_GT(r.seconds, bound);
    }
  }
}

TEST(Simulator, SharedHostEgressHalvesPerFlowRate) {
  // Hosts of two ranks; ranks 0 and 1 (host 0) send 16 MiB each to ranks 2 and 3 (host 1).
  const topo::LinkParams net{0, 1e9};
  const size_t count = size_t{4} << 20;
  const double one_flow = 16.0 * (1 << 20) / 1e9;
  // Egress of host 0 equals one connection's bandwidth: two flows at once take twice as long.
  topo::Topology t = cluster(2, 2, {0, 1e12}, net, 1e9, 0);
  SimResult r1 = simulate(flows(4, {{0, 2}}), t, count, 4);
  EXPECT_NEAR(r1.seconds, one_flow, one_flow * 1e-9);
  SimResult r2 = simulate(flows(4, {{0, 2}, {1, 3}}), t, count, 4);
  EXPECT_NEAR(r2.seconds / r1.seconds, 2.0, 0.01);
  EXPECT_EQ(r2.bytes_per_class[static_cast<int>(LinkClass::Network)], 2u * 16 << 20);
  // The same on the receiving side.
  t = cluster(2, 2, {0, 1e12}, net, 0, 1e9);
  EXPECT_NEAR(simulate(flows(4, {{0, 2}, {1, 3}}), t, count, 4).seconds / one_flow, 2.0, 0.01);
  // Twice the bandwidth: both flows at full speed.
  t = cluster(2, 2, {0, 1e12}, net, 2e9, 2e9);
  EXPECT_NEAR(simulate(flows(4, {{0, 2}, {1, 3}}), t, count, 4).seconds / one_flow, 1.0, 0.01);
  // Flows that leave different hosts do not share: 0 -> 2 and 3 -> 1.
  t = cluster(2, 2, {0, 1e12}, net, 1e9, 1e9);
  EXPECT_NEAR(simulate(flows(4, {{0, 2}, {3, 1}}), t, count, 4).seconds / one_flow, 1.0, 0.01);
}

TEST(Simulator, LanesOfOneRankShareItsCpu) {
  // Free links, costly local work: the call is CPU-bound, and two channels' lanes take turns on one CPU.
  topo::Topology t = cluster(1, 2, {0, 0});
  t.copy_Bps = 4e9;
  t.reduce_Bps = 2e9;
  const size_t count = size_t{1} << 20;  // 4 MiB, cut into n * nch = 4 chunks of 1 MiB
  const double chunk = 1 << 20;
  // Per lane: send (copy), recv_reduce_copy_send (reduce + copy), recv (copy).
  const double per_lane = 3 * chunk / 4e9 + chunk / 2e9;
  SimResult r = simulate(ring_allreduce({2, 0, 2}), t, count, 4);
  EXPECT_NEAR(r.cpu_busy_max_s, 2 * per_lane, 1e-12);
  EXPECT_GE(r.seconds, r.cpu_busy_max_s);
  EXPECT_NEAR(r.seconds / r.cpu_busy_max_s, 1.0, 0.05);
}

TEST(Simulator, MonotonicInSizeAndDeterministic) {
  topo::Topology t = cluster(2, 4, {1e-6, 10e9}, {5e-6, 5e9}, 10e9, 10e9);
  t.copy_Bps = 8e9;
  t.reduce_Bps = 4e9;
  for (const AlgorithmInfo& a : algorithm_table()) {
    if (a.coll == Coll::SendRecv || a.coll == Coll::Barrier) continue;
    std::shared_ptr<const Program> p;
    try {
      p = get_program(a, {8, 0, 2, t.host_of_rank()});
    } catch (const std::invalid_argument&) {
      continue;
    }
    double prev = -1;
    for (size_t count = 0; count <= (size_t{1} << 24); count = count ? count * 4 : 1) {
      SimResult r = simulate(*p, t, count, 4);
      EXPECT_GE(r.seconds, prev) << a.name << " " << coll_name(a.coll) << " count=" << count;
      prev = r.seconds;
      SimResult again = simulate(*p, t, count, 4);
      EXPECT_EQ(again.seconds, r.seconds);  // bit for bit
      EXPECT_EQ(again.critical_rank, r.critical_rank);
      EXPECT_EQ(again.messages, r.messages);
    }
  }
}

TEST(Simulator, QueueAndDataflowWalksAgree) {
  // Without shared servers the walk runs without an event queue; a host link limit too large to matter forces
  // the queue (two connections leave each host) and must give the same times.
  const topo::LinkParams local{1e-6, 8e9}, net{4e-6, 3e9};
  for (const char* name : {"ring", "tree", "hier", "rhd"}) {
    const AlgorithmInfo* a = find_algorithm(Coll::AllReduce, name);
    if (a == nullptr) continue;
    topo::Topology free_net = cluster(2, 4, local, net);
    const Program p = a->generate({8, 0, 2, free_net.host_of_rank()});
    for (size_t count : {size_t{1}, size_t{1} << 20}) {
      const SimResult dataflow = simulate(p, free_net, count, 4);
      const SimResult queued = simulate(p, cluster(2, 4, local, net, 1e30, 1e30), count, 4);
      EXPECT_NEAR(queued.seconds, dataflow.seconds, dataflow.seconds * 1e-12) << name << " count=" << count;
      EXPECT_EQ(queued.messages, dataflow.messages);
    }
  }
}

// Halving/doubling on one host: log2(N) rounds each way, one message per round whatever its size, so a tiny
// all-reduce costs 2 log2(N) alphas; with a run of several slices the rounds still follow each other (fences).
TEST(Simulator, HalvingDoublingRoundsCostOneMessageEach) {
  const double alpha = 3e-6, bw = 1e9;
  const topo::Topology one_host = cluster(1, 8, {alpha, bw});
  const Program p = rhd_allreduce({8, 0, 1});
  const SimResult tiny = simulate(p, one_host, 8, 4);  // 8 floats: one per chunk
  EXPECT_EQ(tiny.messages, 8 * 6);
  EXPECT_NEAR(tiny.seconds, 6 * alpha + (16 + 8 + 4 + 4 + 8 + 16) / bw, 1e-12);
  // 8 M floats, 256 KiB slices: halving sends half, a quarter, an eighth of 32 MiB, doubling the same back: 224
  // slices. A lane alternates a round's send and receive slice by slice, so each slice also waits out one alpha.
  const size_t count = size_t{8} << 20;
  const SimResult big = simulate(p, one_host, count, 4);
  const double bytes = 2.0 * 4 * count * (0.5 + 0.25 + 0.125);
  EXPECT_EQ(big.messages, 8 * 224);
  EXPECT_GT(big.seconds, bytes / bw + 6 * alpha);  // the rounds follow each other
  EXPECT_LT(big.seconds, bytes / bw + (224 + 6) * alpha);
}

TEST(Simulator, DeadlocksAreErrors) {
  // The ring all-reduce needs two slots: with one, every rank holds its slot and waits for the next one's.
  const Program p = ring_allreduce({4, 0, 1});
  topo::Topology t = cluster(1, 4, {1e-6, 1e9});
  SimOptions one;
  one.fifo_depth = 1;
  try {
    simulate(p, t, 1 << 20, 4, one);
    FAIL() << "no deadlock reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInternalError);
    EXPECT_NE(std::string(e.what()).find("deadlock with fifo depth 1"), std::string::npos) << e.what();
  }
  SimOptions two;
  two.fifo_depth = 2;
  EXPECT_GT(simulate(p, t, 1 << 20, 4, two).seconds, 0);

  Program bad = ring_allgather({3, 0, 1});
  for (auto& rp : bad.ranks) std::swap(rp.lanes[0].steps[0], rp.lanes[0].steps[2]);  // everyone receives first
  EXPECT_THROW(simulate(bad, cluster(1, 3, {1e-6, 1e9}), 100, 4), Error);
}

TEST(Simulator, BadInputsAreErrors) {
  const Program p = ring_allreduce({4, 0, 1});
  try {
    simulate(p, cluster(1, 3, {1e-6, 1e9}), 100, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("3 ranks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(simulate(p, cluster(1, 4, {1e-6, 1e9}), 100, 0), Error);
  Program broken = p;
  broken.ranks[1].lanes[0].steps[0].src.chunk = 99;
  try {
    simulate(broken, cluster(1, 4, {1e-6, 1e9}), 100, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInternalError);
    EXPECT_NE(std::string(e.what()).find("chunk 99 out of range"), std::string::npos) << e.what();
  }
}

TEST(Simulator, CoarseningKeepsRingPredictions) {
  // A ring is not pipeline-depth bound: coarse slices predict nearly what exact ones do.
  const Program p = ring_allreduce({8, 0, 1});
  topo::Topology t = cluster(1, 8, {2e-6, 5e9});
  t.copy_Bps = 10e9;
  t.reduce_Bps = 5e9;
  const size_t count = size_t{64} << 20;  // 256 MiB: 32 MiB chunks, 128 slices each
  SimOptions exact;
  exact.max_step_slices = int64_t{1} << 30;
  SimOptions coarse;
  const int steps = 8 * 15;            // 8 ranks x (2(N-1) + 1) steps
  coarse.max_step_slices = steps * 8;  // 8 slices per step
  SimResult e = simulate(p, t, count, 4, exact), c = simulate(p, t, count, 4, coarse);
  EXPECT_EQ(e.max_slices_per_step, 0);
  EXPECT_EQ(c.max_slices_per_step, 8);
  EXPECT_EQ(c.step_slices, steps * 8);
  EXPECT_EQ(e.step_slices, steps * 128);
  EXPECT_EQ(c.bytes_per_class, e.bytes_per_class);
  EXPECT_NEAR(c.seconds / e.seconds, 1.0, 0.05);
}

TEST(Simulator, SixtyFourRanksPredictQuickly) {
  topo::Topology t = cluster(8, 8, {1e-6, 20e9}, {5e-6, 12.5e9}, 25e9, 25e9);
  t.copy_Bps = 10e9;
  t.reduce_Bps = 5e9;
  double worst_ms = 0;
  for (const AlgorithmInfo& a : algorithm_table()) {
    if (a.coll != Coll::AllReduce) continue;
    std::shared_ptr<const Program> p;
    try {
      p = get_program(a, {64, 0, 1, t.host_of_rank()});
    } catch (const std::invalid_argument&) {
      continue;
    }
    for (size_t count : {size_t{1}, size_t{1} << 16, size_t{1} << 28}) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      SimResult r = simulate(*p, t, count, 4);
      const double cpu_ms = 1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("  64 ranks %-8s count=%-10zu %12.1f us predicted, %6lld step-slices, %6.2f ms (cpu %.2f ms)\n",
                  a.name, count, r.seconds * 1e6, static_cast<long long>(r.step_slices), ms, cpu_ms);
      worst_ms = std::max(worst_ms, ms);
    }
  }
  EXPECT_LT(worst_ms, 50.0);  // target: well under 10 ms; loose here for loaded CI machines
}

TEST(CallBlocks, MatchTheApi) {
  RankProgram rp;
  rp.scratch = {3, 2};
  EXPECT_EQ(call_blocks(Coll::AllReduce, BufKind::Input, 10, 4, rp).nblocks, 1);
  EXPECT_EQ(call_blocks(Coll::AllGather, BufKind::Output, 10, 4, rp).nblocks, 4);
  EXPECT_EQ(call_blocks(Coll::AllGather, BufKind::Input, 10, 4, rp).nblocks, 1);
  EXPECT_EQ(call_blocks(Coll::ReduceScatter, BufKind::Input, 10, 4, rp).nblocks, 4);
  EXPECT_EQ(call_blocks(Coll::ReduceScatter, BufKind::Output, 10, 4, rp).nblocks, 1);
  EXPECT_EQ(call_blocks(Coll::AllToAll, BufKind::Output, 10, 4, rp).nblocks, 4);
  EXPECT_EQ(call_blocks(Coll::Broadcast, BufKind::Output, 10, 4, rp).block_elems, 10u);
  EXPECT_EQ(call_blocks(Coll::AllReduce, BufKind::Scratch, 10, 4, rp).nblocks, 3);
  EXPECT_EQ(call_blocks(Coll::SendRecv, BufKind::Input, 10, 4, rp).nblocks, 0);
}

}  // namespace
}  // namespace chorus::algo
