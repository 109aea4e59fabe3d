#include "algorithms/simulator.h"

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/executor.h"

namespace chorus::algo {

namespace {

// Big programs (4096 ranks: tens of millions of step-slices) are bound by memory latency, so the hot state is laid
// out in cache lines: one line per rank, one per FIFO (plus one of its times), two per lane.

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr int kPeerCache = 3;  // per lane and direction

// Elements of the chunks of one buffer of one rank: chunk c is part c % parts of its block, and part_prefix[p] (p
// in [0, parts]) is the elements of parts [0, p) of a block (all blocks of a uniform buffer have the same size, so
// a part's size does not depend on its block): a run of chunks costs O(1) to size.
struct BufTable {
  const size_t* part_prefix = nullptr;
  int32_t parts = 1;
  int32_t nchunks = 0;
};

struct alignas(64) RankState {
  BufTable buf[3];
  double cpu_free = 0;  // when this rank's CPU has done all the work given to it so far
  int32_t host = 0;
};

// One (sender, receiver, channel) connection: a slot FIFO of `depth` slots. Its arrival and consume times live in
// Sim::times_ (ring buffers of `depth`).
struct alignas(64) Fifo {
  double conn_free = 0;          // when the connection has sent everything it accepted so far
  double alpha = 0;              // seconds
  double inv_bw = 0;             // seconds per byte on the connection (0: unlimited)
  uint32_t posted = 0;           // messages the sender's step-slices have issued
  uint32_t arrived = 0;          // messages whose arrival time is known
  uint32_t consumed = 0;         // messages whose consuming step-slice has finished
  uint32_t recv_waiter = kNone;  // lane waiting for message `consumed` to arrive
  uint32_t send_waiter = kNone;  // lane waiting for a free slot
  int32_t src_host = 0, dst_host = 0;
  uint8_t cls = 0;
  bool shared = false;  // crosses hosts that limit their egress or ingress: goes through an inject event
};

struct FifoName {
  int32_t sender, receiver, channel;
};

struct alignas(64) LaneState {
  const Step* steps = nullptr;
  uint32_t nsteps = 0;
  uint32_t step = 0;
  uint32_t slice = 0;
  int32_t rank = 0;
  double prev_end = 0;  // when the previous step-slice finished (the lane's finish time once done)
  uint64_t bytes = 0;   // of the current step-slice
  uint32_t in_fifo = kNone, out_fifo = kNone;
  double cpu_busy = 0;  // local work done, seconds
  uint16_t channel = 0;
  OpCode op = OpCode::Copy;  // of the current step: the step itself is not read again when it runs
  bool more = false;         // some step of this slice round has another slice
  bool done = false;
  uint8_t recv_next = 0, send_next = 0;  // peer cache entries to replace next (round robin)
  // Second line: FIFOs of recently used peers (lanes mostly talk to one to three peers over and over), and what
  // only error messages need.
  int32_t recv_peer[kPeerCache] = {-1, -1, -1};
  uint32_t recv_fifo[kPeerCache] = {};
  int32_t send_peer[kPeerCache] = {-1, -1, -1};
  uint32_t send_fifo[kPeerCache] = {};
  uint16_t lane = 0;
  uint32_t phase = 0;  // first step of the current phase (Step::fence); read only at the end of a pass
};

static_assert(sizeof(LaneState) == 128 && sizeof(Fifo) == 64 && sizeof(RankState) == 64);

// Ordered by time, then by id: lane events (2 * lane) before injects (2 * fifo + 1) of the same index, lower
// indices first. Any strict total order keeps runs deterministic; this one needs no sequence counter. Times are
// never negative, and the bits of non-negative doubles order like the numbers, so (time, id) is one 128-bit key.
struct Event {
  unsigned __int128 k;
  Event() = default;
  Event(double t, uint64_t id) : k((static_cast<unsigned __int128>(std::bit_cast<uint64_t>(t)) << 64) | id) {}
  double t() const { return std::bit_cast<double>(static_cast<uint64_t>(k >> 64)); }
  uint64_t id() const { return static_cast<uint64_t>(k); }
  bool operator<(const Event& o) const { return k < o.k; }
};

// A 4-ary min-heap laid out so that the four children of a node share one cache line, plus a "hot" slot holding
// an event no later than any in the heap: a lane whose next step-slice is due before everything else skips the
// heap.
class EventQueue {
 public:
  bool empty() const { return !hot_valid_ && size_ == 0; }
  void reserve(size_t n) { blocks_.reserve(n / 4 + 2); }
  void push(const Event& e) {
    if (!hot_valid_) {
      if (size_ == 0 || e < at(0)) {
        hot_ = e;
        hot_valid_ = true;
        return;
      }
    } else if (e < hot_) {
      heap_push(hot_);
      hot_ = e;
      return;
    }
    heap_push(e);
  }
  Event pop() {
    if (hot_valid_) {
      hot_valid_ = false;
      return hot_;
    }
    const Event top = at(0);
    const Event last = at(--size_);
    const size_t n = size_;
    size_t i = 0;
    while (n > 0) {
      const size_t c = 4 * i + 1;  // children c..c+3: block i + 1
      if (c >= n) break;
      const Block& b = blocks_[i + 1];
      size_t best = 0;
      const size_t k = std::min<size_t>(4, n - c);
      for (size_t j = 1; j < k; ++j)
        if (b.e[j] < b.e[best]) best = j;
      if (!(b.e[best] < last)) break;
      at(i) = b.e[best];
      i = c + best;
    }
    if (n > 0) at(i) = last;
    return top;
  }
  void clear() {
    blocks_.clear();
    size_ = 0;
    hot_valid_ = false;
  }
  size_t capacity_bytes() const { return blocks_.capacity() * sizeof(Block); }
  // The next event's id, for prefetching; undefined when empty.
  uint64_t next_id() const { return hot_valid_ ? hot_.id() : at(0).id(); }

