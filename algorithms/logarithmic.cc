// Programs with a logarithmic number of rounds or tree depth:
//  - double binary tree all-reduce / broadcast / reduce: two binary trees, each carrying half of the data, built
//    so that (for all-reduce, exactly for 2^k - 1 ranks, mostly otherwise) the inner nodes of one are leaves of
//    the other (Sanders, Speck and Traeff, "Two-tree
//    algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 2009; the layout NCCL uses).
//    The way up (reduce) and the way down (broadcast) run in separate lanes, so slices pipeline through both.
//  - recursive halving / doubling all-reduce, reduce-scatter and all-gather for any rank count: the ranks beyond
//    the largest power of two first fold into a partner and get the result back at the end (Rabenseifner,
//    "Optimization of collective reduction operations", ICCS 2004; Thakur, Rabenseifner and Gropp, "Optimization
//    of collective communication operations in MPICH", IJHPCA 2005).
//  - Bruck all-gather and all-to-all: ceil(log2 N) rounds at distances 1, 2, 4, ... (Bruck et al., "Efficient
//    algorithms for all-to-all communications in multiport message-passing systems", IEEE TPDS 1997).
//  - PAT-style all-gather and reduce-scatter ("parallel aggregated trees", the logarithmic algorithm NCCL 2.23
//    added for one rank per node): every rank's block travels a binomial tree; all-gather at halving distances
//    straight into the output, reduce-scatter by the mirrored trees, processed deepest offset first so that a rank
//    holds at most one partial block (one scratch block per channel, whatever the rank count).
// Halving/doubling and the Bruck all-gather move one run of chunks per partner and round (one message, cut into
// slices; Bruck two where its blocks wrap around the end of the buffer), each round a phase of its own
// (Step::fence). With several channels (a channel's parts of consecutive blocks are not consecutive chunks), the
// Bruck all-to-all and PAT send one chunk per message, and a round that moves several to one peer alternates sends
// and receives, so two partners never both wait for FIFO space.
#include <bit>
#include <stdexcept>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"

