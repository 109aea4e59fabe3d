// Helpers for writing programs: step constructors, and a builder for programs written as sets of chains instead
// of per-rank step lists.
//
// A generator adds steps to (rank, lane) with a schedule key; finish() sorts every lane's steps by key (stable)
// and writes the lanes. Two ranks that exchange several messages on one channel must order them the same way
// (the matching rule), which holds when both sides derive the key of a message from the same quantities (round,
// sub-chunk, hop). The verifier proves each generated program; the builder only removes bookkeeping.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "algorithms/program.h"

namespace chorus::algo {

// Step and chunk constructors shared by the program generators.
inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline ChunkRef in(int c, int count = 1) { return {BufKind::Input, c, count}; }
inline ChunkRef out(int c, int count = 1) { return {BufKind::Output, c, count}; }
inline ChunkRef scr(int c, int count = 1) { return {BufKind::Scratch, c, count}; }
inline Step send(int peer, ChunkRef src) { return Step{OpCode::Send, -1, peer, src, {}, false}; }
inline Step recv(int peer, ChunkRef dst, bool final = false) { return Step{OpCode::Recv, peer, -1, {}, dst, final}; }
inline Step copy(ChunkRef src, ChunkRef dst, bool final) { return Step{OpCode::Copy, -1, -1, src, dst, final}; }
inline Step recv_reduce(int peer, ChunkRef src, ChunkRef dst, bool final) {
  return Step{OpCode::RecvReduce, peer, -1, src, dst, final};
}

// Steps over the blocks [b0, b1) of a buffer whose chunk b * nch + ch is channel ch's part of block b:
// `make(first chunk, chunks)` once for the whole run with one channel (consecutive blocks are consecutive chunks)
// unless `per_block`, else once per block.
template <class Make>
inline std::vector<Step> block_runs(int b0, int b1, int nch, int ch, Make make, bool per_block = false) {
  std::vector<Step> v;
  if (b1 <= b0) return v;
  if (nch == 1 && !per_block) {
    v.push_back(make(b0, b1 - b0));
  } else {
    for (int b = b0; b < b1; ++b) v.push_back(make(b * nch + ch, 1));
  }
  return v;
}

// Appends run `r` (nothing if empty) to `runs`, merged into the last run when it continues it in the same buffer:
// the pieces of a packed message, in message order.
inline void add_run(std::vector<ChunkRef>& runs, ChunkRef r) {
  if (r.count <= 0) return;
  if (!runs.empty() && runs.back().buf == r.buf && runs.back().chunk + runs.back().count == r.chunk)
    runs.back().count += r.count;
  else
    runs.push_back(r);
}

// One message made of the runs `pieces` (in order): the run it is sent from or received into is the only piece
// itself, or else `staging` (a scratch run of the pieces' total length, which the caller reserved), with copies
// between staging and the pieces appended to `copies` (pack before a send: piece -> staging; unpack after a
// receive: staging -> piece). `direct_ok` false forces staging (a receive that must not overwrite what the same
// phase sends).
inline ChunkRef packed_run(const std::vector<ChunkRef>& pieces, int staging, bool unpack, std::vector<Step>& copies,
                           bool direct_ok = true) {
  if (pieces.size() == 1 && direct_ok) return pieces[0];
  int at = staging;
  for (const ChunkRef& p : pieces) {
    copies.push_back(unpack ? copy(scr(at, p.count), p, false) : copy(p, scr(at, p.count), false));
    at += p.count;
  }
  return scr(staging, at - staging);
}

// Appends the steps of `v`, the first starting a phase (Step::fence).
inline void append_phase(std::vector<Step>& lane, const std::vector<Step>& v) {
  const size_t first = lane.size();
  lane.insert(lane.end(), v.begin(), v.end());
  if (lane.size() > first) lane[first].fence = true;
}

// Lexicographic schedule position of a step within its lane.
using Key = std::array<int32_t, 5>;

class Builder {
 public:
  // `lanes_per_rank` lanes per rank; lane l runs on channel `lane_channel[l]`.
  Builder(Program& prog, std::vector<int> lane_channel) : prog_(prog), lane_channel_(std::move(lane_channel)) {
    items_.resize(static_cast<size_t>(prog.nranks) * lane_channel_.size());
  }