 private:
  struct alignas(64) Block {
    Event e[4];
  };
  // Node i sits at slot i + 3, so the children 4i+1..4i+4 of node i are exactly block i + 1.
  Event& at(size_t i) { return blocks_[(i + 3) >> 2].e[(i + 3) & 3]; }
  const Event& at(size_t i) const { return blocks_[(i + 3) >> 2].e[(i + 3) & 3]; }
  void heap_push(const Event& e) {
    size_t i = size_++;
    if (((i + 3) >> 2) >= blocks_.size()) blocks_.emplace_back();
    while (i > 0) {
      const size_t p = (i - 1) / 4;
      if (!(e < at(p))) break;
      at(i) = at(p);
      i = p;
    }
    at(i) = e;
  }

  std::vector<Block> blocks_;
  size_t size_ = 0;
  Event hot_{};
  bool hot_valid_ = false;
};

double inverse(double rate) { return rate > 0 ? 1.0 / rate : 0.0; }

// Buffers reused by the simulations of one thread (the selector runs many in a row): no allocation and no page
// faults after the first. Emptied at the start of each simulation; freed when they grew beyond kScratchKeep.
struct Scratch {
  std::vector<RankState> ranks;
  std::vector<LaneState> lanes;
  std::vector<Fifo> fifos;
  std::vector<FifoName> names;
  std::vector<double> times;
  std::vector<uint32_t> dense_index;
  std::vector<uint32_t> work;
  EventQueue queue;

