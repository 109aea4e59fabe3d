#include "algorithms/verifier.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

namespace chorus::algo {

namespace {

// (rank, input chunk) pairs, sorted: a multiset of contributions.
using Contribs = std::vector<std::pair<int32_t, int32_t>>;

struct Value {
  bool defined = false;
  bool pristine = false;  // still the rank's own untouched input
  int finals = 0;
  Contribs contribs;
  // Identity of the bits: copies keep it, arithmetic makes a new one, decoding the codes of value v gives -v on
  // every rank (encoding is deterministic). Equal versions mean equal bits.
  int64_t version = 0;
  // Fewest and most times any contribution in the value went through the codec.
  int quant_min = 0, quant_max = 0;
  // Of the cell holding the value: the lane and phase of the step that wrote it, and the cell its run starts at
  // (-1: never written by a step).
  int32_t writer_lane = -1, writer_phase = -1, writer_run = -1;
};

// One message: the values of the run of chunks it carries, in order, and the size class (part) of each.
struct Message {
  std::vector<Value> values;
  std::vector<int32_t> parts;
  bool coded = false;
  int64_t phase = 0;  // the sender's lane and phase (lane << 32 | phase)
};

bool is_reduction(Coll c) {
  return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce || c == Coll::Barrier;
}

Contribs merge(const Contribs& a, const Contribs& b) {
  Contribs out;
  out.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

class Run {
 public:
  Run(const Program& prog, const VerifyOptions& opt) : prog_(prog), opt_(opt) {}

  VerifyResult go() {
    VerifyResult res;
    if (static_cast<int>(prog_.ranks.size()) != prog_.nranks) return fail(res, "program has wrong number of ranks");
    init_cells();
    if (!error_.empty()) return fail(res, error_);
    last_read_.assign(cells_.size(), Access{});
    phase_.assign(static_cast<size_t>(prog_.nranks), {});
    for (int r = 0; r < prog_.nranks; ++r) phase_[static_cast<size_t>(r)].assign(prog_.ranks[r].lanes.size(), 0);
    std::vector<std::vector<size_t>> pc(prog_.nranks);
    for (int r = 0; r < prog_.nranks; ++r) pc[r].assign(prog_.ranks[r].lanes.size(), 0);
    for (;;) {
      bool progress = false, all_done = true;
      for (int r = 0; r < prog_.nranks; ++r) {
        const RankProgram& rp = prog_.ranks[r];
        for (size_t l = 0; l < rp.lanes.size(); ++l) {
          while (pc[r][l] < rp.lanes[l].steps.size()) {
            if (!try_step(r, static_cast<int>(l), pc[r][l], res)) break;
            if (!error_.empty()) return fail(res, error_);
            ++pc[r][l];
            progress = true;
          }
          if (pc[r][l] < rp.lanes[l].steps.size()) all_done = false;
        }
      }
      ++res.rounds;
      if (all_done) break;
      if (!progress) return fail(res, deadlock_report(pc));
    }
    for (const auto& [key, q] : fifos_)
      if (!q.empty())
        return fail(res, cat_str("rank ", std::get<0>(key), " sent ", q.size(), " message(s) to rank ",
                                 std::get<1>(key), " on channel ", std::get<2>(key), " that were never received"));
    check_postconditions();
    if (!error_.empty()) return fail(res, error_);
    res.ok = true;
    res.min_quantizations = quant_min_ == (1 << 30) ? 0 : quant_min_;
    res.max_quantizations = quant_max_;
    return res;
  }

 private:
  template <typename... A>
  static std::string cat_str(A&&... a) {
    std::ostringstream os;
    (os << ... << a);
    return os.str();
  }
  static VerifyResult& fail(VerifyResult& res, const std::string& why) {
    res.ok = false;
    res.error = why;
    return res;
  }

  // Cells: per rank, input/output/scratch chunk -> storage index (aliases share one).
  struct RankCells {
    std::vector<int> in, out, scratch;
  };

  void init_cells() {
    cells_.clear();
    map_.assign(prog_.nranks, {});
    for (int r = 0; r < prog_.nranks; ++r) {
      const RankProgram& rp = prog_.ranks[r];
      RankCells& m = map_[r];
      for (int c = 0; c < rp.input.nchunks(); ++c) {
        m.in.push_back(static_cast<int>(cells_.size()));
        Value v;
        v.defined = true;
        v.pristine = true;
        v.contribs = {{r, c}};
        v.version = ++versions_;
        cells_.push_back(v);
      }
      for (int c = 0; c < rp.output.nchunks(); ++c) {
        int alias = opt_.in_place ? in_place_alias(r, c) : -1;
        if (alias >= 0) {
          if (alias >= static_cast<int>(m.in.size())) {
            error_ = cat_str("rank ", r, ": in-place alias of output chunk ", c, " is out of range");
            return;
          }
          m.out.push_back(m.in[alias]);
        } else {
          m.out.push_back(static_cast<int>(cells_.size()));
          cells_.push_back(Value{});
        }
      }
      for (int c = 0; c < rp.scratch.nchunks(); ++c) {
        m.scratch.push_back(static_cast<int>(cells_.size()));
        cells_.push_back(Value{});
      }
    }
  }

  // Input chunk that output chunk `c` of rank `r` shares storage with in place, or -1.
  int in_place_alias(int r, int c) const {
    const RankProgram& rp = prog_.ranks[r];
    const int parts = rp.output.parts;
    switch (prog_.coll) {
      case Coll::AllReduce:
      case Coll::Barrier: return c;
      case Coll::Broadcast:
      case Coll::Reduce: return (prog_.coll == Coll::Broadcast || r == prog_.root) ? c : -1;
      case Coll::AllGather:  // input is output block r
        return c / parts == r ? c % parts : -1;
      case Coll::ReduceScatter:  // output is input block r
        return r * rp.input.parts + c;
      case Coll::Gather:  // the root's input is its output block root
        return r == prog_.root && c / parts == r ? c % parts : -1;
      case Coll::Scatter:  // the root's output is its input block root
        return r == prog_.root ? r * rp.input.parts + c : -1;
      default: return -1;
    }
  }

  int cell_of(int r, const ChunkRef& ref, const char* what, int lane, size_t step) {
    const RankCells& m = map_[r];
    const std::vector<int>* v = ref.buf == BufKind::Input ? &m.in : ref.buf == BufKind::Output ? &m.out : &m.scratch;
    if (ref.chunk < 0 || ref.chunk >= static_cast<int>(v->size())) {
      error_ = where(r, lane, step) + cat_str(": ", what, " chunk ", ref.chunk, " out of range");
      return -1;
    }
    return (*v)[ref.chunk];
  }

  const BufShape& shape_of(int r, const ChunkRef& ref) const {
    const RankProgram& rp = prog_.ranks[r];
    return ref.buf == BufKind::Input ? rp.input : ref.buf == BufKind::Output ? rp.output : rp.scratch;
  }

  int part_of(int r, const ChunkRef& ref) const { return ref.chunk % shape_of(r, ref).parts; }

  std::string where(int r, int lane, size_t step) const {
    const Step& s = prog_.ranks[r].lanes[lane].steps[step];
    return cat_str("rank ", r, " lane ", lane, " step ", step, " (", opcode_name(s.op), ")");
  }

  std::optional<Value> read_src(int r, int lane, size_t step, const Step& s) {
    int cell = cell_of(r, s.src, "src", lane, step);
    if (cell < 0) return std::nullopt;
    const Value& v = cells_[cell];
    if (!v.defined) {
      error_ = where(r, lane, step) + ": reads a chunk that holds no data yet";
      return std::nullopt;
    }
    if (s.src.buf == BufKind::Input) {
      if ((prog_.coll == Coll::Broadcast || prog_.coll == Coll::Scatter) && r != prog_.root) {
        error_ = where(r, lane, step) +
                 cat_str(": reads the input of a non-root rank (", coll_name(prog_.coll), " input is root-only)");
        return std::nullopt;
      }
      if (!v.pristine) {
        error_ = where(r, lane, step) + ": reads an input chunk after it was overwritten (in place)";
        return std::nullopt;
      }
    } else if (v.pristine) {
      // The executor applies premul only to reads through the input; reading the input through an alias would
      // skip it.
      error_ = where(r, lane, step) + ": reads untouched input through a non-input reference";
      return std::nullopt;
    }
    Value out = v;
    out.pristine = false;
    return out;
  }

  bool write_dst(int r, int lane, size_t step, const Step& s, Value v) {
    if (s.dst.buf == BufKind::Input) {
      error_ = where(r, lane, step) + ": writes the input buffer";
      return false;
    }
    if (s.dst.buf == BufKind::Output && (prog_.coll == Coll::Reduce || prog_.coll == Coll::Gather) && r != prog_.root) {
      error_ = where(r, lane, step) +
               cat_str(": writes the output of a non-root rank (", coll_name(prog_.coll), " output is root-only)");
      return false;
    }
    int cell = cell_of(r, s.dst, "dst", lane, step);
    if (cell < 0) return false;
    v.pristine = false;
    v.defined = true;
    const Access& rd = last_read_[static_cast<size_t>(cell)];
    const Value& old = cells_[static_cast<size_t>(cell)];
    const char* what = nullptr;
    if (rd.lane == lane && rd.phase == cur_phase_ && rd.run != cur_dst_run_)
      what = "read";
    else if (old.writer_lane == lane && old.writer_phase == cur_phase_ && old.writer_run != cur_dst_run_)
      what = "written";
    if (what != nullptr) {
      error_ = where(r, lane, step) + cat_str(": overwrites a chunk ", what,
                                              " earlier in the phase through a run that starts elsewhere (slices "
                                              "would not line up: start a phase with a fence)");
      return false;
    }
    v.writer_lane = lane;
    v.writer_phase = cur_phase_;
    v.writer_run = cur_dst_run_;
    cells_[cell] = std::move(v);
    return true;
  }

  // Slice s of a step covers the s-th slice of its run, so a step reading a cell written earlier in the same phase
  // of its lane must read it through a run that starts where the writer's did: else its slice s would need data of
  // another slice of the writer, which runs later.
  bool check_aligned(int r, int lane, size_t step, int cell, int32_t run, const char* what) {
    Access& rd = last_read_[static_cast<size_t>(cell)];
    // Two runs starting at different cells read it in this phase: no later write in the phase lines up with both.
    const bool other_run = rd.lane == lane && rd.phase == cur_phase_ && rd.run != run;
    rd = {lane, cur_phase_, other_run ? kSeveralRuns : run};
    const Value& v = cells_[static_cast<size_t>(cell)];
    if (v.writer_lane != lane || v.writer_phase != cur_phase_ || v.writer_run == run) return true;
    error_ = where(r, lane, step) + cat_str(": reads its ", what,
                                            " through a run that starts elsewhere than the run that wrote it earlier "
                                            "in the phase (slices would not line up: start a phase with a fence)");
    return false;
  }

  using FifoKey = std::tuple<int, int, int>;  // sender, receiver, channel

  bool try_step(int r, int lane, size_t step, VerifyResult& res) {
    const Lane& ln = prog_.ranks[r].lanes[lane];
    const Step& s = ln.steps[step];
    auto check_peer = [&](int peer) {
      if (peer < 0 || peer >= prog_.nranks || peer == r) {
        error_ = where(r, lane, step) + cat_str(": invalid peer ", peer);
        return false;
      }
      return true;
    };
    std::deque<Message>* inq = nullptr;
    std::deque<Message>* outq = nullptr;
    if (op_receives(s.op)) {
      if (!check_peer(s.recv_peer)) return true;
      inq = &fifos_[{s.recv_peer, r, ln.channel}];
      if (inq->empty()) return false;
    }
    if (op_sends(s.op)) {
      if (!check_peer(s.send_peer)) return true;
      outq = &fifos_[{r, s.send_peer, ln.channel}];
      if (static_cast<int>(outq->size()) >= opt_.fifo_capacity) return false;
    }
    const int32_t count = run_count(r, lane, step, s);
    if (count < 1) return true;
    int32_t& phase = phase_[static_cast<size_t>(r)][static_cast<size_t>(lane)];
    if (s.fence && step > 0) ++phase;
    cur_phase_ = phase;
    cur_src_run_ = op_reads_src(s.op) ? cell_of(r, {s.src.buf, s.src.chunk, 1}, "src", lane, step) : -1;
    cur_dst_run_ = op_writes_dst(s.op) ? cell_of(r, {s.dst.buf, s.dst.chunk, 1}, "dst", lane, step) : -1;
    if (!error_.empty()) return true;
    std::optional<Message> msg;
    if (inq) {
      msg = std::move(inq->front());
      inq->pop_front();
      if (msg->coded != ((s.code & kCodedIn) != 0)) {
        error_ = where(r, lane, step) + cat_str(": rank ", s.recv_peer, " sent a ", msg->coded ? "coded" : "plain",
                                                " message where this step expects a ", msg->coded ? "plain" : "coded",
                                                " one");
        return true;
      }
      if (static_cast<int32_t>(msg->values.size()) != count) {
        error_ = where(r, lane, step) + cat_str(": rank ", s.recv_peer, " sent a message of ", msg->values.size(),
                                                " chunk(s) where this step takes ", count);
        return true;
      }
      // Both ends cut the messages of one phase into slices and interleave them the same way only if they group
      // the messages of this connection into phases alike.
      FifoPhases& fp = fifo_phases_[{s.recv_peer, r, ln.channel}];
      const int64_t recv_phase = (int64_t{lane} << 32) | cur_phase_;
      if (fp.any && (msg->phase != fp.send_phase) != (recv_phase != fp.recv_phase)) {
        const bool same = msg->phase == fp.send_phase;
        error_ = where(r, lane, step) +
                 cat_str(": rank ", s.recv_peer, " sent this message and the one before on channel ", ln.channel,
                         same ? " in one phase" : " in two phases", " but this rank takes them in ",
                         same ? "two" : "one", " (their slices would interleave differently: fences must match)");
        return true;
      }
      fp = {true, msg->phase, recv_phase};
    }
    if (!check_code(r, lane, step, s)) return true;
    Message sent;
    sent.coded = (s.code & kCodedOut) != 0;
    sent.phase = (int64_t{lane} << 32) | cur_phase_;
    // A run is its chunks one after another, each as a one-chunk step would treat it; the message carries them all.
    for (int32_t i = 0; i < count; ++i) {
      Step one = s;
      one.src.chunk += i;
      one.dst.chunk += i;
      one.src.count = one.dst.count = 1;
      const Value* in_value = msg ? &msg->values[static_cast<size_t>(i)] : nullptr;
      const int32_t in_part = msg ? msg->parts[static_cast<size_t>(i)] : 0;
      if (!chunk_step(r, lane, step, one, in_value, in_part, outq ? &sent : nullptr)) return true;
    }
    if (outq) {
      outq->push_back(std::move(sent));
      ++res.messages;
    }
    return true;
  }

  // The chunks a step's run covers (its dst's, else its src's), after checking the run: 0 (and error_ set) when
  // it breaks a rule of ChunkRef.
  int32_t run_count(int r, int lane, size_t step, const Step& s) {
    const bool reads = op_reads_src(s.op), writes = op_writes_dst(s.op);
    const int32_t count = writes ? s.dst.count : reads ? s.src.count : 1;
    const char* why = nullptr;
    if ((reads && s.src.count < 1) || (writes && s.dst.count < 1))
      why = ": names a run of no chunks";
    else if (reads && writes && s.src.count != s.dst.count)
      why = ": its src and dst runs differ in length";
    else if (s.code != 0 && count != 1)
      why = ": a coded step names a run of several chunks (the codec keys one chunk)";
    else if (prog_.coll == Coll::AllToAllv &&
             ((reads && crosses_block(r, s.src)) || (writes && crosses_block(r, s.dst))))
      why = ": an all-to-allv run crosses a block boundary (all-to-allv blocks lie anywhere)";
    if (why == nullptr) return count;
    error_ = where(r, lane, step) + why;
    return 0;
  }

  bool crosses_block(int r, const ChunkRef& ref) const {
    const int parts = shape_of(r, ref).parts;
    return parts > 0 && ref.chunk / parts != (ref.chunk + ref.count - 1) / parts;
  }

  // One chunk of a step (`s` names one chunk): `in_value` and `in_part` are what the message brought for it
  // (receiving steps), and what it sends is appended to `sent`. False when it found an error (error_ set).
  bool chunk_step(int r, int lane, size_t step, const Step& s, const Value* in_value, int32_t in_part, Message* sent) {
    std::optional<Value> src;
    if (op_reads_src(s.op)) {
      src = read_src(r, lane, step, s);
      if (!src || !check_aligned(r, lane, step, cell_of(r, s.src, "src", lane, step), cur_src_run_, "src"))
        return false;
    }
    Value result;
    int32_t part = 0;
    switch (s.op) {
      case OpCode::Send:
      case OpCode::Copy:
        result = *src;
        part = part_of(r, s.src);
        break;
      case OpCode::Recv:
      case OpCode::RecvCopySend:
        result = *in_value;
        part = in_part;
        break;
      case OpCode::Reduce: {
        if (!is_reduction(prog_.coll)) {
          error_ = where(r, lane, step) + ": reduces in a collective without a reduction";
          return false;
        }
        int cell = cell_of(r, s.dst, "dst", lane, step);
        if (cell < 0) return false;
        const Value& acc = cells_[cell];
        if (!check_aligned(r, lane, step, cell, cur_dst_run_, "dst")) return false;
        if (!acc.defined || acc.pristine) {
          error_ = where(r, lane, step) + ": reduces into a chunk that holds no partial result";
          return false;
        }
        if (acc.finals > 0 || src->finals > 0) {
          error_ = where(r, lane, step) + ": reduces a value that was already finished";
          return false;
        }
        if (part_of(r, s.dst) != part_of(r, s.src)) {
          error_ = where(r, lane, step) + ": reduces chunks of different parts (sizes may differ)";
          return false;
        }
        result = *src;
        result.contribs = merge(acc.contribs, src->contribs);
        merge_quant(result, acc);
        result.version = ++versions_;
        part = part_of(r, s.src);
        break;
      }
      case OpCode::RecvReduce:
      case OpCode::RecvReduceSend:
      case OpCode::RecvReduceCopySend:
        if (!is_reduction(prog_.coll)) {
          error_ = where(r, lane, step) + ": reduces in a collective without a reduction";
          return false;
        }
        if (in_part != part_of(r, s.src)) {
          error_ = where(r, lane, step) + cat_str(": message of part ", in_part, " reduced with part ",
                                                  part_of(r, s.src), " (sizes may differ)");
          return false;
        }
        if (in_value->finals > 0 || src->finals > 0) {
          error_ = where(r, lane, step) + ": reduces a value that was already finished";
          return false;
        }
        result = *src;
        result.contribs = merge(in_value->contribs, src->contribs);
        merge_quant(result, *in_value);
        result.version = ++versions_;
        part = in_part;
        break;
    }
    if (s.final) {
      if (!is_reduction(prog_.coll)) {
        // Harmless without a reducer, but a program bug all the same.
        error_ = where(r, lane, step) + ": marks a value final in a collective without a reduction";
        return false;
      }
      result.finals += 1;
      result.version = ++versions_;  // the division changes the bits
    }
    if (s.code & kCodedOut) {
      if (s.code & kErrorFeedback) {
        // The residual is added before encoding: new bits, written back to a non-input src.
        result.version = ++versions_;
        if (s.src.buf != BufKind::Input) cells_[cell_of(r, s.src, "src", lane, step)].version = result.version;
      }
      const bool forwards = s.op == OpCode::RecvCopySend && (s.code & kCodedIn);
      if (!forwards) {
        result.version = -result.version;
        result.quant_min += 1;
        result.quant_max += 1;
      }
    }
    if (op_writes_dst(s.op)) {
      if (part_of(r, s.dst) != part) {
        error_ = where(r, lane, step) +
                 cat_str(": writes part ", part, " data into a part ", part_of(r, s.dst), " chunk (sizes may differ)");
        return false;
      }
      if (!write_dst(r, lane, step, s, result)) return false;
    }
    if (sent) {
      sent->values.push_back(std::move(result));
      sent->parts.push_back(part);
    }
    return true;
  }

  static void merge_quant(Value& into, const Value& other) {
    into.quant_min = std::min(into.quant_min, other.quant_min);
    into.quant_max = std::max(into.quant_max, other.quant_max);
  }

  // StepCode bits only where they mean something, and only in a program that says it is compressed.
  bool check_code(int r, int lane, size_t step, const Step& s) {
    if (s.code == 0) return true;
    const char* why = nullptr;
    if (!prog_.compressed)
      why = ": has codec bits in a program that is not compressed";
    else if ((s.code & kCodedIn) && !op_receives(s.op))
      why = ": coded input on a step that receives nothing";
    else if ((s.code & kCodedOut) && !op_sends(s.op) && s.op != OpCode::Copy)
      why = ": coded output on a step that neither sends nor copies";
    else if ((s.code & kErrorFeedback) && (!(s.code & kCodedOut) || !op_reads_src(s.op)))
      why = ": error feedback needs coded output and a src";
    else if (s.code & ~(kCodedIn | kCodedOut | kErrorFeedback))
      why = ": unknown codec bits";
    if (why == nullptr) return true;
    error_ = where(r, lane, step) + why;
    return false;
  }

  std::string deadlock_report(const std::vector<std::vector<size_t>>& pc) const {
    std::ostringstream os;
    os << "deadlock (fifo capacity " << opt_.fifo_capacity << "):";
    int shown = 0;
    for (int r = 0; r < prog_.nranks && shown < 8; ++r) {
      const RankProgram& rp = prog_.ranks[r];
      for (size_t l = 0; l < rp.lanes.size() && shown < 8; ++l) {
        if (pc[r][l] >= rp.lanes[l].steps.size()) continue;
        const Step& s = rp.lanes[l].steps[pc[r][l]];
        os << " [rank " << r << " lane " << l << " step " << pc[r][l] << " " << opcode_name(s.op);
        if (op_receives(s.op)) os << " waits for rank " << s.recv_peer;
        if (op_sends(s.op)) os << " / sends to rank " << s.send_peer;
        os << "]";
        ++shown;
      }
    }
    return os.str();
  }

  void expect(int r, const char* buf, int c, const Value& got, const Contribs& want, int finals) {
    if (!error_.empty()) return;
    if (!got.defined) {
      error_ = cat_str("rank ", r, " ", buf, " chunk ", c, " was never written");
      return;
    }
    if (got.contribs != want || got.finals != finals) {
      std::ostringstream os;
      os << "rank " << r << " " << buf << " chunk " << c << " holds {";
      for (auto& [q, k] : got.contribs) os << "(" << q << "," << k << ")";
      os << "} finished " << got.finals << "x; expected {";
      for (auto& [q, k] : want) os << "(" << q << "," << k << ")";
      os << "} finished " << finals << "x";
      error_ = os.str();
    }
  }

  void check_postconditions() {
    const int n = prog_.nranks;
    const bool red = is_reduction(prog_.coll);
    for (int r = 0; r < n && error_.empty(); ++r) {
      const RankProgram& rp = prog_.ranks[r];
      const int parts = rp.output.parts;
      for (int c = 0; c < rp.output.nchunks(); ++c) {
        const Value& got = cells_[map_[r].out[c]];
        Contribs want;
        const int blk = c / parts, part = c % parts;
        switch (prog_.coll) {
          case Coll::AllReduce:
          case Coll::Barrier:
            for (int q = 0; q < n; ++q) want.push_back({q, c});
            break;
          case Coll::ReduceScatter:
            for (int q = 0; q < n; ++q) want.push_back({q, r * rp.input.parts + part});
            break;
          case Coll::Reduce:
            if (r != prog_.root) continue;  // untouched, checked by write_dst
            for (int q = 0; q < n; ++q) want.push_back({q, c});
            break;
          case Coll::AllGather: want.push_back({blk, part}); break;
          case Coll::Gather:
            if (r != prog_.root) continue;  // untouched, checked by write_dst
            want.push_back({blk, part});
            break;
          case Coll::Scatter: want.push_back({prog_.root, r * rp.input.parts + part}); break;
          case Coll::Broadcast: want.push_back({prog_.root, c}); break;
          case Coll::AllToAll:
          case Coll::AllToAllv: want.push_back({blk, r * rp.input.parts + part}); break;
          default: error_ = "the verifier has no postcondition for " + std::string(coll_name(prog_.coll)); return;
        }
        std::sort(want.begin(), want.end());
        // Untouched in-place data (e.g. all-gather's own block) counts as a copy of itself.
        Value v = got;
        v.pristine = false;
        expect(r, "output", c, v, want, red ? 1 : 0);
        if (got.defined) {
          quant_min_ = std::min(quant_min_, got.quant_min);
          quant_max_ = std::max(quant_max_, got.quant_max);
        }
      }
    }
    // Compressed all-reduce and all-gather: every rank must end with the same bits in every output chunk.
    if (!prog_.compressed || (prog_.coll != Coll::AllReduce && prog_.coll != Coll::AllGather)) return;
    for (int c = 0; c < prog_.ranks[0].output.nchunks() && error_.empty(); ++c)
      for (int r = 1; r < n; ++r)
        if (cells_[map_[r].out[c]].version != cells_[map_[0].out[c]].version) {
          error_ =
              cat_str("output chunk ", c, " of rank ", r,
                      " may differ in its bits from rank 0's: ranks would not end with the same bits (computed or ",
                      "decoded from different codes)");
          return;
        }
  }

 public:
  int quant_min_ = 1 << 30, quant_max_ = 0;

  // After go(): the storage cell of one chunk of rank r (aliases share one), or -1 when out of range.
  int cell(int r, const ChunkRef& ref) const {
    const RankCells& m = map_[static_cast<size_t>(r)];
    const std::vector<int>& v = ref.buf == BufKind::Input ? m.in : ref.buf == BufKind::Output ? m.out : m.scratch;
    return ref.chunk >= 0 && ref.chunk < static_cast<int>(v.size()) ? v[static_cast<size_t>(ref.chunk)] : -1;
  }
  size_t ncells() const { return cells_.size(); }

 private:
  const Program& prog_;
  VerifyOptions opt_;
  std::vector<Value> cells_;
  std::vector<RankCells> map_;
  std::map<FifoKey, std::deque<Message>> fifos_;
  std::string error_;
  int64_t versions_ = 0;
  std::vector<std::vector<int32_t>> phase_;  // per rank and lane: fences passed
  struct Access {
    int32_t lane = -1, phase = -1, run = -1;
  };
  static constexpr int32_t kSeveralRuns = -2;
  std::vector<Access> last_read_;  // per cell: the last read (lane, phase, cell its run starts at or kSeveralRuns)
  struct FifoPhases {
    bool any = false;
    int64_t send_phase = 0, recv_phase = 0;  // of the last message taken from the FIFO
  };
  std::map<FifoKey, FifoPhases> fifo_phases_;
  // Of the step being run: its lane's phase and the cells its src and dst runs start at (-1: none).
  int32_t cur_phase_ = 0, cur_src_run_ = -1, cur_dst_run_ = -1;
};

}  // namespace

bool has_in_place_form(Coll coll) { return coll != Coll::AllToAll && coll != Coll::AllToAllv; }

namespace {

// The executor's walk without data: every step cut into `k` slices per chunk of its run, a lane slice-major within
// a phase and phases in turn, FIFOs of `capacity` slices. The message walk treats a message as a whole, so it cannot
// see a fence that makes one side wait for the whole of a message while the other waits for the first slice of the
// answer; this walk can.
//
// `k` 0: one slice per step, whatever its run (messages smaller than a slice).
//
// It also proves that lanes of one rank that share a chunk are ordered where they touch it. Lanes run concurrently,
// so a slice that one lane writes and another reads or writes needs a chain of messages from the first access to
// the second (in place, the tree all-reduce's way down overwrites what its way up read, after the root answered).
// The walk keeps a vector clock per lane (Lamport, "Time, clocks, and the ordering of events in a distributed
// system", CACM 1978; Mattern, "Virtual time and global states of distributed systems", 1989), with an entry for
// each lane that shares a chunk with another lane of its rank, and checks every access to a slice of such a chunk
// against the last write and the reads since. Messages match in a fixed order (the k-th sent is the k-th received),
// so the order found holds in every run of the program. A sender waiting for FIFO space is not counted as ordering.
// Within a lane's phase, slice s of a later step follows slice s of an earlier one only, so which accesses are
// ordered depends on how many slices each step has: verify() runs the check with several slices per chunk and with
// one per step (a program ordered only by a slice that small messages do not have is caught by the second).
class SliceWalk {
 public:
  // `cell(r, ref)` is the storage cell of one chunk of rank r (in place, aliases share one), of `ncells` in all.
  SliceWalk(const Program& prog, int capacity, int k, std::function<int(int, const ChunkRef&)> cell, size_t ncells)
      : prog_(prog), capacity_(capacity), k_(k), cell_(std::move(cell)) {
    for (int r = 0; r < prog.nranks; ++r) {
      lane_id_.emplace_back();
      for (size_t l = 0; l < prog.ranks[r].lanes.size(); ++l) {
        lane_id_.back().push_back(static_cast<int32_t>(lane_at_.size()));
        lane_at_.push_back({r, static_cast<int32_t>(l)});
      }
    }
    clock_index_.assign(lane_at_.size(), -1);
    find_shared(ncells);
  }