  void add(int rank, int lane, const Key& key, const Step& step) {
    items_.at(static_cast<size_t>(rank) * lane_channel_.size() + static_cast<size_t>(lane)).push_back({key, step});
  }

  // Chain reduction along `path`: path[0] sends its `src`, every middle rank adds its own and forwards, the last
  // rank adds its own and writes `dst` (`final` marks the finished value). Hop i of the chain has key `key` with
  // its last component increased by i. `src_of(rank)` gives each rank's operand.
  template <class SrcOf>
  void chain_reduce(int lane, Key key, const std::vector<int>& path, SrcOf src_of, ChunkRef dst, bool final) {
    const size_t n = path.size();
    if (n == 1) {
      add(path[0], lane, key, Step{OpCode::Copy, -1, -1, src_of(path[0]), dst, final});
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      const int r = path[i];
      Step s;
      if (i == 0) {
        s = Step{OpCode::Send, -1, path[1], src_of(r), {}, false};
      } else if (i + 1 < n) {
        s = Step{OpCode::RecvReduceSend, path[i - 1], path[i + 1], src_of(r), {}, false};
      } else {
        s = Step{OpCode::RecvReduce, path[i - 1], -1, src_of(r), dst, final};
      }
      add(r, lane, key, s);
      ++key[4];
    }
  }

  // Chain broadcast along `path`: path[0] sends `src`, every other rank writes the value to `dst_of(rank)` and
  // forwards it to the next. Keys as for chain_reduce.
  template <class DstOf>
  void chain_bcast(int lane, Key key, const std::vector<int>& path, ChunkRef src, DstOf dst_of) {
    const size_t n = path.size();
    for (size_t i = 0; i < n; ++i) {
      const int r = path[i];
      if (i == 0) {
        if (n > 1) add(r, lane, key, Step{OpCode::Send, -1, path[1], src, {}, false});
      } else if (i + 1 < n) {
        add(r, lane, key, Step{OpCode::RecvCopySend, path[i - 1], path[i + 1], {}, dst_of(r), false});
      } else {
        add(r, lane, key, Step{OpCode::Recv, path[i - 1], -1, {}, dst_of(r), false});
      }
      ++key[4];
    }
  }

  // Sorts and writes the lanes of every rank (lanes without steps are dropped). `fence_phases`: key component 0
  // is the phase: the first step of each phase in a lane starts a phase (Step::fence), for programs whose phases
  // read runs of chunks that the phase before wrote through other runs.
  void finish(bool fence_phases = false) {
    const size_t nl = lane_channel_.size();
    for (int r = 0; r < prog_.nranks; ++r) {
      for (size_t l = 0; l < nl; ++l) {
        auto& v = items_[static_cast<size_t>(r) * nl + l];
        if (v.empty()) continue;
        std::stable_sort(v.begin(), v.end(), [](const Item& a, const Item& b) { return a.key < b.key; });
        Lane lane{lane_channel_[l], {}};
        lane.steps.reserve(v.size());
        for (size_t i = 0; i < v.size(); ++i) {
          lane.steps.push_back(v[i].step);
          if (fence_phases && i > 0 && v[i].key[0] != v[i - 1].key[0]) lane.steps.back().fence = true;
        }
        prog_.ranks[r].lanes.push_back(std::move(lane));
        v.clear();
        v.shrink_to_fit();
      }
    }
  }

 private:
  struct Item {
    Key key;
    Step step;
  };
  Program& prog_;
  std::vector<int> lane_channel_;
  std::vector<std::vector<Item>> items_;
};

}  // namespace chorus::algo