  void clear() {
    ranks.clear();
    lanes.clear();
    fifos.clear();
    names.clear();
    times.clear();
    dense_index.clear();
    work.clear();
    queue.clear();
  }
  size_t bytes() const {
    return ranks.capacity() * sizeof(RankState) + lanes.capacity() * sizeof(LaneState) +
           fifos.capacity() * sizeof(Fifo) + names.capacity() * sizeof(FifoName) + times.capacity() * sizeof(double) +
           dense_index.capacity() * sizeof(uint32_t) + work.capacity() * sizeof(uint32_t) + queue.capacity_bytes();
  }
};
constexpr size_t kScratchKeep = size_t{64} << 20;

class Sim {
 public:
  Sim(const Program& prog, const topo::Topology& topo, size_t count, size_t esz, const SimOptions& opt, Scratch& sc)
      : prog_(prog),
        topo_(topo),
        esz_(esz),
        depth_(static_cast<uint32_t>(std::max(opt.fifo_depth, 0))),
        ranks_(sc.ranks),
        lanes_(sc.lanes),
        fifos_(sc.fifos),
        names_(sc.names),
        times_(sc.times),
        dense_index_(sc.dense_index),
        queue_(sc.queue),
        work_(sc.work) {
    sc.clear();
    const int n = prog.nranks;
    if (esz == 0) invalid("simulate: elem_size must be at least 1 byte");
    if (opt.slice_bytes == 0) invalid("simulate: slice_bytes must be at least 1");
    if (opt.fifo_depth < 1) invalid(cat("simulate: fifo_depth ", opt.fifo_depth, " must be at least 1"));
    if (n < 1 || static_cast<int>(prog.ranks.size()) != n)
      internal(cat("program has ", prog.ranks.size(), " ranks for nranks ", n));
    if (topo.nranks() != n)
      invalid(cat("simulate: the topology has ", topo.nranks(), " ranks but the ", prog.algorithm, " ",
                  coll_name(prog.coll), " program has ", n));
    if (prog.coll == Coll::SendRecv || prog.coll == Coll::Count)
      invalid(cat("simulate: ", coll_name(prog.coll), " has no uniform buffer shape to simulate"));
    slice_elems_ = std::max<size_t>(1, opt.slice_bytes / esz);

    // Chunk sizes through the executor's Layout, with the communicator's block shapes.
    ranks_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const RankProgram& rp = prog.ranks[r];
      const BufShape* shapes[3] = {&rp.input, &rp.output, &rp.scratch};
      Layout layout;
      layout.elem_size = esz;
      for (int k = 0; k < 3; ++k) {
        const auto kind = static_cast<BufKind>(k);
        const BlockShape bs = call_blocks(prog.coll, kind, count, n, rp);
        const int32_t parts = std::max(1, shapes[k]->parts);
        BufTable& bt = ranks_[static_cast<size_t>(r)].buf[k];
        bt.parts = parts;
        bt.nchunks = bs.nblocks * parts;
        if (bs.nblocks < 1) continue;
        layout.set_uniform(kind, nullptr, bs.nblocks, bs.block_elems, parts);
        auto [it, fresh] = tables_.try_emplace({bs.block_elems, parts});
        std::vector<size_t>& prefix = it->second;
        if (fresh) {
          prefix.assign(static_cast<size_t>(parts) + 1, 0);
          for (int32_t p = 0; p < parts; ++p)
            prefix[static_cast<size_t>(p) + 1] = prefix[static_cast<size_t>(p)] + layout.chunk({kind, p}).elems;
        }
        bt.part_prefix = prefix.data();
      }
      ranks_[static_cast<size_t>(r)].host = topo.ranks[static_cast<size_t>(r)].host;
    }

    uint64_t channels = 1;
    for (int r = 0; r < n; ++r) {
      const RankProgram& rp = prog.ranks[r];
      if (rp.lanes.size() > 0xffff) internal(cat("rank ", r, " has ", rp.lanes.size(), " lanes (at most 65535)"));
      for (size_t l = 0; l < rp.lanes.size(); ++l) {
        const Lane& lane = rp.lanes[l];
        if (lane.channel < 0 || lane.channel > 0xffff)
          internal(cat("rank ", r, " lane ", l, ": channel ", lane.channel, " out of range"));
        if (lane.steps.size() >= kNone) internal(cat("rank ", r, " lane ", l, " has too many steps"));
        LaneState& ls = lanes_.emplace_back();
        ls.steps = lane.steps.data();
        ls.nsteps = static_cast<uint32_t>(lane.steps.size());
        ls.rank = r;
        ls.lane = static_cast<uint16_t>(l);
        ls.channel = static_cast<uint16_t>(lane.channel);
        ls.done = lane.steps.empty();
        total_steps_ += static_cast<int64_t>(lane.steps.size());
        channels = std::max(channels, static_cast<uint64_t>(lane.channel) + 1);
      }
    }
    if (lanes_.size() >= (size_t{1} << 31)) internal("too many lanes");
    channels_ = channels;
    const uint64_t dense = static_cast<uint64_t>(n) * static_cast<uint64_t>(n) * channels_;
    if (dense <= (uint64_t{1} << 22)) dense_index_.assign(dense, kNone);
    queue_.reserve(lanes_.size() + 16);

    // Coarsening: K slices per step at most when the exact walk would exceed the budget. Counters are 32-bit, so
    // the budget is capped at 2^30 step-slices.
    const int64_t budget =
        std::min<int64_t>(int64_t{1} << 30, opt.max_step_slices > 0 ? opt.max_step_slices : default_step_slices(n));
    if (total_steps_ > budget) {
      max_slices_ = 1;
    } else {
      int64_t exact = 0;
      for (size_t li = 0; li < lanes_.size() && exact <= budget; ++li)
        for (uint32_t i = 0; i < lanes_[li].nsteps && exact <= budget; ++i) {
          const size_t e = step_elems(lanes_[li], lanes_[li].steps[i], i);
          exact += static_cast<int64_t>(e == 0 ? 1 : (e - 1) / slice_elems_ + 1);
        }
      if (exact > budget) max_slices_ = static_cast<uint64_t>(std::max<int64_t>(1, budget / total_steps_));
    }

