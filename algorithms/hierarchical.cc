// Hierarchical ("multi-hop") programs: inside each host, then across hosts among one rank per host, then inside
// each host again, so that the slow inter-host links carry each byte as few times as possible.
//
// Hosts come from ProgramParams::host_of_rank (empty: one host). Host h has m_h ranks (its members, ascending);
// hosts may be uneven (3 + 5). The buffer is cut into P = max_h m_h parts; on host h, part p belongs to the member
// with local index p mod m_h (its owner), so on an uneven host a member may own two parts. The owners of one part
// (one per host) form that part's inter-host ring.
//  - all-reduce: ring reduce-scatter of every part inside each host towards its owner; ring all-reduce of each
//    part among its owners across hosts (the part cut into H sub-parts); ring all-gather inside each host. Each
//    host sends 2(H-1)/H of the data across the network, against 2(N-1)/N for a flat ring.
//  - all-gather and reduce-scatter move whole blocks (a block's parts as one run of chunks) along rails: rail j is
//    the members of local index j (j mod m on a host of m < P ranks). All-gather: ring all-gather of every host's
//    j-th block among rail j across hosts; then every block around its host's ring from the member that has it.
//    Reduce-scatter, the mirror: every block's inputs reduced around each host's ring towards the block's rail
//    member, then the host sums reduced along the rail's ring across hosts, ending at the block's rank. Either
//    moves N (H - 1 + N (m - 1) / m) messages, like a flat ring's N (N - 1), and each byte crosses the network
//    once per host, as a flat ring's does.
//  - all-to-all (two-level): a block for another host goes first to the member whose local index matches the
//    destination's (mod the host size), which forwards it across hosts. Each level sends one message per pair: inside
//    the host, a rank sends each member that member's own block and the blocks it relays (packed); across hosts, a
//    relay sends each rank it serves the blocks of all its host's members. So a rank sends m - 1 messages in its host
//    and about H - 1 across hosts, where pairwise sends N - 1, at the price of copies in and out of scratch (one lane,
//    whole blocks as chunks, as the Bruck all-to-all). A level's sends run ahead of its receives (send_ahead). Scratch,
//    in blocks: T, the blocks a rank relays (about N - m), then level 1's pack and receive runs (about N - N/m each);
//    level 2's staging, needed only for a host whose members are not consecutive ranks, reuses the level-1 runs. So 2-3
//    times the input (2.6x at 64 ranks on 8 hosts, 2.8x at 256): an algorithm for small blocks, where messages cost
//    more than copies.
// Steps are scheduled with Builder keys: (phase, round, sub-chunk, ., hop), so every pair of ranks orders the
// messages between them the same way and each rank handles one chain per hop of a round, as in a flat ring. The
// all-reduce moves a part's H sub-parts inside a host as one run of chunks, so its phases are fenced (Step::fence).
#include <algorithm>
#include <stdexcept>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"