  // Lanes with a clock entry above which the order check is skipped: it costs (lanes with an entry) x (slices
  // received) time, and as much memory per slice in flight.
  static constexpr size_t kMaxOrderedLanes = 4096;

  // "" or the deadlock or unordered access found. `*lanes_ordered` is false when the order check was skipped.
  std::string run(bool* lanes_ordered) {
    const bool order = nordered_ <= kMaxOrderedLanes;
    *lanes_ordered = order;
    if (order && nordered_ > 0) clocks_.assign(lane_at_.size(), Clock(nordered_, 0));
    const bool clocked = !clocks_.empty();
    std::vector<std::vector<LaneAt>> at(static_cast<size_t>(prog_.nranks));
    for (int r = 0; r < prog_.nranks; ++r) {
      at[r].resize(prog_.ranks[r].lanes.size());
      for (size_t l = 0; l < at[r].size(); ++l) at[r][l].done = prog_.ranks[r].lanes[l].steps.empty();
    }
    std::map<FifoKey, std::deque<Clock>> fifos;  // per (sender, receiver, channel): a clock per slice in flight
    for (;;) {
      bool progress = false, all_done = true;
      for (int r = 0; r < prog_.nranks; ++r)
        for (size_t l = 0; l < at[r].size(); ++l) {
          LaneAt& a = at[r][l];
          const Lane& lane = prog_.ranks[r].lanes[l];
          while (!a.done) {
            const Step& s = lane.steps[a.step];
            const size_t ns = slices(s);
            if (a.slice < ns) {
              std::deque<Clock>* in = op_receives(s.op) ? &fifos[{s.recv_peer, r, lane.channel}] : nullptr;
              std::deque<Clock>* out = op_sends(s.op) ? &fifos[{r, s.send_peer, lane.channel}] : nullptr;
              if ((in && in->empty()) || (out && static_cast<int>(out->size()) >= capacity_)) break;
              const int32_t id = lane_id_[r][l];
              if (in) {
                if (clocked) merge(clocks_[id], in->front());
                in->pop_front();
              }
              if (clocked) {
                if (std::string e = access(r, id, a.step, a.slice, s); !e.empty()) return e;
              }
              if (out) out->push_back(clocked ? clocks_[id] : Clock{});
              a.more |= a.slice + 1 < ns;
              progress = true;
            }
            a.done = !next_step_slice(lane.steps.data(), lane.steps.size(), a.phase, a.step, a.slice, a.more);
          }
          all_done &= a.done;
        }
      if (all_done) return "";
      if (!progress) return deadlock_report(at);
    }
  }

