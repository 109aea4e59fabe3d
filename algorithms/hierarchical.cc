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
//  - all-gather: ring all-gather inside each host; ring all-gather of part p of every host's blocks among the
//    owners of p; each owner passes what it received along its host's ring.
//  - reduce-scatter: the mirror: every block's part p reduced inside the host towards its owner, then across hosts
//    along the owners' ring ending on the block's host, then handed to the block's rank.
//  - all-to-all (two-level): a block for another host goes first to the member whose local index matches the
//    destination's (mod the host size), which forwards it across hosts, so every rank talks to its host and to one
//    rank per other host instead of to every rank.
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
    auto oc = [&](int blk, int p) { return out(blk * nch * P + ch * P + p); };
    // A block's P parts on this channel, as one run.
    auto block_run = [&](int blk) { return out(blk * nch * P + ch * P, P); };
    for (int r = 0; r < n; ++r) b.add(r, ch, Key{0, 0, 0, 0, -1}, copy(in(ch * P, P), block_run(r), false));
    // Inside each host: ring all-gather of the host's own blocks, each block one run (on one host this is the
    // ring all-gather).
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      for (int x = 0; x < m; ++x) {
        const int src = hs.members[h][x];
        b.chain_bcast(ch, Key{0, 0, 0, 0, 0}, hs.ring(h, x, m), block_run(src), [&](int) { return block_run(src); });
      }
    }
    if (H == 1) continue;
    // Across hosts: the owners of part p pass part p of every host's j-th block around their ring.
    for (int p = 0; p < P; ++p) {
      for (int j = 0; j < P; ++j) {
        for (int hsrc = 0; hsrc < H; ++hsrc) {
          if (j >= hs.m(hsrc)) continue;
          const int blk = hs.members[hsrc][j];
          std::vector<int> path;
          for (int i = 0; i < H; ++i) path.push_back(hs.owner((hsrc + i) % H, p));
          b.chain_bcast(ch, Key{1, p, j, 0, 0}, path, oc(blk, p), [&](int) { return oc(blk, p); });
        }
      }
    }
    // Inside each host again: each owner hands on part p of every remote block.
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      for (int p = 0; p < P; ++p) {
        const int o = p % m;
        for (int blk = 0; blk < n; ++blk) {
          if (hs.host[blk] == h) continue;
          b.chain_bcast(ch, Key{2, hs.round(h, p), blk, 0, 0}, hs.ring(h, o, m), oc(blk, p),
                        [&](int) { return oc(blk, p); });
        }
      }
    }
  }
  // The owners' exchange reads single parts of blocks the host phase moved as runs: a phase apart.
  b.finish(/*fence_phases=*/true);
  return prog;
}

Program hier_reduce_scatter(const ProgramParams& prm) {
  const Hosts hs = hosts_of(prm);
  if (hs.H() == 1) {
    // One host: the ring reduce-scatter. The general program below reduces every block's every part towards the
    // part's owner and then hands it to the block's rank: N^2 (N - 1) messages on one host.
    Program ring = ring_reduce_scatter(prm);
    ring.algorithm = "hier";
    return ring;
  }
  Program prog = new_program(Coll::ReduceScatter, "hier", prm);
  const int n = prm.nranks, H = hs.H(), P = hs.P, nch = prm.nchannels;
  for (RankProgram& rp : prog.ranks) {
    rp.input = {n, nch * P};
    rp.output = {1, nch * P};
    if (n > 1) rp.scratch = {n, nch * P};
  }
  Builder b(prog, one_lane_per_channel(nch));
  for (int ch = 0; ch < nch; ++ch) {
    auto ic = [&](int blk, int p) { return in(blk * nch * P + ch * P + p); };
    auto sc = [&](int blk, int p) { return scr(blk * nch * P + ch * P + p); };
    auto oc = [&](int p) { return out(ch * P + p); };
    if (n == 1) {
      for (int p = 0; p < P; ++p) b.add(0, ch, Key{}, Step{OpCode::Copy, -1, -1, ic(0, p), oc(p), true});
      continue;
    }
    // Inside each host: part p of every block reduced towards the host's owner of p (host sums in scratch).
    for (int h = 0; h < H; ++h) {
      const int m = hs.m(h);
      for (int p = 0; p < P; ++p) {
        const int o = p % m;
        for (int blk = 0; blk < n; ++blk)
          b.chain_reduce(
              ch, Key{0, hs.round(h, p), blk, 0, 0}, hs.ring(h, o + 1, m), [&](int) { return ic(blk, p); }, sc(blk, p),
              false);
      }
    }
    // Across hosts: block blk's part p travels the owners' ring and ends, complete, at its host's owner; then
    // the owner hands it to the block's rank.
    for (int p = 0; p < P; ++p) {
      for (int blk = 0; blk < n; ++blk) {
        const int hb = hs.host[blk], j = hs.local[blk];
        std::vector<int> path;
        for (int i = 1; i <= H; ++i) path.push_back(hs.owner((hb + i) % H, p));
        const int last = path.back();
        const ChunkRef dst = last == blk ? oc(p) : sc(blk, p);
        b.chain_reduce(
            ch, Key{1, p, j, 0, 0}, path, [&](int) { return sc(blk, p); }, dst, true);
        if (last != blk) {
          b.add(last, ch, Key{2, p, j, 0, 0}, send(blk, sc(blk, p)));
          b.add(blk, ch, Key{2, p, j, 0, 0}, recv(last, oc(p)));
        }
      }
    }
  }
  b.finish();
  return prog;
}