    // Seconds per byte of local work, per op.
    const double c = inverse(topo.copy_Bps), g = inverse(topo.reduce_Bps);
    for (size_t op = 0; op < cpu_inv_.size(); ++op) {
      switch (static_cast<OpCode>(op)) {
        case OpCode::Send:
        case OpCode::Recv:
        case OpCode::Copy: cpu_inv_[op] = c; break;
        case OpCode::RecvReduce:
        case OpCode::RecvReduceSend:
        case OpCode::Reduce: cpu_inv_[op] = g; break;
        case OpCode::RecvReduceCopySend: cpu_inv_[op] = g + c; break;
        case OpCode::RecvCopySend: cpu_inv_[op] = 2 * c; break;
        default: cpu_inv_[op] = c;  // ops added later: at least one pass over the data
      }
    }

    const size_t nh = topo.hosts.size();
    egress_inv_.resize(nh);
    ingress_inv_.resize(nh);
    for (size_t h = 0; h < nh; ++h) {
      egress_inv_[h] = inverse(topo.hosts[h].net_egress_Bps);
      ingress_inv_[h] = inverse(topo.hosts[h].net_ingress_Bps);
    }
    for (const RankState& rs : ranks_)
      if (rs.host < 0 || static_cast<size_t>(rs.host) >= nh)
        invalid(cat("simulate: the topology places a rank on host ", rs.host, " of ", nh));
    egress_free_.assign(nh, 0.0);
    ingress_free_.assign(nh, 0.0);
    for (size_t c = 0; c < topo.links.size(); ++c) {
      const topo::LinkParams& lp = topo.links[c];
      if (!(lp.alpha_s >= 0) || !(lp.bandwidth_Bps >= 0) || !(lp.overhead_s >= 0))
        invalid(cat("simulate: link costs must be >= 0 (alpha ", lp.alpha_s, " s, bandwidth ", lp.bandwidth_Bps,
                    " B/s, overhead ", lp.overhead_s, " s)"));
      overhead_[c] = lp.overhead_s + 0.0;
    }
    dataflow_ = !shares_resources();
  }

  // True if two lanes may compete for one server: a rank's CPU (two lanes with local work) or a host's egress or
  // ingress (two connections between hosts through a limited one). Then time order matters.
  bool shares_resources() const {
    const bool local_work = topo_.copy_Bps > 0 || topo_.reduce_Bps > 0 ||
                            std::any_of(overhead_.begin(), overhead_.end(), [](double o) { return o > 0; });
    const int n = prog_.nranks;
    for (int r = 0; r < n; ++r) {
      size_t busy = 0;
      for (const Lane& lane : prog_.ranks[r].lanes) busy += lane.steps.empty() ? 0 : 1;
      if (local_work && busy > 1) return true;
    }
    const bool limited = std::any_of(egress_inv_.begin(), egress_inv_.end(), [](double v) { return v > 0; }) ||
                         std::any_of(ingress_inv_.begin(), ingress_inv_.end(), [](double v) { return v > 0; });
    if (!limited) return false;
    // The one connection seen so far through each host's egress and ingress: (sender * n + receiver) * 2^16 +
    // channel, plus one (0: none yet).
    std::vector<uint64_t> out_seen(egress_inv_.size(), 0), in_seen(ingress_inv_.size(), 0);
    auto key = [n](int s, int d, int ch) {
      return ((static_cast<uint64_t>(s) * static_cast<uint64_t>(n) + static_cast<uint64_t>(d)) << 16) +
             static_cast<uint64_t>(ch) + 1;
    };
    auto through = [](uint64_t& seen, uint64_t k) {
      if (seen == 0) seen = k;
      return seen != k;
    };
    for (int r = 0; r < n; ++r) {
      const auto h = static_cast<size_t>(ranks_[static_cast<size_t>(r)].host);
      for (const Lane& lane : prog_.ranks[r].lanes)
        for (const Step& s : lane.steps) {
          if (op_sends(s.op) && s.send_peer >= 0 && s.send_peer < n && egress_inv_[h] > 0 &&
              ranks_[static_cast<size_t>(s.send_peer)].host != static_cast<int32_t>(h) &&
              through(out_seen[h], key(r, s.send_peer, lane.channel)))
            return true;
          if (op_receives(s.op) && s.recv_peer >= 0 && s.recv_peer < n && ingress_inv_[h] > 0 &&
              ranks_[static_cast<size_t>(s.recv_peer)].host != static_cast<int32_t>(h) &&
              through(in_seen[h], key(s.recv_peer, r, lane.channel)))
            return true;
        }
    }
    return false;
  }