 private:
  struct LaneAt {
    size_t phase = 0, step = 0, slice = 0;
    bool more = false, done = false;
  };
  // One access to a slice of a shared cell: the lane (global id), its clock and step.
  struct Access {
    int32_t lane = -1;
    size_t step = 0;
    uint32_t clock = 0;
  };
  struct SliceAccesses {
    Access write;
    std::vector<Access> reads;  // since the write, the latest per lane
  };
  using Clock = std::vector<uint32_t>;
  using FifoKey = std::tuple<int, int, int>;  // sender, receiver, channel

  size_t slices(const Step& s) const {
    const int32_t count = op_writes_dst(s.op) ? s.dst.count : op_reads_src(s.op) ? s.src.count : 1;
    return k_ == 0 ? 1 : static_cast<size_t>(std::max(1, count)) * static_cast<size_t>(k_);
  }

  // What a step reads and writes: f(run, writes).
  template <class F>
  static void for_each_access(const Step& s, F f) {
    if (op_reads_src(s.op)) f(s.src, false);
    if (s.op == OpCode::Reduce) f(s.dst, false);
    if ((s.code & kErrorFeedback) && s.src.buf != BufKind::Input) f(s.src, true);  // rewritten with the residual
    if (op_writes_dst(s.op)) f(s.dst, true);
  }