namespace chorus::algo {

namespace {

// ---- Binary trees ----

struct TreeNode {
  int parent = -1;
  std::vector<int> children;
};

// In-order balanced binary tree over positions [lo, hi]; returns its root position.
int build_inorder(int lo, int hi, int parent, std::vector<TreeNode>& t) {
  if (lo > hi) return -1;
  const int mid = lo + (hi - lo) / 2;
  t[mid].parent = parent;
  const int l = build_inorder(lo, mid - 1, mid, t), r = build_inorder(mid + 1, hi, mid, t);
  if (l >= 0) t[mid].children.push_back(l);
  if (r >= 0) t[mid].children.push_back(r);
  return mid;
}

// Tree over ranks: tree[rank] with parent/children as ranks. `rooted`: position 0 is the root and positions
// 1..n-1 form its two subtrees; otherwise the in-order tree over all positions. rank = map(position).
template <class Map>
std::vector<TreeNode> make_tree(int n, bool rooted, Map map) {
  std::vector<TreeNode> pos(n);
  if (rooted) {
    const int half = (n - 1 + 1) / 2;  // positions 1..half and half+1..n-1
    const int a = build_inorder(1, half, 0, pos), b = build_inorder(half + 1, n - 1, 0, pos);
    if (a >= 0) pos[0].children.push_back(a);
    if (b >= 0) pos[0].children.push_back(b);
  } else {
    build_inorder(0, n - 1, -1, pos);
  }
  std::vector<TreeNode> ranks(n);
  for (int p = 0; p < n; ++p) {
    TreeNode& t = ranks[map(p)];
    t.parent = pos[p].parent < 0 ? -1 : map(pos[p].parent);
    for (int c : pos[p].children) t.children.push_back(map(c));
  }
  return ranks;
}

enum class TreeColl { AllReduce, Broadcast, Reduce };

Program tree_program(Coll coll, TreeColl kind, const ProgramParams& p) {
  Program prog = new_program(coll, "tree", p);
  const int n = p.nranks, nch = p.nchannels;
  // Lanes: (channel ch, tree t) x (up, down); tree t of channel ch uses connection channel 2ch+t.
  std::vector<int> lane_channel;
  for (int ch = 0; ch < nch; ++ch)
    for (int t = 0; t < 2; ++t) lane_channel.insert(lane_channel.end(), {2 * ch + t, 2 * ch + t});
  prog.nchannels = 2 * nch;
  Builder b(prog, lane_channel);
  for (int r = 0; r < n; ++r) prog.ranks[r].input = prog.ranks[r].output = {1, 2 * nch};
  for (int t = 0; t < 2; ++t) {
    std::vector<TreeNode> tree;
    if (kind == TreeColl::AllReduce) {
      tree = make_tree(n, false, [&](int pos) { return t == 0 ? pos : mod(pos + 1, n); });
    } else {
      tree = make_tree(n, true, [&](int pos) { return t == 0 ? mod(p.root + pos, n) : mod(p.root - pos, n); });
    }
    for (int ch = 0; ch < nch; ++ch) {
      const int c = 2 * ch + t, up = 2 * c, down = 2 * c + 1;
      for (int r = 0; r < n; ++r) {
        const TreeNode& node = tree[r];
        const auto& kids = node.children;
        int seq = 0;
        auto add = [&](int lane, Step s) { b.add(r, lane, Key{0, 0, 0, 0, seq++}, s); };
        if (kind == TreeColl::Broadcast) {
          if (node.parent < 0) {
            for (int k : kids) add(down, send(k, in(c)));
            add(down, copy(in(c), out(c), false));
          } else if (kids.empty()) {
            add(down, recv(node.parent, out(c)));
          } else {
            add(down, Step{OpCode::RecvCopySend, node.parent, kids[0], {}, out(c), false});
            for (size_t i = 1; i < kids.size(); ++i) add(down, send(kids[i], out(c)));
          }
          continue;
        }
        // Way up: reduce the children's partial sums into this rank's input, forward to the parent.
        const bool root = node.parent < 0;
        const bool reduce_nonroot = kind == TreeColl::Reduce && !root;
        if (kids.empty()) {
          if (root) {
            add(up, copy(in(c), out(c), true));
          } else {
            add(up, send(node.parent, in(c)));
          }
        } else {
          // Partial sums of a non-root rank of a reduce live in scratch: its output is never written.
          ChunkRef acc = reduce_nonroot ? scr(c) : out(c), src = in(c);
          for (size_t i = 0; i < kids.size(); ++i) {
            const bool last = i + 1 == kids.size();
            if (last && !root) {
              add(up, Step{OpCode::RecvReduceSend, kids[i], node.parent, src, {}, false});
            } else if (last && root && kind == TreeColl::AllReduce) {
              // The root finishes the sum and starts the way down in the same lane.
              add(up, Step{OpCode::RecvReduceCopySend, kids[i], kids[0], src, acc, true});
              for (size_t j = 1; j < kids.size(); ++j) add(up, send(kids[j], acc));
            } else {
              add(up, recv_reduce(kids[i], src, acc, last && root));
            }
            src = acc;
          }
        }
        if (kind == TreeColl::AllReduce && !root) {
          // Way down: the finished value from the parent, passed on to the children.
          if (kids.empty()) {
            add(down, recv(node.parent, out(c)));
          } else {
            add(down, Step{OpCode::RecvCopySend, node.parent, kids[0], {}, out(c), false});
            for (size_t i = 1; i < kids.size(); ++i) add(down, send(kids[i], out(c)));
          }
        }
      }
    }
  }
  if (kind == TreeColl::Reduce)
    for (int r = 0; r < n; ++r) prog.ranks[r].scratch = {1, 2 * nch};
  b.finish();
  return prog;
}

// ---- Recursive halving / doubling ----

struct Rhd {
  int n, P, R;
  explicit Rhd(int nranks) : n(nranks), P(std::bit_floor(static_cast<unsigned>(nranks))), R(nranks - P) {}
  // Index among the P participants, or -1 for a rank that folds into its partner (the even ranks below 2R).
  int idx(int r) const { return r < 2 * R ? (r % 2 == 1 ? r / 2 : -1) : r - R; }
  int rank_of(int i) const { return i < R ? 2 * i + 1 : i + R; }
  // The folded rank served by participant i, or -1.
  int extra_of(int i) const { return i < R ? 2 * i : -1; }
  // Blocks (= ranks) served by participants [lo, hi) are the consecutive blocks [first_block(lo), first_block(hi)).
  int first_block(int i) const { return i < R ? 2 * i : i + R; }
};

// Alternates the two lists of steps (a0 b0 a1 b1 ...), then appends what is left of the longer.
void interleave(std::vector<Step>& lane, const std::vector<Step>& a, const std::vector<Step>& b) {
  for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
    if (k < a.size()) lane.push_back(a[k]);
    if (k < b.size()) lane.push_back(b[k]);
  }
}

// One round of halving or doubling: its sends and receives alternated, as a phase of its own (it needs the whole
// result of the round before).
void round_phase(std::vector<Step>& lane, const std::vector<Step>& sends, const std::vector<Step>& recvs) {
  std::vector<Step> v;
  interleave(v, sends, recvs);
  append_phase(lane, v);
}

}  // namespace