  SimResult run() {
    SimResult res;
    size_t live = 0;
    for (LaneState& ls : lanes_) {
      if (ls.done) continue;
      ++live;
      if (!load(ls)) internal("first step-slice missing");  // slice 0 always exists
    }
    size_t finished = 0;
    if (dataflow_) {
      // Nothing is shared: each step-slice's time is a max-plus function of its predecessors, the same in any
      // order of evaluation. Run each lane as far as it can go; a lane that must wait is resumed by whoever
      // produces what it waits for.
      for (size_t li = lanes_.size(); li-- > 0;)
        if (!lanes_[li].done) work_.push_back(static_cast<uint32_t>(li));
      while (!work_.empty()) {
        const uint32_t li = work_.back();
        work_.pop_back();
        double t;
        while (ready(li, t))
          if (run_step_slice(li, t)) {
            ++finished;
            break;
          }
      }
    } else {
      for (uint32_t li = 0; li < lanes_.size(); ++li)
        if (!lanes_[li].done) schedule(li);
      while (!queue_.empty()) {
        const Event ev = queue_.pop();
        if (!queue_.empty()) {
          const uint64_t next = queue_.next_id();
          if ((next & 1) == 0) __builtin_prefetch(&lanes_[next >> 1]);
        }
        const auto id = static_cast<uint32_t>(ev.id() >> 1);
        if (ev.id() & 1) {
          inject(id, ev.t());
        } else if (run_step_slice(id, ev.t())) {
          ++finished;
        }
      }
    }
    if (finished != live) deadlock();

    std::vector<double> finish(ranks_.size(), 0.0), busy(ranks_.size(), 0.0);
    for (const LaneState& ls : lanes_) {
      const auto r = static_cast<size_t>(ls.rank);
      finish[r] = std::max(finish[r], ls.prev_end);
      busy[r] += ls.cpu_busy;
    }
    for (size_t r = 0; r < finish.size(); ++r) {
      if (finish[r] > res.seconds) {
        res.seconds = finish[r];
        res.critical_rank = static_cast<int>(r);
      }
      res.cpu_busy_max_s = std::max(res.cpu_busy_max_s, busy[r]);
    }
    res.messages = messages_;
    res.messages_per_class = messages_per_class_;
    res.bytes_per_class = bytes_per_class_;
    res.step_slices = step_slices_;
    res.max_slices_per_step = max_slices_ == std::numeric_limits<uint64_t>::max() ? 0 : static_cast<int>(max_slices_);
    return res;
  }

 private:
  [[noreturn]] static void invalid(const std::string& what) {
    throw Error(chorusInvalidArgument, Subsys::Algorithms, what);
  }
  [[noreturn]] void internal(const std::string& what) const {
    throw Error(chorusInternalError, Subsys::Algorithms,
                cat("simulate ", prog_.algorithm, " ", coll_name(prog_.coll), ": ", what));
  }

  size_t chunk_elems(const LaneState& ls, const ChunkRef& ref, uint32_t step, const char* what) const {
    const BufTable& bt = ranks_[static_cast<size_t>(ls.rank)].buf[static_cast<int>(ref.buf)];
    if (ref.count < 1 || ref.chunk < 0 || ref.chunk > bt.nchunks - ref.count)
      internal(cat("rank ", ls.rank, " lane ", ls.lane, " step ", step, ": ", what, " chunk ", ref.chunk,
                   ref.count == 1 ? std::string() : cat(" (a run of ", ref.count, ")"), " out of range (", bt.nchunks,
                   " chunks)"));
    // A run: whole blocks' worth of parts, then `rem` consecutive parts from `p0`, wrapping into the next block.
    const auto parts = static_cast<size_t>(bt.parts), p0 = static_cast<size_t>(ref.chunk) % parts;
    const size_t n = static_cast<size_t>(ref.count), rem = n % parts, end = p0 + rem;
    const size_t* pre = bt.part_prefix;
    const size_t tail = end <= parts ? pre[end] - pre[p0] : pre[parts] - pre[p0] + pre[end - parts];
    return n / parts * pre[parts] + tail;
  }