  // The cells one lane writes and another lane of the same rank reads or writes; the lanes that touch them get a
  // clock entry, and the cells k slices of access records.
  void find_shared(size_t ncells) {
    constexpr int32_t kNone = -1, kSeveral = -2;
    struct Use {
      int32_t writer = kNone, reader = kNone;
    };
    std::vector<Use> use(ncells);
    auto each = [&](auto f) {
      for (int r = 0; r < prog_.nranks; ++r) {
        const RankProgram& rp = prog_.ranks[r];
        if (rp.lanes.size() < 2) continue;  // one lane is ordered by itself
        for (size_t l = 0; l < rp.lanes.size(); ++l)
          for (const Step& s : rp.lanes[l].steps)
            for_each_access(s, [&](const ChunkRef& ref, bool writes) {
              for (int32_t i = 0; i < ref.count; ++i) {
                const int c = cell_(r, ChunkRef{ref.buf, ref.chunk + i, 1});
                if (c >= 0) f(c, lane_id_[r][l], writes);
              }
            });
      }
    };
    each([&](int c, int32_t lane, bool writes) {
      int32_t& who = writes ? use[c].writer : use[c].reader;
      who = who == kNone || who == lane ? lane : kSeveral;
    });
    slot_of_cell_.assign(ncells, -1);
    each([&](int c, int32_t lane, bool) {
      const Use& u = use[c];
      if (u.writer == kNone || (u.writer != kSeveral && (u.reader == kNone || u.reader == u.writer))) return;
      if (clock_index_[lane] < 0) clock_index_[lane] = static_cast<int32_t>(nordered_++);
      if (slot_of_cell_[c] < 0) {
        slot_of_cell_[c] = static_cast<int32_t>(accesses_.size());
        accesses_.resize(accesses_.size() + static_cast<size_t>(std::max(1, k_)));
      }
    });
  }

