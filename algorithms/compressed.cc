// Compressed programs (docs/compression.md): the same IR with StepCode bits on the steps whose messages carry
// codes. Three schedules:
//  - qonce: quantize once. Reduce-scatter as a direct exchange (every rank sends Q(its chunk p) straight to owner
//    p); the owner decodes and accumulates in fp32, quantizes its result once and sends those codes to everyone;
//    the owner keeps D(its own codes), so every rank ends with the same bits. Each contribution is quantized at
//    most twice (ZeRO++, Wang et al. 2023, quantized gradient communication; THC, Li et al. 2024, homomorphic
//    compression with one re-quantization).
//    On several hosts the all-reduce is two-level: an exact (fp32) reduce-scatter inside each host, the direct
//    exchange above among one owner per host, an all-gather inside each host; each host's partial is quantized
//    once going out and the result once coming back. qonce-flat is the one-level form on any topology (error
//    feedback and the majority vote use it: their residuals and votes are per rank).
//  - ring: the ring programs with every message coded, so partial sums are re-quantized at every hop (up to N-1
//    times): the baseline the literature compares against.
//  - hier: the hierarchical programs with only the messages between hosts coded (the slow hop).
#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"

namespace chorus::algo {

namespace {

Step coded(Step s, uint8_t bits) {
  s.code = bits;
  return s;
}

// Marks every message between ranks r and q with coded(r, q) (symmetric) as coded at both ends. In a collective
// without a reduction the data must be quantized where it starts, so that every rank holds the same bits: copies
// of the input become coded copies (dst = D(Q(input))) on ranks that send coded messages.
template <typename Pred>
Program code_messages(Program prog, const char* name, Pred coded_pair) {
  prog.algorithm = name;
  prog.compressed = true;
  const bool reduction = prog.coll == Coll::AllReduce || prog.coll == Coll::ReduceScatter;
  for (int r = 0; r < prog.nranks; ++r) {
    bool sends_coded = false;
    for (Lane& lane : prog.ranks[r].lanes)
      for (Step& s : lane.steps) {
        if (op_receives(s.op) && coded_pair(r, s.recv_peer)) s.code |= kCodedIn;
        if (op_sends(s.op) && coded_pair(r, s.send_peer)) {
          s.code |= kCodedOut;
          sends_coded = true;
        }
      }
    if (!sends_coded) continue;
    if (prog.coll == Coll::AllReduce) {
      // A result this rank sends coded (the head of a broadcast chain) is what the receivers decode; the rank
      // keeps the same: after its last coded send, the chunk goes through the codec in place, with the same key.
      for (Lane& lane : prog.ranks[r].lanes) {
        std::vector<std::pair<size_t, ChunkRef>> last;  // (index of the last coded send, chunk)
        for (size_t i = 0; i < lane.steps.size(); ++i) {
          const Step& s = lane.steps[i];
          if (s.op != OpCode::Send || !(s.code & kCodedOut) || s.src.buf == BufKind::Input) continue;
          // A partial sum sent to be reduced elsewhere is overwritten later by the result (a receive into a run
          // that holds the chunk): nothing to keep.
          const bool overwritten =
              std::any_of(lane.steps.begin() + static_cast<long>(i) + 1, lane.steps.end(), [&](const Step& t) {
                return (t.op == OpCode::Recv || t.op == OpCode::RecvCopySend) && overlaps(t.dst, s.src);
              });
          if (overwritten) continue;
          auto it = std::find_if(last.begin(), last.end(), [&](const auto& e) { return e.second == s.src; });
          if (it == last.end()) {
            last.push_back({i, s.src});
          } else {
            it->first = i;
          }
        }
        std::sort(last.begin(), last.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        for (const auto& [i, ref] : last)
          lane.steps.insert(lane.steps.begin() + static_cast<long>(i) + 1, coded(copy(ref, ref, false), kCodedOut));
      }
    }
    if (reduction) continue;
    for (Lane& lane : prog.ranks[r].lanes)
      for (Step& s : lane.steps)
        if (s.op == OpCode::Copy && s.src.buf == BufKind::Input) s.code |= kCodedOut;
  }
  return prog;
}

// Single rank: nothing to exchange, but the result is what a compressed call returns everywhere: D(Q(input))
// (a sign vote of one rank is its signs), with the residual updated.
void copy_only(Program& prog, int nch) {
  RankProgram& rp = prog.ranks[0];
  rp.input = {1, nch};
  rp.output = {1, nch};
  for (int ch = 0; ch < nch; ++ch)
    rp.lanes.push_back(
        Lane{ch, {coded(copy(in(ch), out(ch), prog.coll != Coll::AllGather), kCodedOut | kErrorFeedback)}});
}

// An empty quantize-once reduction program; for a single rank already complete (copy_only).
Program new_compressed(Coll coll, const ProgramParams& p) {
  Program prog = new_program(coll, "qonce", p);
  prog.compressed = true;
  if (p.nranks == 1) copy_only(prog, p.nchannels);
  return prog;
}

}  // namespace

Program qonce_flat_allreduce(const ProgramParams& p) {
  Program prog = new_compressed(Coll::AllReduce, p);
  const int n = p.nranks, nch = p.nchannels;
  if (n == 1) return prog;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, n * nch};
    rp.output = {1, n * nch};
    rp.scratch = {1, n * nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto c = [&](int owner) { return mod(owner, n) * nch + ch; };
      // Reduce-scatter as a direct exchange: Q(chunk r+t) to its owner, in the order t = 1..n-1 (owner r hears
      // from r-1, r-2, ...), with error feedback on the rank's own input.
      for (int t = 1; t < n; ++t)
        lane.steps.push_back(coded(send(mod(r + t, n), in(c(r + t))), kCodedOut | kErrorFeedback));
      // The owner accumulates the decoded contributions in fp32, its own included (quantized like the others, so a
      // sign vote counts every rank's sign and the error feedback covers the whole input).
      lane.steps.push_back(coded(copy(in(c(r)), scr(c(r)), false), kCodedOut | kErrorFeedback));
      for (int t = 1; t < n; ++t)
        lane.steps.push_back(coded(recv_reduce(mod(r - t, n), scr(c(r)), scr(c(r)), t == n - 1), kCodedIn));
      // Quantize the result once (owner error feedback folded in first), keep D(codes), send the same codes to
      // everyone; receivers decode.
      lane.steps.push_back(coded(copy(scr(c(r)), out(c(r)), false), kCodedOut | kErrorFeedback));
      for (int t = 1; t < n; ++t) lane.steps.push_back(coded(send(mod(r + t, n), scr(c(r))), kCodedOut));
      for (int t = 1; t < n; ++t) lane.steps.push_back(coded(recv(mod(r - t, n), out(c(r - t))), kCodedIn));
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program qonce_allreduce(const ProgramParams& p) {
  const std::vector<int>& h = p.host_of_rank;
  if (p.nranks == 1 || h.empty() || std::all_of(h.begin(), h.end(), [&](int x) { return x == h.front(); }))
    return qonce_flat_allreduce(p);
  // Several hosts: reduce exactly inside each host first (fp32 over shared memory), so that one coded partial per
  // host and part crosses the network instead of one per rank; among hosts the direct exchange quantizes each
  // host's partial once and the owner's result once.
  Program prog = code_messages(hier_allreduce_direct(p), "qonce", [&h](int a, int b) { return h[a] != h[b]; });
  return prog;
}

Program qonce_reduce_scatter(const ProgramParams& p) {
  Program prog = new_compressed(Coll::ReduceScatter, p);
  const int n = p.nranks, nch = p.nchannels;
  if (n == 1) return prog;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {1, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ib = [&](int block) { return in(mod(block, n) * nch + ch); };
      for (int t = 1; t < n; ++t)
        lane.steps.push_back(coded(send(mod(r + t, n), ib(r + t)), kCodedOut | kErrorFeedback));
      // The result stays in fp32: one quantization per contribution, the own block's included.
      lane.steps.push_back(coded(copy(ib(r), out(ch), false), kCodedOut | kErrorFeedback));
      for (int t = 1; t < n; ++t)
        lane.steps.push_back(coded(recv_reduce(mod(r - t, n), out(ch), out(ch), t == n - 1), kCodedIn));
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program qonce_allgather(const ProgramParams& p) {
  Program prog = new_program(Coll::AllGather, "qonce", p);
  prog.compressed = true;
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ob = [&](int block) { return out(mod(block, n) * nch + ch); };
      for (int t = 1; t < n; ++t) lane.steps.push_back(coded(send(mod(r + t, n), in(ch)), kCodedOut));
      // The own block last: in place it is the input, which the sends above still read.
      lane.steps.push_back(coded(copy(in(ch), ob(r), false), kCodedOut));
      for (int t = 1; t < n; ++t) lane.steps.push_back(coded(recv(mod(r - t, n), ob(r - t)), kCodedIn));
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program coded_ring_allreduce(const ProgramParams& p) {
  return code_messages(ring_allreduce(p), "ring", [](int, int) { return true; });
}
Program coded_ring_reduce_scatter(const ProgramParams& p) {
  return code_messages(ring_reduce_scatter(p), "ring", [](int, int) { return true; });
}
Program coded_ring_allgather(const ProgramParams& p) {
  return code_messages(ring_allgather(p), "ring", [](int, int) { return true; });
}

namespace {
template <typename Gen>
Program coded_between_hosts(const ProgramParams& p, Gen gen) {
  // One host (no host map): nothing crosses a host boundary, so nothing is coded.
  const std::vector<int>& h = p.host_of_rank;
  return code_messages(gen(p), "hier", [&h](int a, int b) { return !h.empty() && h[a] != h[b]; });
}
}  // namespace

Program coded_hier_allreduce(const ProgramParams& p) { return coded_between_hosts(p, hier_allreduce); }
Program coded_hier_reduce_scatter(const ProgramParams& p) {
  return coded_between_hosts(p, hier_reduce_scatter_single_chunks);
}

}  // namespace chorus::algo