  // Elements a step moves, as the executor counts them: its destination's, else its source's.
  size_t step_elems(const LaneState& ls, const Step& s, uint32_t step) const {
    if (op_writes_dst(s.op)) return chunk_elems(ls, s.dst, step, "dst");
    if (op_reads_src(s.op)) return chunk_elems(ls, s.src, step, "src");
    return 0;
  }

  uint32_t fifo_for(LaneState& ls, int32_t peer, bool receiving) {
    int32_t* peers = receiving ? ls.recv_peer : ls.send_peer;
    uint32_t* fifos = receiving ? ls.recv_fifo : ls.send_fifo;
    for (int i = 0; i < kPeerCache; ++i)
      if (peers[i] == peer) return fifos[i];
    uint8_t& next = receiving ? ls.recv_next : ls.send_next;
    const int slot = next++ % kPeerCache;
    fifos[slot] = lookup_fifo(ls, peer, receiving);
    peers[slot] = peer;
    return fifos[slot];
  }

  uint32_t lookup_fifo(const LaneState& ls, int32_t peer, bool receiving) {
    const int n = prog_.nranks;
    if (peer < 0 || peer >= n || peer == ls.rank)
      internal(cat("rank ", ls.rank, " lane ", ls.lane, " step ", ls.step, ": invalid peer ", peer));
    const int32_t sender = receiving ? peer : ls.rank, receiver = receiving ? ls.rank : peer;
    const uint64_t pair = static_cast<uint64_t>(sender) * static_cast<uint64_t>(n) + static_cast<uint64_t>(receiver);
    uint32_t* index;
    if (!dense_index_.empty()) {
      index = &dense_index_[pair * channels_ + ls.channel];
    } else {
      index = &fifo_index_.try_emplace(pair * channels_ + ls.channel, kNone).first->second;
    }
    if (*index != kNone) return *index;
    if (fifos_.size() >= kNone - 1) internal("too many connections");
    *index = static_cast<uint32_t>(fifos_.size());
    Fifo& f = fifos_.emplace_back();
    const topo::LinkClass cls = topo_.link(sender, receiver);
    const topo::LinkParams& lp = topo_.links[static_cast<size_t>(cls)];
    f.alpha = lp.alpha_s + 0.0;  // never -0.0: event keys order times by their bits
    f.inv_bw = inverse(lp.bandwidth_Bps);
    f.cls = static_cast<uint8_t>(cls);
    f.src_host = ranks_[static_cast<size_t>(sender)].host;
    f.dst_host = ranks_[static_cast<size_t>(receiver)].host;
    f.shared = cls == topo::LinkClass::Network &&
               (egress_inv_[static_cast<size_t>(f.src_host)] > 0 || ingress_inv_[static_cast<size_t>(f.dst_host)] > 0);
    names_.push_back({sender, receiver, ls.channel});
    times_.resize(times_.size() + 2 * depth_, 0.0);
    return *index;
  }

  // Loads the lane's current (step, slice): false when that step has no such slice.
  bool load(LaneState& ls) {
    const Step& s = ls.steps[ls.step];
    const size_t e = step_elems(ls, s, ls.step);
    size_t sl = slice_elems_;
    uint64_t ns = e == 0 ? 1 : (e - 1) / sl + 1;
    if (ns > max_slices_) {
      sl = (e - 1) / max_slices_ + 1;
      ns = (e - 1) / sl + 1;
    }
    if (ls.slice != 0 && ls.slice >= ns) return false;
    if (ns > ls.slice + 1) ls.more = true;
    const size_t begin = std::min<size_t>(e, static_cast<size_t>(ls.slice) * sl);
    ls.bytes = static_cast<uint64_t>(std::min(e - begin, sl)) * esz_;
    ls.in_fifo = op_receives(s.op) ? fifo_for(ls, s.recv_peer, true) : kNone;
    ls.out_fifo = op_sends(s.op) ? fifo_for(ls, s.send_peer, false) : kNone;
    ls.op = s.op;
    // The lane reads its steps in order: fetch ahead, its next event is usually long after this one.
    if (ls.step + 2 < ls.nsteps) __builtin_prefetch(&ls.steps[ls.step + 2]);
    return true;
  }