  static void merge(Clock& into, const Clock& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] = std::max(into[i], from[i]);
  }

  // Slice `slice` of step `step` of lane `id` on rank `r`: checks and records its accesses to shared cells.
  std::string access(int r, int32_t id, size_t step, size_t slice, const Step& s) {
    const int32_t mine = clock_index_[id];
    if (mine < 0) return "";  // touches no shared cell
    Clock& now = clocks_[id];
    ++now[static_cast<size_t>(mine)];
    const Access me{id, step, now[static_cast<size_t>(mine)]};
    // Several slices per chunk: this slice is part `sub` of one chunk of the run. One per step: the whole run.
    const size_t k = static_cast<size_t>(k_);
    const size_t sub = k == 0 ? 0 : slice % k;
    std::string error;
    for_each_access(s, [&](const ChunkRef& run, bool writes) {
      const int32_t first = k == 0 ? 0 : static_cast<int32_t>(slice / k), end = k == 0 ? run.count : first + 1;
      for (int32_t i = first; i < end && error.empty(); ++i)
        access_chunk(r, id, step, slice, s, me, now, ChunkRef{run.buf, run.chunk + i, 1}, sub, writes, error);
    });
    return error;
  }

  void access_chunk(int r, int32_t id, size_t step, size_t slice, const Step& s, const Access& me, const Clock& now,
                    const ChunkRef& ref, size_t sub, bool writes, std::string& error) {
    {
      const int c = cell_(r, ref);
      if (c < 0 || slot_of_cell_[c] < 0) return;
      SliceAccesses& sa = accesses_[static_cast<size_t>(slot_of_cell_[c]) + sub];
      auto unordered = [&](const Access& before) {
        return before.lane >= 0 && before.lane != id &&
               now[static_cast<size_t>(clock_index_[before.lane])] < before.clock;
      };
      if (unordered(sa.write)) {
        error = race(r, id, step, slice, s, ref, writes, sa.write, true);
        return;
      }
      if (writes) {
        for (const Access& rd : sa.reads)
          if (unordered(rd)) {
            error = race(r, id, step, slice, s, ref, true, rd, false);
            return;
          }
        sa.write = me;
        sa.reads.clear();
        return;
      }
      auto it = std::find_if(sa.reads.begin(), sa.reads.end(), [&](const Access& a) { return a.lane == id; });
      if (it == sa.reads.end())
        sa.reads.push_back(me);
      else
        *it = me;
    }
  }