Program tree_allreduce(const ProgramParams& p) { return tree_program(Coll::AllReduce, TreeColl::AllReduce, p); }
Program tree_broadcast(const ProgramParams& p) { return tree_program(Coll::Broadcast, TreeColl::Broadcast, p); }
Program tree_reduce(const ProgramParams& p) { return tree_program(Coll::Reduce, TreeColl::Reduce, p); }

Program rhd_allreduce(const ProgramParams& p) {
  Program prog = new_program(Coll::AllReduce, "rhd", p);
  const int n = p.nranks, nch = p.nchannels;
  const Rhd h(n);
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = rp.output = {1, h.P * nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      // Channel ch's data is the run of chunks ch * P .. ch * P + P - 1; part j of it is chunk ch * P + j. Each
      // round moves one run each way.
      const int base = ch * h.P;
      const int i = h.idx(r);
      if (n == 1) {
        st.push_back(copy(in(base, h.P), out(base, h.P), true));
      } else if (i < 0) {
        st.push_back(send(r + 1, in(base, h.P)));
        append_phase(st, {recv(r + 1, out(base, h.P))});  // it comes back after the partner took the whole input
      } else {
        const int e = h.extra_of(i);
        // Where the partial sums of the current range are: the input until the first reduction writes the output.
        bool reduced = false;
        if (e >= 0) {
          st.push_back(recv_reduce(e, in(base, h.P), out(base, h.P), false));
          reduced = true;
        }
        auto cur = [&](int j, int k) { return reduced ? out(base + j, k) : in(base + j, k); };
        int lo = 0, hi = h.P;
        for (int mask = h.P / 2; mask >= 1; mask /= 2) {
          const int partner = h.rank_of(i ^ mask), mid = (lo + hi) / 2, half = (hi - lo) / 2;
          const bool lower = (i & mask) == 0;
          const int keep_lo = lower ? lo : mid, send_lo = lower ? mid : lo;
          round_phase(st, {send(partner, cur(send_lo, half))},
                      {recv_reduce(partner, cur(keep_lo, half), out(base + keep_lo, half), mask == 1)});
          reduced = true;
          lo = keep_lo;
          hi = keep_lo + half;
        }
        for (int mask = 1; mask < h.P; mask *= 2) {
          const int partner = h.rank_of(i ^ mask), size = hi - lo;
          const int other_lo = (i & mask) == 0 ? hi : lo - size;
          round_phase(st, {send(partner, out(base + lo, size))}, {recv(partner, out(base + other_lo, size))});
          lo = std::min(lo, other_lo);
          hi = lo + 2 * size;
        }
        if (e >= 0) append_phase(st, {send(e, out(base, h.P))});
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program rhd_reduce_scatter(const ProgramParams& p) {
  Program prog = new_program(Coll::ReduceScatter, "rhd", p);
  const int n = p.nranks, nch = p.nchannels;
  const Rhd h(n);
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {1, nch};
    const int i = h.idx(r);
    if (i >= 0 && n > 1) rp.scratch = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      auto ib = [&](int b) { return in(b * nch + ch); };
      auto sb = [&](int b) { return scr(b * nch + ch); };
      if (n == 1) {
        st.push_back(copy(ib(0), out(ch), true));
      } else if (i < 0) {
        st = block_runs(0, n, nch, ch, [&](int c, int k) { return send(r + 1, in(c, k)); });
        append_phase(st, {recv(r + 1, out(ch))});
      } else {
        // Partial sums of the blocks still to reduce: the input until the first reduction writes the scratch.
        bool in_scr = false;
        const int e = h.extra_of(i);
        if (e >= 0) {
          st = block_runs(0, n, nch, ch, [&](int c, int k) { return recv_reduce(e, in(c, k), scr(c, k), false); });
          in_scr = true;
        }
        auto cur = [&](int c, int k) { return in_scr ? scr(c, k) : in(c, k); };
        int lo = 0, hi = h.P;
        for (int mask = h.P / 2; mask >= 1; mask /= 2) {
          const int partner = h.rank_of(i ^ mask), mid = (lo + hi) / 2;
          const bool lower = (i & mask) == 0;
          const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
          const int give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
          // The last round finishes the blocks one by one (below): its messages carry one block each.
          const std::vector<Step> sends = block_runs(
              h.first_block(give_lo), h.first_block(give_hi), nch, ch,
              [&](int c, int k) { return send(partner, cur(c, k)); }, mask == 1);
          std::vector<Step> recvs;
          if (mask > 1) {
            recvs = block_runs(h.first_block(keep_lo), h.first_block(keep_hi), nch, ch,
                               [&](int c, int k) { return recv_reduce(partner, cur(c, k), scr(c, k), false); });
          } else {
            // The last round finishes this participant's blocks: its own into the output, its folded rank's into
            // the scratch (sent on below).
            for (int b = h.first_block(keep_lo); b < h.first_block(keep_hi); ++b)
              recvs.push_back(recv_reduce(partner, in_scr ? sb(b) : ib(b), b == r ? out(ch) : sb(b), true));
          }
          round_phase(st, sends, recvs);
          in_scr = true;
          lo = keep_lo;
          hi = keep_hi;
        }
        if (e >= 0) append_phase(st, {send(e, sb(e))});
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program rhd_allgather(const ProgramParams& p) {
  Program prog = new_program(Coll::AllGather, "rhd", p);
  const int n = p.nranks, nch = p.nchannels;
  const Rhd h(n);
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    const int i = h.idx(r);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      auto ob = [&](int b) { return out(b * nch + ch); };
      // Every block but `skip`, in two runs around it.
      auto all_but = [&](int skip, auto make) {
        std::vector<Step> v = block_runs(0, skip, nch, ch, make);
        for (const Step& s : block_runs(skip + 1, n, nch, ch, make)) v.push_back(s);
        return v;
      };
      if (i < 0) {
        st.push_back(send(r + 1, in(ch)));
        st.push_back(copy(in(ch), ob(r), false));
        // The rest comes back only after the partner took the whole input: a phase of its own.
        append_phase(st, all_but(r, [&](int c, int k) { return recv(r + 1, out(c, k)); }));
      } else {
        st.push_back(copy(in(ch), ob(r), false));
        const int e = h.extra_of(i);
        if (e >= 0) st.push_back(recv(e, ob(e)));
        int lo = i, hi = i + 1;
        for (int mask = 1; mask < h.P; mask *= 2) {
          const int partner = h.rank_of(i ^ mask), size = hi - lo;
          const int other_lo = (i & mask) == 0 ? hi : lo - size;
          round_phase(st,
                      block_runs(h.first_block(lo), h.first_block(hi), nch, ch,
                                 [&](int c, int k) { return send(partner, out(c, k)); }),
                      block_runs(h.first_block(other_lo), h.first_block(other_lo + size), nch, ch,
                                 [&](int c, int k) { return recv(partner, out(c, k)); }));
          lo = std::min(lo, other_lo);
          hi = lo + 2 * size;
        }
        if (e >= 0) append_phase(st, all_but(e, [&](int c, int k) { return send(e, out(c, k)); }));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

// ---- Bruck ----

Program bruck_allgather(const ProgramParams& p) {
  Program prog = new_program(Coll::AllGather, "bruck", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      lane.steps.push_back(copy(in(ch), out(r * nch + ch), false));
      // Blocks b .. b + cnt - 1 (mod n): a run up to the end of the buffer and one from its start.
      auto wrapped = [&](int b, int cnt, auto make) {
        b = mod(b, n);
        std::vector<Step> v = block_runs(b, std::min(b + cnt, n), nch, ch, make);
        for (const Step& s : block_runs(0, b + cnt - n, nch, ch, make)) v.push_back(s);
        return v;
      };
      // After round k, rank r holds blocks r .. r + 2^(k+1) - 1: it sends what it has to r - D and receives the
      // next D blocks from r + D, each round a phase of its own.
      for (int d = 1; d < n; d *= 2) {
        const int cnt = std::min(d, n - d), to = mod(r - d, n), from = mod(r + d, n);
        round_phase(lane.steps, wrapped(r, cnt, [&](int c, int k) { return send(to, out(c, k)); }),
                    wrapped(r + d, cnt, [&](int c, int k) { return recv(from, out(c, k)); }));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

// Bruck et al. 1997, as MPICH runs it for short messages (Thakur, Rabenseifner and Gropp 2005): ceil(log2 N)
// rounds, one message each. Slot i of rank r holds a block bound for rank r + i; in the round at distance d every
// slot with bit d set moves d ranks on, so the block from rank s for rank s + i arrives after the rounds of i's
// bits. Those slots are not contiguous, so each round packs them into one run of scratch (copies), sends it as one
// message, and unpacks what it receives: a slot's first move reads the input, its last writes the output.
// One lane: a block is one chunk (parts 1), so packed runs stay contiguous whatever the channel count; Bruck is for
// small blocks, where one message per round matters more than channels.
// Scratch: W (slots, slot i at block n-1-i, so that a round's slots, packed in descending i, are ascending
// blocks), then the pack and receive runs of `half` blocks each.
Program bruck_alltoall(const ProgramParams& p) {
  Program prog = new_program(Coll::AllToAll, "bruck", p);
  const int n = p.nranks;
  int half = 0;  // most slots one round moves
  for (int d = 1; d < n; d *= 2) {
    int moved = 0;
    for (int i = 1; i < n; ++i) moved += (i & d) != 0;
    half = std::max(half, moved);
  }
  const int pack0 = n, recv0 = n + half;
  auto w = [&](int i) { return n - 1 - i; };
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = rp.output = {n, 1};
    if (n > 1) rp.scratch = {n + 2 * half, 1};
    Lane lane{0, {}};
    lane.steps.push_back(copy(in(r), out(r), false));
    for (int d = 1; d < n; d *= 2) {
      // The slots that move, in descending i, as runs of the source (pack) and of the destination (unpack). The
      // slots with bit d set come in runs [a, a + d) for a = d, 3d, 5d...; in one run only i = a moves for the
      // first time and, when a == d, every slot moves for the last time.
      std::vector<ChunkRef> sources, dests;
      const int top_a = ((n - 1 - d) / (2 * d)) * 2 * d + d;
      for (int a = top_a; a >= d; a -= 2 * d) {
        const int end = std::min(a + d, n);              // slots [a, end)
        add_run(sources, scr(w(end - 1), end - 1 - a));  // slots end-1 .. a+1: moved before
        add_run(sources, in(mod(r + a, n)));             // slot a: its first move
        if (a == d) {  // last move: slot i goes to output block r - i, ascending as i descends (may wrap)
          for (int i = end - 1; i >= a; --i) add_run(dests, out(mod(r - i, n)));
        } else {
          add_run(dests, scr(w(end - 1), end - a));
        }
      }
      // One message: packed unless the slots already form one run.
      std::vector<Step> pack, unpack;
      const ChunkRef send_src = packed_run(sources, pack0, false, pack);
      const ChunkRef recv_dst = packed_run(dests, recv0, true, unpack, !overlaps(dests[0], send_src));
      append_phase(lane.steps, pack);
      append_phase(lane.steps, {send(mod(r + d, n), send_src), recv(mod(r - d, n), recv_dst)});
      append_phase(lane.steps, unpack);
    }
    rp.lanes.push_back(std::move(lane));
  }
  return prog;
}

// ---- PAT-style ----

Program pat_allgather(const ProgramParams& p) {
  Program prog = new_program(Coll::AllGather, "pat", p);
  const int n = p.nranks, nch = p.nchannels;
  const int top = n > 1 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))) / 2 : 0;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ob = [&](int b) { return out(mod(b, n) * nch + ch); };
      lane.steps.push_back(copy(in(ch), ob(r), false));
      // Rank r holds the blocks at offsets `held` behind it; at distance d it passes each on to r + d (while the
      // offset stays below n) and receives the same offsets from r - d. Distances halve: n/2, n/4, ..., 1.
      std::vector<int> held = {0};
      for (int d = top; d >= 1; d /= 2) {
        std::vector<Step> sends, recvs;
        std::vector<int> got;
        for (int o : held) {
          if (o + d >= n) continue;
          sends.push_back(send(mod(r + d, n), ob(r - o)));
          recvs.push_back(recv(mod(r - d, n), ob(r - o - d)));
          got.push_back(o + d);
        }
        interleave(lane.steps, sends, recvs);
        held.insert(held.end(), got.begin(), got.end());
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program pat_reduce_scatter(const ProgramParams& p) {
  Program prog = new_program(Coll::ReduceScatter, "pat", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {1, nch};
    if (n > 2) rp.scratch = {1, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      auto ib = [&](int b) { return in(mod(b, n) * nch + ch); };
      if (n == 1) {
        st.push_back(copy(ib(0), out(ch), true));
        rp.lanes.push_back(std::move(lane));
        continue;
      }
      // Block b's partial sums flow up a binomial tree rooted at rank b: the rank at offset o = r - b has the
      // children at offsets o + 2^j for 2^j below o's lowest set bit and the parent at o - lowbit(o). Offsets are
      // processed from n-1 down to 0 on every rank, so children always finish a block before their parent needs
      // it and a rank accumulates one block at a time.
      for (int o = n - 1; o >= 0; --o) {
        const int b = r - o, low = o == 0 ? n : (o & -o);
        std::vector<int> kids;
        for (int d = 1; d < low && o + d < n; d *= 2) kids.push_back(mod(r + d, n));
        const int parent = o == 0 ? -1 : mod(r - low, n);
        ChunkRef src = ib(b);
        const ChunkRef acc = o == 0 ? out(ch) : scr(ch);
        if (kids.empty()) {
          st.push_back(send(parent, src));  // o > 0 here: the root (o == 0) has children when n > 1
          continue;
        }
        for (size_t k = 0; k < kids.size(); ++k) {
          const bool last = k + 1 == kids.size();
          if (last && parent >= 0) {
            st.push_back(Step{OpCode::RecvReduceSend, kids[k], parent, src, {}, false});
          } else {
            st.push_back(recv_reduce(kids[k], src, acc, last));
            src = acc;
          }
        }
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

}  // namespace chorus::algo