namespace chorus::algo {

namespace {

struct Hosts {
  std::vector<std::vector<int>> members;  // host -> ranks, ascending
  std::vector<int> host, local;           // rank -> host, local index
  int P = 1;                              // max ranks per host
  int H() const { return static_cast<int>(members.size()); }
  int m(int h) const { return static_cast<int>(members[h].size()); }
  int owner(int h, int p) const { return members[h][p % m(h)]; }
  int round(int h, int p) const { return p / m(h); }
  // Host h's ring starting at local index `start`, `len` ranks.
  std::vector<int> ring(int h, int start, int len) const {
    std::vector<int> v;
    for (int i = 0; i < len; ++i) v.push_back(members[h][(start + i) % m(h)]);
    return v;
  }
};

Hosts hosts_of(const ProgramParams& p) {
  Hosts hs;
  const int n = p.nranks;
  std::vector<int> hor = p.host_of_rank.empty() ? std::vector<int>(n, 0) : p.host_of_rank;
  int nh = 0;
  for (int h : hor) {
    if (h < 0) throw std::invalid_argument("host_of_rank has a negative host");
    nh = std::max(nh, h + 1);
  }
  hs.members.resize(nh);
  hs.host = hor;
  hs.local.resize(n);
  for (int r = 0; r < n; ++r) {
    hs.local[r] = static_cast<int>(hs.members[hor[r]].size());
    hs.members[hor[r]].push_back(r);
  }
  for (int h = 0; h < nh; ++h) {
    if (hs.members[h].empty()) throw std::invalid_argument("host_of_rank leaves a host without ranks");
    hs.P = std::max(hs.P, hs.m(h));
  }
  return hs;
}

std::vector<int> one_lane_per_channel(int nch) {
  std::vector<int> v(nch);
  for (int ch = 0; ch < nch; ++ch) v[ch] = ch;
  return v;
}

}  // namespace

namespace {

// `direct`: the exchange among the owners of a part is a direct reduce-scatter and all-gather (every owner sends
// sub-part s straight to its owner, which sends the result straight back) instead of a ring: one hop per message,
// so a coded sub-part is quantized once on its way in and once on its way out, whatever the number of hosts.
Program hier_allreduce_impl(const ProgramParams& prm, bool direct) {
  Program prog = new_program(Coll::AllReduce, "hier", prm);
  const Hosts hs = hosts_of(prm);
  const int H = hs.H(), P = hs.P, nch = prm.nchannels;
  for (RankProgram& rp : prog.ranks) rp.input = rp.output = {1, nch * P * H};
  Builder b(prog, one_lane_per_channel(nch));
  for (int ch = 0; ch < nch; ++ch) {
    auto chunk = [&](int p, int s) { return (ch * P + p) * H + s; };
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      for (int p = 0; p < P; ++p) {
        const int o = p % m, rd = hs.round(h, p);
        // Inside the host: reduce part p towards its owner (the last of the ring), later pass the result around;
        // the H sub-parts of the part are one run (one message per hop), as the phases are fenced below.
        const int c = chunk(p, 0);
        b.chain_reduce(
            ch, Key{0, rd, 0, 0, 0}, hs.ring(h, o + 1, m), [&](int) { return in(c, H); }, out(c, H), H == 1);
        b.chain_bcast(ch, Key{2, rd, 0, 0, 0}, hs.ring(h, o, m), out(c, H), [&](int) { return out(c, H); });
      }
    }
    if (H == 1) continue;
    for (int p = 0; p < P; ++p) {
      std::vector<int> owners;
      for (int h = 0; h < H; ++h) owners.push_back(hs.owner(h, p));
      for (int s = 0; s < H; ++s) {
        const int c = chunk(p, s);
        if (direct) {
          // Round t: the owner on host (s - t) sends its partial of sub-part s to the owner on host s, which adds
          // it; then the result goes back in the same order.
          for (int t = 1; t < H; ++t)
            b.chain_reduce(
                ch, Key{1, p, 0, t, 0}, {owners[(s - t + H) % H], owners[s]}, [&](int) { return out(c); }, out(c),
                t == H - 1);
          for (int t = 1; t < H; ++t)
            b.chain_bcast(ch, Key{1, p, 1, t, 0}, {owners[s], owners[(s + t) % H]}, out(c),
                          [&](int) { return out(c); });
          continue;
        }
        std::vector<int> rs_path, ag_path;
        for (int i = 0; i < H; ++i) {
          rs_path.push_back(owners[(s + 1 + i) % H]);
          ag_path.push_back(owners[(s + i) % H]);
        }
        b.chain_reduce(
            ch, Key{1, p, 0, 0, 0}, rs_path, [&](int) { return out(c); }, out(c), true);
        b.chain_bcast(ch, Key{1, p, 1, 0, 0}, ag_path, out(c), [&](int) { return out(c); });
      }
    }
  }
  // The owners' exchange works on single sub-parts of what the host phase wrote as one run, and the host's
  // all-gather reads them back as one run: each phase waits for the whole of the one before.
  b.finish(/*fence_phases=*/true);
  return prog;
}

}  // namespace