  std::string race(int r, int32_t id, size_t step, size_t slice, const Step& s, const ChunkRef& ref, bool writes,
                   const Access& before, bool before_wrote) const {
    static const char* const kBuf[] = {"input", "output", "scratch"};
    const int32_t other_lane = lane_at_[static_cast<size_t>(before.lane)].lane;
    const Step& other = prog_.ranks[r].lanes[static_cast<size_t>(other_lane)].steps[before.step];
    std::ostringstream os;
    os << "rank " << r << " lane " << lane_at_[static_cast<size_t>(id)].lane << " step " << step << " ("
       << opcode_name(s.op) << ") " << (writes ? "writes " : "reads ") << kBuf[static_cast<int>(ref.buf)] << " chunk "
       << ref.chunk
       << (k_ == 0 ? std::string(" (one slice per step)") : cat_slices(slice % static_cast<size_t>(k_), k_))
       << " that lane " << other_lane << " step " << before.step << " (" << opcode_name(other.op) << ") "
       << (before_wrote ? "wrote" : "read")
       << " with nothing ordering the two: lanes run concurrently, so a chain of messages must lead from one access "
          "to the other (or both belong in one lane)";
    return os.str();
  }

  std::string deadlock_report(const std::vector<std::vector<LaneAt>>& at) const {
    std::ostringstream os;
    os << "deadlock once messages are cut into slices ("
       << (k_ == 0 ? std::string("one per step") : std::to_string(k_) + " per chunk") << ", " << capacity_
       << " slices per connection):";
    int shown = 0;
    for (int r = 0; r < prog_.nranks && shown < 8; ++r)
      for (size_t l = 0; l < at[r].size() && shown < 8; ++l) {
        if (at[r][l].done) continue;
        const Step& s = prog_.ranks[r].lanes[l].steps[at[r][l].step];
        os << " [rank " << r << " lane " << l << " step " << at[r][l].step << " slice " << at[r][l].slice << " "
           << opcode_name(s.op);
        if (op_receives(s.op)) os << " waits for rank " << s.recv_peer;
        if (op_sends(s.op)) os << " / sends to rank " << s.send_peer;
        os << "]";
        ++shown;
      }
    return os.str();
  }