  // Moves to the lane's next step-slice in slice-major order within its phase; false when the lane is done.
  bool advance(LaneState& ls) {
    for (;;) {
      if (!next_step_slice(ls.steps, ls.nsteps, ls.phase, ls.step, ls.slice, ls.more)) return false;
      if (load(ls)) return true;
    }
  }

  double& arrival(uint32_t f, uint32_t k) { return times_[size_t{f} * 2 * depth_ + k % depth_]; }
  double& consume_time(uint32_t f, uint32_t k) { return times_[size_t{f} * 2 * depth_ + depth_ + k % depth_]; }

  void wait_on(uint32_t& waiter, uint32_t li, uint32_t fi) {
    if (waiter != kNone && waiter != li) {
      const FifoName& nm = names_[fi];
      internal(cat("two lanes of one rank use the connection from rank ", nm.sender, " to rank ", nm.receiver,
                   " on channel ", nm.channel, " in the same direction"));
    }
    waiter = li;
  }

  // The time the lane's current step-slice may start (its message, its slot and its lane allow it), or false
  // after parking the lane on the FIFO it waits for.
  bool ready(uint32_t li, double& t) {
    LaneState& ls = lanes_[li];
    t = ls.prev_end;
    if (ls.in_fifo != kNone) {
      Fifo& f = fifos_[ls.in_fifo];
      if (f.arrived == f.consumed) {
        wait_on(f.recv_waiter, li, ls.in_fifo);
        return false;
      }
      t = std::max(t, arrival(ls.in_fifo, f.consumed));
    }
    if (ls.out_fifo != kNone) {
      Fifo& g = fifos_[ls.out_fifo];
      if (g.posted >= depth_) {
        if (g.posted - g.consumed >= depth_) {
          wait_on(g.send_waiter, li, ls.out_fifo);
          return false;
        }
        t = std::max(t, consume_time(ls.out_fifo, g.posted - depth_));
      }
    }
    return true;
  }

  // Event mode: queues the lane's current step-slice, or parks the lane.
  void schedule(uint32_t li) {
    double t;
    if (ready(li, t)) queue_.push(Event(t, uint64_t{li} << 1));
  }

  void wake(uint32_t& waiter) {
    if (waiter == kNone) return;
    const uint32_t li = waiter;
    waiter = kNone;
    if (dataflow_) {
      work_.push_back(li);
    } else {
      schedule(li);
    }
  }

  void delivered(uint32_t fi, uint32_t k, double when) {
    arrival(fi, k) = when;
    Fifo& f = fifos_[fi];
    ++f.arrived;
    wake(f.recv_waiter);
  }

  // Runs the lane's current step-slice at `now`; true when that finished the lane.
  bool run_step_slice(uint32_t li, double now) {
    LaneState& ls = lanes_[li];
    double work = static_cast<double>(ls.bytes) * cpu_inv_[static_cast<size_t>(ls.op)];
    if (ls.in_fifo != kNone) work += overhead_[fifos_[ls.in_fifo].cls];
    if (ls.out_fifo != kNone) work += overhead_[fifos_[ls.out_fifo].cls];
    double end = now;
    if (work > 0) {
      double& cpu = ranks_[static_cast<size_t>(ls.rank)].cpu_free;
      end = std::max(now, cpu) + work;
      cpu = end;
      ls.cpu_busy += work;
    }
    if (ls.in_fifo != kNone) {
      Fifo& f = fifos_[ls.in_fifo];
      consume_time(ls.in_fifo, f.consumed) = end;
      ++f.consumed;
      wake(f.send_waiter);
    }
    if (ls.out_fifo != kNone) {
      const uint32_t gi = ls.out_fifo;
      Fifo& g = fifos_[gi];
      const uint32_t k = g.posted++;
      ++messages_;
      ++messages_per_class_[g.cls];
      bytes_per_class_[g.cls] += ls.bytes;
      if (g.shared) {
        arrival(gi, k) = static_cast<double>(ls.bytes);  // held until the inject event
        if (dataflow_) {
          inject(gi, end);
        } else {
          queue_.push(Event(end, (uint64_t{gi} << 1) | 1));
        }
      } else {
        const double start = std::max(end, g.conn_free);
        g.conn_free = start + static_cast<double>(ls.bytes) * g.inv_bw;
        delivered(gi, k, g.conn_free + g.alpha);
      }
    }
    ++step_slices_;
    ls.prev_end = end;
    if (!advance(ls)) {
      ls.done = true;
      return true;
    }
    if (!dataflow_) schedule(li);
    return false;
  }