Program hier_allreduce(const ProgramParams& prm) { return hier_allreduce_impl(prm, false); }
Program hier_allreduce_direct(const ProgramParams& prm) { return hier_allreduce_impl(prm, true); }

Program hier_allgather(const ProgramParams& prm) {
  Program prog = new_program(Coll::AllGather, "hier", prm);
  const Hosts hs = hosts_of(prm);
  const int n = prm.nranks, H = hs.H(), P = hs.P, nch = prm.nchannels;
  for (RankProgram& rp : prog.ranks) {
    rp.input = {1, nch * P};
    rp.output = {n, nch * P};
  }
  Builder b(prog, one_lane_per_channel(nch));
  for (int ch = 0; ch < nch; ++ch) {
    // A block's P parts on this channel, as one run: every step moves whole blocks.
    auto block_run = [&](int blk) { return out(blk * nch * P + ch * P, P); };
    for (int r = 0; r < n; ++r) b.add(r, ch, Key{0, 0, 0, 0, -1}, copy(in(ch * P, P), block_run(r), false));
    // Across hosts: rail j (the members of local index j; j mod m on a host of m < P) passes every host's j-th
    // block around its ring.
    if (H > 1)
      for (int j = 0; j < P; ++j)
        for (int hb = 0; hb < H; ++hb) {
          if (j >= hs.m(hb)) continue;
          const int blk = hs.members[hb][j];
          std::vector<int> path;
          for (int i = 0; i < H; ++i) path.push_back(hs.owner((hb + i) % H, j));
          b.chain_bcast(ch, Key{1, j, 0, 0, 0}, path, block_run(blk), [&](int) { return block_run(blk); });
        }
    // Inside each host: every block goes around the host's ring from the member that has it (its own rank, or
    // the rail member that received it), in the order blocks arrive: this host's own, then those one host away...
    // The k-th block a member starts is a ring all-gather round among the host's members.
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      std::vector<int> started(static_cast<size_t>(m), 0);
      for (int d = 0; d < H; ++d) {
        const int hb = (h - d + H) % H;
        for (int j = 0; j < hs.m(hb); ++j) {
          const int blk = hs.members[hb][j], x = j % m;
          b.chain_bcast(ch, Key{2, started[static_cast<size_t>(x)]++, 0, 0, 0}, hs.ring(h, x, m), block_run(blk),
                        [&](int) { return block_run(blk); });
        }
      }
    }
  }
  b.finish();
  return prog;
}

namespace {

// `runs_between_hosts` false: the messages between hosts carry one chunk each (a block's parts one by one), as
// coded programs need (a codec keys one chunk); the phases are then fenced, since the host phase writes runs.
Program hier_reduce_scatter_impl(const ProgramParams& prm, bool runs_between_hosts) {
  const Hosts hs = hosts_of(prm);
  if (hs.H() == 1) {
    // One host: the ring reduce-scatter.
    Program ring = ring_reduce_scatter(prm);
    ring.algorithm = "hier";
    return ring;
  }
  Program prog = new_program(Coll::ReduceScatter, "hier", prm);
  const int n = prm.nranks, H = hs.H(), P = hs.P, nch = prm.nchannels;
  for (RankProgram& rp : prog.ranks) {
    rp.input = {n, nch * P};
    rp.output = {1, nch * P};
    rp.scratch = {n, nch * P};
  }
  Builder b(prog, one_lane_per_channel(nch));
  for (int ch = 0; ch < nch; ++ch) {
    auto in_run = [&](int blk) { return in(blk * nch * P + ch * P, P); };
    auto scr_run = [&](int blk) { return scr(blk * nch * P + ch * P, P); };
    // Inside each host: every block's inputs reduced along the host's ring towards the block's rail member, in
    // the order the rails' rings across hosts need them: blocks of the previous host first, the host's own last.
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      std::vector<int> ended(static_cast<size_t>(m), 0);
      for (int i = 0; i < H; ++i) {
        const int hb = (h - 1 - i + H) % H;
        for (int j = 0; j < hs.m(hb); ++j) {
          const int blk = hs.members[hb][j], x = j % m;
          b.chain_reduce(
              ch, Key{0, ended[static_cast<size_t>(x)]++, 0, 0, 0}, hs.ring(h, x + 1, m),
              [&](int) { return in_run(blk); }, scr_run(blk), false);
        }
      }
    }
    // Across hosts: rail j reduces every host's j-th block around its ring, from the next host on, ending at the
    // block's rank with the host sum it holds.
    for (int j = 0; j < P; ++j)
      for (int hb = 0; hb < H; ++hb) {
        if (j >= hs.m(hb)) continue;
        const int blk = hs.members[hb][j];
        std::vector<int> path;
        for (int i = 1; i <= H; ++i) path.push_back(hs.owner((hb + i) % H, j));
        if (runs_between_hosts) {
          b.chain_reduce(
              ch, Key{1, j, 0, 0, 0}, path, [&](int) { return scr_run(blk); }, out(ch * P, P), true);
          continue;
        }
        for (int p = 0; p < P; ++p) {
          const int c = blk * nch * P + ch * P + p;
          b.chain_reduce(
              ch, Key{1, j, p, 0, 0}, path, [&](int) { return scr(c); }, out(ch * P + p), true);
        }
      }
  }
  b.finish(/*fence_phases=*/!runs_between_hosts);
  return prog;
}

}  // namespace