Program hier_alltoall(const ProgramParams& prm) {
  Program prog = new_program(Coll::AllToAll, "hier", prm);
  const Hosts hs = hosts_of(prm);
  const int n = prm.nranks, H = hs.H(), nch = prm.nchannels;
  // Slots of scratch on each relay, numbered in the order the relay meets them.
  std::vector<int> nslots(n, 0);
  std::vector<std::vector<int>> slot(n, std::vector<int>(n, -1));  // slot[x][d] on relay(x, d)
  auto relay = [&](int x, int d) { return hs.members[hs.host[x]][hs.local[d] % hs.m(hs.host[x])]; };
  for (int x = 0; x < n; ++x)
    for (int d = 0; d < n; ++d) {
      const int y = relay(x, d);
      if (hs.host[d] != hs.host[x] && y != x) slot[x][d] = nslots[y]++;
    }
  for (int r = 0; r < n; ++r) {
    prog.ranks[r].input = prog.ranks[r].output = {n, nch};
    if (nslots[r] > 0) prog.ranks[r].scratch = {nslots[r], nch};
  }
  Builder b(prog, one_lane_per_channel(nch));
  for (int ch = 0; ch < nch; ++ch) {
    auto ib = [&](int blk) { return in(blk * nch + ch); };
    auto ob = [&](int blk) { return out(blk * nch + ch); };
    auto sb = [&](int s) { return scr(s * nch + ch); };
    for (int x = 0; x < n; ++x) {
      const int hx = hs.host[x], mx = hs.m(hx);
      for (int d = 0; d < n; ++d) {
        const int hd = hs.host[d];
        if (d == x) {
          b.add(x, ch, Key{0, 0, 0, 0, 0}, Step{OpCode::Copy, -1, -1, ib(d), ob(x), false});
        } else if (hd == hx) {
          // Same host: direct, pairwise order by local distance t; the send of round t before its receive.
          const int t = (hs.local[d] - hs.local[x] + mx) % mx;
          b.add(x, ch, Key{0, t, 0, 0, 0}, send(d, ib(d)));
          b.add(d, ch, Key{0, t, 1, 0, 0}, recv(x, ob(x)));
        } else {
          const int y = relay(x, d);
          ChunkRef at_relay = ib(d);
          if (y != x) {
            const int t = (hs.local[y] - hs.local[x] + mx) % mx;
            b.add(x, ch, Key{1, t, d, 0, 0}, send(y, ib(d)));
            b.add(y, ch, Key{1, t, d, 1, 0}, recv(x, sb(slot[x][d])));
            at_relay = sb(slot[x][d]);
          }
          const int dist = (hd - hx + H) % H;
          b.add(y, ch, Key{2, dist, hs.local[d], hs.local[x], 0}, send(d, at_relay));
          b.add(d, ch, Key{2, dist, hs.local[d], hs.local[x], 1}, recv(y, ob(x)));
        }
      }
    }
  }
  b.finish();
  return prog;
}

}  // namespace chorus::algo