  static std::string cat_slices(size_t sub, int k) {
    return " (slice " + std::to_string(sub) + " of " + std::to_string(k) + ")";
  }

  struct LaneOf {
    int32_t rank = 0, lane = 0;
  };

  const Program& prog_;
  int capacity_, k_;
  std::function<int(int, const ChunkRef&)> cell_;
  std::vector<std::vector<int32_t>> lane_id_;  // per rank and lane: global lane id
  std::vector<LaneOf> lane_at_;                // per global lane id
  std::vector<int32_t> clock_index_;           // per global lane: its entry in the clocks, or -1
  size_t nordered_ = 0;                        // lanes with an entry
  std::vector<Clock> clocks_;                  // per global lane (empty: no order to check)
  std::vector<int32_t> slot_of_cell_;          // per cell: its first slice in `accesses_`, or -1 (not shared)
  std::vector<SliceAccesses> accesses_;        // k per shared cell
};

}  // namespace

namespace {

// Two lanes of one rank that send to one peer on one channel (or receive from one) would put their messages on the
// connection in an order set by timing, while the matching rule pairs them by position: "" or the first such pair.
std::string shared_connection_end(const Program& prog) {
  for (int r = 0; r < static_cast<int>(prog.ranks.size()); ++r) {
    std::map<std::tuple<int, int, bool>, size_t> lane_of;  // (peer, channel, sends) -> lane
    const std::vector<Lane>& lanes = prog.ranks[static_cast<size_t>(r)].lanes;
    for (size_t l = 0; l < lanes.size(); ++l)
      for (const Step& s : lanes[l].steps)
        for (const bool sends : {false, true}) {
          if (sends ? !op_sends(s.op) : !op_receives(s.op)) continue;
          const int peer = sends ? s.send_peer : s.recv_peer;
          const auto [it, fresh] = lane_of.emplace(std::make_tuple(peer, lanes[l].channel, sends), l);
          if (fresh || it->second == l) continue;
          std::ostringstream os;
          os << "rank " << r << " lanes " << it->second << " and " << l << " both "
             << (sends ? "send to" : "receive from") << " rank " << peer << " on channel " << lanes[l].channel
             << ": their messages would meet the connection in an order set by timing (one lane per connection end)";
          return os.str();
        }
  }
  return "";
}

}  // namespace

VerifyResult verify(const Program& program, const VerifyOptions& options) {
  if (std::string e = shared_connection_end(program); !e.empty()) {
    VerifyResult res;
    res.error = std::move(e);
    return res;
  }
  Run run(program, options);
  VerifyResult res = run.go();
  if (!res.ok) return res;
  // Messages of several slices (each chunk cut into capacity + 1, so a message never fits its connection whole),
  // then of one slice per step (small messages), which orders the steps of a phase differently.
  for (const int k : {options.fifo_capacity + 1, 0}) {
    SliceWalk walk(
        program, options.fifo_capacity, k, [&run](int r, const ChunkRef& ref) { return run.cell(r, ref); },
        run.ncells());
    bool ordered = true;
    if (std::string e = walk.run(&ordered); !e.empty()) {
      res.ok = false;
      res.error = std::move(e);
      return res;
    }
    res.lanes_ordered &= ordered;
  }
  return res;
}

}  // namespace chorus::algo