  // The oldest message of a connection between hosts with shared limits leaves. It first waits for its own
  // connection (an event at the time it frees), then takes the sender host's egress and the receiver host's
  // ingress in the order messages get there: they are FIFO servers reserved from the moment both are free.
  void inject(uint32_t gi, double now) {
    Fifo& g = fifos_[gi];
    if (g.conn_free > now && !dataflow_) {
      queue_.push(Event(g.conn_free, (uint64_t{gi} << 1) | 1));
      return;
    }
    const uint32_t k = g.arrived;
    const double bytes = arrival(gi, k);
    const auto sh = static_cast<size_t>(g.src_host), dh = static_cast<size_t>(g.dst_host);
    const double start = std::max({now, g.conn_free, egress_free_[sh], ingress_free_[dh]});
    const double dc = bytes * g.inv_bw, de = bytes * egress_inv_[sh], di = bytes * ingress_inv_[dh];
    g.conn_free = start + dc;
    if (de > 0) egress_free_[sh] = start + de;
    if (di > 0) ingress_free_[dh] = start + di;
    delivered(gi, k, start + std::max({dc, de, di}) + g.alpha);
  }

  [[noreturn]] void deadlock() const {
    std::string stuck;
    int shown = 0;
    for (uint32_t li = 0; li < lanes_.size() && shown < 8; ++li) {
      const LaneState& ls = lanes_[li];
      if (ls.done) continue;
      const Step& s = ls.steps[ls.step];
      stuck +=
          cat(" [rank ", ls.rank, " lane ", ls.lane, " step ", ls.step, " slice ", ls.slice, " ", opcode_name(s.op));
      if (ls.in_fifo != kNone && fifos_[ls.in_fifo].recv_waiter == li) stuck += cat(" waits for rank ", s.recv_peer);
      if (ls.out_fifo != kNone && fifos_[ls.out_fifo].send_waiter == li)
        stuck += cat(" waits for a slot to rank ", s.send_peer);
      stuck += "]";
      ++shown;
    }
    internal(cat("deadlock with fifo depth ", depth_, ":", stuck));
  }

  const Program& prog_;
  const topo::Topology& topo_;
  const size_t esz_;
  const uint32_t depth_;
  size_t slice_elems_ = 1;
  uint64_t max_slices_ = std::numeric_limits<uint64_t>::max();  // K of the coarsening; unbounded when exact
  int64_t total_steps_ = 0;

  std::vector<RankState>& ranks_;
  std::vector<LaneState>& lanes_;
  std::vector<Fifo>& fifos_;
  std::vector<FifoName>& names_;
  std::vector<double>& times_;  // per FIFO: depth arrival times, then depth consume times (ring buffers)
  // (sender, receiver, channel) -> FIFO: a dense table when it is small, else a hash map.
  std::vector<uint32_t>& dense_index_;
  EventQueue& queue_;
  std::vector<uint32_t>& work_;                                       // dataflow mode: lanes that may be able to run
  std::map<std::pair<size_t, int32_t>, std::vector<size_t>> tables_;  // (block elems, parts) -> part_prefix
  uint64_t channels_ = 1;
  std::unordered_map<uint64_t, uint32_t> fifo_index_;
  std::array<double, 256> cpu_inv_{};                  // indexed by OpCode
  std::array<double, topo::kLinkClasses> overhead_{};  // LogGP's o per message, by link class, seconds
  std::vector<double> egress_inv_, ingress_inv_, egress_free_, ingress_free_;
  bool dataflow_ = false;  // no rank CPU, egress or ingress is shared: evaluate without an event queue

  int64_t messages_ = 0, step_slices_ = 0;
  std::array<int64_t, topo::kLinkClasses> messages_per_class_{};
  std::array<uint64_t, topo::kLinkClasses> bytes_per_class_{};
};

}  // namespace

int64_t default_step_slices(int nranks) { return 32768 + int64_t{1024} * std::max(0, nranks - 64); }

SimResult simulate(const Program& program, const topo::Topology& topology, size_t count, size_t elem_size,
                   const SimOptions& options) {
  thread_local Scratch scratch;
  struct Trim {
    Scratch& s;
    ~Trim() {
      if (s.bytes() > kScratchKeep) s = Scratch{};
    }
  } trim{scratch};
  Sim sim(program, topology, count, elem_size, options, scratch);
  return sim.run();
}

}  // namespace chorus::algo