Program hier_reduce_scatter(const ProgramParams& prm) { return hier_reduce_scatter_impl(prm, true); }
Program hier_reduce_scatter_single_chunks(const ProgramParams& prm) { return hier_reduce_scatter_impl(prm, false); }

namespace {

// How many rounds of a level's sends go ahead of its receives. A receive that waited right after its round's send
// would hold the next send back until its message had crossed the link, so a level of R rounds would cost R
// latencies (the simulator: 2.3 ms for an empty all-to-all over 64 hosts x 8 ranks, 0.4 ms with 8 ahead). Sending
// every round before any receive costs one latency but lets every peer's message reach a receiver at once (incast:
// on emulated hosts with 1 Gbit/s links, 4 x 2 ranks, 1 MiB all-to-alls ran 13-34% slower than in lockstep, 2x in
// place at 256 KiB; docs/perf/alltoall-window-2026-12-02.md). Eight ahead hides a latency of up to about 16
// per-message overheads o, and a receiver that keeps pace has at most 9 senders at once. MPICH bounds its
// medium-size all-to-all the same way (MPIR_CVAR_ALLTOALL_THROTTLE: 32 sends and receives posted at a time); NCCL
// posts every peer's send and receive of an all-to-all at once.
constexpr int kRoundsAhead = 8;

// A level's steps: the sends of round d, then the receives of round d - kRoundsAhead, for every d; then the last
// receives.
std::vector<Step> send_ahead(const std::vector<std::vector<Step>>& sends, const std::vector<std::vector<Step>>& recvs) {
  std::vector<Step> steps;
  const int rounds = static_cast<int>(sends.size());
  for (int d = 0; d < rounds + kRoundsAhead; ++d) {
    if (d < rounds) steps.insert(steps.end(), sends[d].begin(), sends[d].end());
    const int r = d - kRoundsAhead;
    if (r >= 0 && r < rounds) steps.insert(steps.end(), recvs[r].begin(), recvs[r].end());
  }
  return steps;
}

}  // namespace

