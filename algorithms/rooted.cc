// Gather and scatter programs (block r of the root's buffer belongs to rank r):
//  - linear: the root exchanges one message with every other rank, directly. N - 1 messages pass through the
//    root's links, each block once: the choice for large blocks, where the root's link is the limit anyway.
//  - binomial: the minimum-spanning-tree gather and scatter (Chan, Heimlich, Purkayastha and van de Geijn,
//    "Collective communication: theory, practice, and experience", CCPE 2007). Ranks are numbered by offset
//    o = (rank - root) mod N; the rank at offset o > 0 has the parent o - lowbit(o) and the children o + 2^k for
//    every 2^k below lowbit(o) (the root: every 2^k < N). Its subtree is the offsets [o, o + lowbit(o)) below N.
//    A gather sends each subtree's blocks up as one message, a scatter sends them down: ceil(log2 N) rounds
//    instead of N - 1, for the price of forwarding blocks through intermediate ranks.
// An intermediate rank keeps its subtree in scratch, indexed by offset from its own, so a subtree is one run there.
// In the root's buffer a subtree is blocks (root + o ...) mod N: it wraps around the buffer's end at most once,
// so a child of the root sends (or receives) it as two messages where it wraps. A forwarded subtree was written by
// several steps through other runs, so forwarding starts a phase (Step::fence).
#include <algorithm>
#include <stdexcept>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"

namespace chorus::algo {
namespace {

int lowbit(int o) { return o & -o; }

// Offsets [o, o + size) of the subtree at offset o (o > 0), or of the whole tree (o == 0).
int subtree_size(int o, int n) { return o == 0 ? n : std::min(lowbit(o), n - o); }

// Children offsets of offset o, smallest subtree first.
std::vector<int> children(int o, int n) {
  std::vector<int> kids;
  const int limit = o == 0 ? n : lowbit(o);
  for (int d = 1; d < limit && o + d < n; d *= 2) kids.push_back(o + d);
  return kids;
}

// Steps over the root's blocks of offsets [lo, lo + cnt): one run up to the end of the buffer and one from its
// start (or one step per block with several channels). `make(first chunk, chunks)`.
template <class Make>
std::vector<Step> root_runs(int root, int lo, int cnt, int n, int nch, int ch, Make make) {
  const int b = mod(root + lo, n);
  std::vector<Step> v = block_runs(b, std::min(b + cnt, n), nch, ch, make);
  for (const Step& s : block_runs(0, b + cnt - n, nch, ch, make)) v.push_back(s);
  return v;
}

// The same cut of the child's scratch (offsets relative to the child): where root_runs splits, it splits.
template <class Make>
std::vector<Step> child_runs(int root, int o, int cnt, int n, int nch, int ch, Make make) {
  const int b = mod(root + o, n), first = std::min(cnt, n - b);
  std::vector<Step> v = block_runs(0, first, nch, ch, make);
  for (const Step& s : block_runs(first, cnt, nch, ch, make)) v.push_back(s);
  return v;
}

void check_root(const ProgramParams& p) {
  if (p.root < 0 || p.root >= p.nranks) throw std::invalid_argument("root out of range");
}

}  // namespace

Program linear_gather(const ProgramParams& p) {
  check_root(p);
  Program prog = new_program(Coll::Gather, "linear", p);
  const int n = p.nranks, nch = p.nchannels, root = p.root;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      if (r != root) {
        lane.steps.push_back(send(root, in(ch)));
      } else {
        lane.steps.push_back(copy(in(ch), out(root * nch + ch), false));
        for (int o = 1; o < n; ++o) {
          const int q = mod(root + o, n);
          lane.steps.push_back(recv(q, out(q * nch + ch)));
        }
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program linear_scatter(const ProgramParams& p) {
  check_root(p);
  Program prog = new_program(Coll::Scatter, "linear", p);
  const int n = p.nranks, nch = p.nchannels, root = p.root;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {1, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      if (r != root) {
        lane.steps.push_back(recv(root, out(ch)));
      } else {
        for (int o = 1; o < n; ++o) {
          const int q = mod(root + o, n);
          lane.steps.push_back(send(q, in(q * nch + ch)));
        }
        lane.steps.push_back(copy(in(root * nch + ch), out(ch), false));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program binomial_gather(const ProgramParams& p) {
  check_root(p);
  Program prog = new_program(Coll::Gather, "binomial", p);
  const int n = p.nranks, nch = p.nchannels, root = p.root;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    const int o = mod(r - root, n), size = subtree_size(o, n);
    const std::vector<int> kids = children(o, n);
    rp.input = {1, nch};
    rp.output = {n, nch};
    if (o != 0 && !kids.empty()) rp.scratch = {size, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      if (o == 0) {
        st.push_back(copy(in(ch), out(root * nch + ch), false));
        for (int c : kids)
          for (const Step& s : root_runs(root, c, subtree_size(c, n), n, nch, ch,
                                         [&](int k, int cnt) { return recv(mod(root + c, n), out(k, cnt)); }))
            st.push_back(s);
      } else {
        const int parent = mod(root + o - lowbit(o), n);
        auto to_parent = [&](auto make) {
          return o == lowbit(o) ? child_runs(root, o, size, n, nch, ch, make) : block_runs(0, size, nch, ch, make);
        };
        if (kids.empty()) {
          st.push_back(send(parent, in(ch)));  // a subtree of one block: no wrap
        } else {
          st.push_back(copy(in(ch), scr(ch), false));
          for (int c : kids)
            for (const Step& s : block_runs(c - o, c - o + subtree_size(c, n), nch, ch,
                                            [&](int k, int cnt) { return recv(mod(root + c, n), scr(k, cnt)); }))
              st.push_back(s);
          append_phase(st, to_parent([&](int k, int cnt) { return send(parent, scr(k, cnt)); }));
        }
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program binomial_scatter(const ProgramParams& p) {
  check_root(p);
  Program prog = new_program(Coll::Scatter, "binomial", p);
  const int n = p.nranks, nch = p.nchannels, root = p.root;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    const int o = mod(r - root, n), size = subtree_size(o, n);
    std::vector<int> kids = children(o, n);
    std::reverse(kids.begin(), kids.end());  // the largest subtree first: it has the longest way to go
    rp.input = {n, nch};
    rp.output = {1, nch};
    if (o != 0 && !kids.empty()) rp.scratch = {size, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto& st = lane.steps;
      if (o == 0) {
        for (int c : kids)
          for (const Step& s : root_runs(root, c, subtree_size(c, n), n, nch, ch,
                                         [&](int k, int cnt) { return send(mod(root + c, n), in(k, cnt)); }))
            st.push_back(s);
        st.push_back(copy(in(root * nch + ch), out(ch), false));
      } else {
        const int parent = mod(root + o - lowbit(o), n);
        if (kids.empty()) {
          st.push_back(recv(parent, out(ch)));
        } else {
          auto from_parent = [&](int k, int cnt) { return recv(parent, scr(k, cnt)); };
          st = o == lowbit(o) ? child_runs(root, o, size, n, nch, ch, from_parent)
                              : block_runs(0, size, nch, ch, from_parent);
          std::vector<Step> down;
          for (int c : kids)
            for (const Step& s : block_runs(c - o, c - o + subtree_size(c, n), nch, ch,
                                            [&](int k, int cnt) { return send(mod(root + c, n), scr(k, cnt)); }))
              down.push_back(s);
          down.push_back(copy(scr(ch), out(ch), false));
          append_phase(st, down);
        }
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

}  // namespace chorus::algo
