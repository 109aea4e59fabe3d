// Ring and chain programs. Ring all-reduce is reduce-scatter then all-gather around a ring, 2(N-1) steps per
// channel, each rank sending (N-1)/N of the data twice: bandwidth-optimal (Patarasuk and Yuan, "Bandwidth optimal
// all-reduce algorithms for clusters of workstations", JPDC 2009). Broadcast and reduce are pipelined chains;
// pipelining comes from the executor's slicing.
#include <stdexcept>

#include "algorithms/algorithms.h"
#include "algorithms/builder.h"

namespace chorus::algo {

Program ring_allreduce(const ProgramParams& p) {
  Program prog = new_program(Coll::AllReduce, "ring", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, n * nch};
    rp.output = {1, n * nch};
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto c = [&](int k) { return ch * n + mod(k, n); };
      if (n == 1) {
        lane.steps.push_back(copy(in(c(0)), out(c(0)), true));
      } else {
        // Reduce-scatter: at step t rank r sends the partial sum of chunk r-t; rank r ends owning chunk r+1.
        lane.steps.push_back(send(next, in(c(r))));
        for (int t = 1; t < n - 1; ++t)
          lane.steps.push_back(Step{OpCode::RecvReduceSend, prev, next, in(c(r - t)), {}, false});
        lane.steps.push_back(Step{OpCode::RecvReduceCopySend, prev, next, in(c(r + 1)), out(c(r + 1)), true});
        // All-gather: forward the finished chunks around the ring.
        for (int t = 1; t < n - 1; ++t)
          lane.steps.push_back(Step{OpCode::RecvCopySend, prev, next, {}, out(c(r + 1 - t)), false});
        lane.steps.push_back(recv(prev, out(c(r + 2))));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program oneshot_allreduce(const ProgramParams& p) {
  if (p.nranks > kOneShotMaxRanks)
    throw std::invalid_argument("one-shot sends every input to every rank: at most 64 ranks");
  Program prog = new_program(Coll::AllReduce, "oneshot", p);
  const int n = p.nranks, nch = p.nchannels;
  // Two scratch blocks: the running sum, and this rank's own contribution once it is in the form the others
  // receive it in.
  auto acc = [nch](int block, int c) { return ChunkRef{BufKind::Scratch, block * nch + c}; };
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {1, nch};
    rp.scratch = {2, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      if (n == 1) {
        lane.steps.push_back(copy(in(ch), out(ch), true));
        rp.lanes.push_back(std::move(lane));
        continue;
      }
      // Everyone sends its whole input to everyone, then every rank evaluates the same expression, bit for bit:
      // c_0, then c_q (+) sum for q = 1..n-1 in rank order, where c_q is rank q's contribution as it travels (a
      // pre-multiplied sum's product rounded to the type). A rank's own contribution is first copied into that form
      // (a Copy from the input applies the scalar and rounds, as a Send does), and added with the same operand
      // order as a received one (the order decides which NaN's payload survives): the sum moves to the other
      // scratch block there. One hop of latency. The output is written last, so in place never overwrites an input
      // still to be read.
      for (int t = 1; t < n; ++t) lane.steps.push_back(send(mod(r + t, n), in(ch)));
      int cur = 0;  // the scratch block holding the sum
      if (r == 0) {
        lane.steps.push_back(copy(in(ch), acc(cur, ch), false));
      } else {
        lane.steps.push_back(recv(0, acc(cur, ch)));
      }
      for (int q = 1; q < n; ++q) {
        if (q == r) {
          lane.steps.push_back(copy(in(ch), acc(1 - cur, ch), false));
          lane.steps.push_back(Step{OpCode::Reduce, -1, -1, acc(cur, ch), acc(1 - cur, ch), false});
          cur = 1 - cur;
        } else {
          lane.steps.push_back(Step{OpCode::RecvReduce, q, -1, acc(cur, ch), acc(cur, ch), false});
        }
      }
      lane.steps.push_back(copy(acc(cur, ch), out(ch), true));
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program ring_allgather(const ProgramParams& p) {
  Program prog = new_program(Coll::AllGather, "ring", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {n, nch};
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ob = [&](int block) { return out(mod(block, n) * nch + ch); };
      // Send before the copy: in place (input is output block r) the copy is a no-op the executor skips.
      if (n > 1) lane.steps.push_back(send(next, in(ch)));
      lane.steps.push_back(copy(in(ch), ob(r), false));
      if (n > 1) {
        for (int t = 1; t < n - 1; ++t)
          lane.steps.push_back(Step{OpCode::RecvCopySend, prev, next, {}, ob(r - t), false});
        lane.steps.push_back(recv(prev, ob(r - (n - 1))));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program ring_reduce_scatter(const ProgramParams& p) {
  Program prog = new_program(Coll::ReduceScatter, "ring", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {1, nch};
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ib = [&](int block) { return in(mod(block, n) * nch + ch); };
      if (n == 1) {
        lane.steps.push_back(copy(ib(0), out(ch), true));
      } else {
        // The partial sum of block b starts at rank b+1 and ends, complete, at rank b.
        lane.steps.push_back(send(next, ib(r - 1)));
        for (int t = 1; t < n - 1; ++t)
          lane.steps.push_back(Step{OpCode::RecvReduceSend, prev, next, ib(r - 1 - t), {}, false});
        lane.steps.push_back(Step{OpCode::RecvReduce, prev, -1, ib(r), out(ch), true});
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program chain_broadcast(const ProgramParams& p) {
  Program prog = new_program(Coll::Broadcast, "ring", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {1, nch};
    const int pos = mod(r - p.root, n);  // position in the chain that starts at the root
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      if (pos == 0) {
        if (n > 1) lane.steps.push_back(send(next, in(ch)));
        lane.steps.push_back(copy(in(ch), out(ch), false));
      } else if (pos < n - 1) {
        lane.steps.push_back(Step{OpCode::RecvCopySend, prev, next, {}, out(ch), false});
      } else {
        lane.steps.push_back(recv(prev, out(ch)));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program chain_reduce(const ProgramParams& p) {
  Program prog = new_program(Coll::Reduce, "ring", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {1, nch};
    rp.output = {1, nch};
    const int pos = mod(r - p.root - 1, n);  // the chain starts after the root and ends at it
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      if (n == 1) {
        lane.steps.push_back(copy(in(ch), out(ch), true));
      } else if (pos == 0) {
        lane.steps.push_back(send(next, in(ch)));
      } else if (pos < n - 1) {
        lane.steps.push_back(Step{OpCode::RecvReduceSend, prev, next, in(ch), {}, false});
      } else {
        lane.steps.push_back(Step{OpCode::RecvReduce, prev, -1, in(ch), out(ch), true});
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

Program pairwise_alltoall(const ProgramParams& p) {
  Program prog = new_program(Coll::AllToAll, "pairwise", p);
  const int n = p.nranks, nch = p.nchannels;
  for (int r = 0; r < n; ++r) {
    RankProgram& rp = prog.ranks[r];
    rp.input = {n, nch};
    rp.output = {n, nch};
    for (int ch = 0; ch < nch; ++ch) {
      Lane lane{ch, {}};
      auto ib = [&](int block) { return in(mod(block, n) * nch + ch); };
      auto ob = [&](int block) { return out(mod(block, n) * nch + ch); };
      lane.steps.push_back(copy(ib(r), ob(r), false));
      // Step t exchanges with the ranks t away in both directions, so every pair talks exactly once.
      for (int t = 1; t < n; ++t) {
        lane.steps.push_back(send(mod(r + t, n), ib(r + t)));
        lane.steps.push_back(recv(mod(r - t, n), ob(r - t)));
      }
      rp.lanes.push_back(std::move(lane));
    }
  }
  return prog;
}

}  // namespace chorus::algo