Program hier_alltoall(const ProgramParams& prm) {
  Program prog = new_program(Coll::AllToAll, "hier", prm);
  const Hosts hs = hosts_of(prm);
  const int n = prm.nranks, H = hs.H();
  // served[h][k]: the ranks of other hosts that the member of local index k of host h relays to (local index = k
  // mod m_h), by host distance, then local index: the order of the blocks in every message about them.
  std::vector<std::vector<std::vector<int>>> served(H);
  for (int h = 0; h < H; ++h) {
    served[h].resize(hs.m(h));
    for (int dist = 1; dist < H; ++dist)
      for (int d : hs.members[(h + dist) % H]) served[h][hs.local[d] % hs.m(h)].push_back(d);
  }
  auto consecutive = [&](int h) { return hs.members[h].back() - hs.members[h].front() + 1 == hs.m(h); };
  for (int r = 0; r < n; ++r) {
    const int h = hs.host[r], k = hs.local[r], m = hs.m(h);
    const std::vector<int>& mine = served[h][k];
    const int nd = static_cast<int>(mine.size());
    RankProgram& rp = prog.ranks[r];
    rp.input = rp.output = {n, 1};
    Lane lane{0, {}};
    int top = 0;  // scratch blocks reserved so far
    auto reserve = [&](int blocks) {
      const int at = top;
      top += blocks;
      return at;
    };
    // The block that the member of local index j of this host sends for served rank i: slot i * m + j of T.
    const int t0 = m > 1 ? reserve(nd * m) : 0;
    const int t_end = top;  // level 2's staging starts here (below)
    // A level sends one message per pair of ranks, so running its sends ahead of its receives (send_ahead) changes
    // no FIFO matching; every step waits only on steps of earlier rounds (or earlier slices), so any slice count
    // and FIFO depth progress (the verifier proves it at capacity 2).
    std::vector<Step> pack, unpack1, unpack2;
    std::vector<std::vector<Step>> send1(m), recv1(m), send2(H), recv2(H);  // by round (t, or host distance)
    pack.push_back(copy(in(r), out(r), false));
    for (int i = 0; i < nd && m > 1; ++i) pack.push_back(copy(in(mine[i]), scr(t0 + i * m + k), false));
    // Level 1, inside the host: to the member t places on, that member's own block and those it relays; from the
    // member t places back, ours and those we relay (into T).
    for (int t = 1; t < m; ++t) {
      const int y = hs.members[h][(k + t) % m], x = hs.members[h][(k - t + m) % m];
      std::vector<ChunkRef> sources, dests;
      add_run(sources, in(y));
      for (int d : served[h][hs.local[y]]) add_run(sources, in(d));
      add_run(dests, out(x));
      for (int i = 0; i < nd; ++i) add_run(dests, scr(t0 + i * m + hs.local[x]));
      const int nsrc = 1 + static_cast<int>(served[h][hs.local[y]].size());
      const ChunkRef src = packed_run(sources, sources.size() == 1 ? 0 : reserve(nsrc), false, pack);
      const ChunkRef dst = packed_run(dests, dests.size() == 1 ? 0 : reserve(1 + nd), true, unpack1);
      send1[t].push_back(send(y, src));
      recv1[t].push_back(recv(x, dst));
    }
    // Level 2, across hosts: to each served rank, the blocks of every member of this host (in local order); from
    // the relay of each other host, the blocks of its members. Its staging reuses the level-1 runs after T: phases
    // are fenced, and level 1 and its unpack are done with them before level 2 starts.
    const int level1_end = top;
    top = t_end;
    for (int dist = 1; dist < H; ++dist) {
      const int hd = (h + dist) % H, hf = (h - dist + H) % H;
      for (int i = 0; i < nd; ++i)
        if (hs.host[mine[i]] == hd) send2[dist].push_back(send(mine[i], m > 1 ? scr(t0 + i * m, m) : in(mine[i])));
      const int relay = hs.members[hf][k % hs.m(hf)], mf = hs.m(hf);
      if (consecutive(hf)) {
        recv2[dist].push_back(recv(relay, out(hs.members[hf].front(), mf)));
      } else {
        std::vector<ChunkRef> dests;
        for (int x : hs.members[hf]) add_run(dests, out(x));
        recv2[dist].push_back(recv(relay, packed_run(dests, reserve(mf), true, unpack2)));
      }
    }
    std::vector<Step> level1 = send_ahead(send1, recv1), level2 = send_ahead(send2, recv2);
    for (const std::vector<Step>* phase : {&pack, &level1, &unpack1, &level2, &unpack2})
      append_phase(lane.steps, *phase);
    top = std::max(top, level1_end);
    if (top > 0) rp.scratch = {top, 1};
    rp.lanes.push_back(std::move(lane));
  }
  return prog;
}

}  // namespace chorus::algo
