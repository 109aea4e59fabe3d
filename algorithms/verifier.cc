#include "algorithms/verifier.h"

#include <algorithm>
#include <deque>
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
};

struct Message {
  Value value;
  int32_t part = 0;  // size class of the chunk it was made from
  bool coded = false;
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

  int part_of(int r, const ChunkRef& ref) const {
    const RankProgram& rp = prog_.ranks[r];
    const BufShape& s = ref.buf == BufKind::Input ? rp.input : ref.buf == BufKind::Output ? rp.output : rp.scratch;
    return ref.chunk % s.parts;
  }

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
      if (prog_.coll == Coll::Broadcast && r != prog_.root) {
        error_ = where(r, lane, step) + ": reads the input of a non-root rank (broadcast input is root-only)";
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
    if (s.dst.buf == BufKind::Output && prog_.coll == Coll::Reduce && r != prog_.root) {
      error_ = where(r, lane, step) + ": writes the output of a non-root rank (reduce output is root-only)";
      return false;
    }
    int cell = cell_of(r, s.dst, "dst", lane, step);
    if (cell < 0) return false;
    v.pristine = false;
    v.defined = true;
    cells_[cell] = std::move(v);
    return true;
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
    }
    if (!check_code(r, lane, step, s)) return true;
    std::optional<Value> src;
    if (op_reads_src(s.op)) {
      src = read_src(r, lane, step, s);
      if (!src) return true;
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
        result = msg->value;
        part = msg->part;
        break;
      case OpCode::Reduce: {
        if (!is_reduction(prog_.coll)) {
          error_ = where(r, lane, step) + ": reduces in a collective without a reduction";
          return true;
        }
        int cell = cell_of(r, s.dst, "dst", lane, step);
        if (cell < 0) return true;
        const Value& acc = cells_[cell];
        if (!acc.defined || acc.pristine) {
          error_ = where(r, lane, step) + ": reduces into a chunk that holds no partial result";
          return true;
        }
        if (acc.finals > 0 || src->finals > 0) {
          error_ = where(r, lane, step) + ": reduces a value that was already finished";
          return true;
        }
        if (part_of(r, s.dst) != part_of(r, s.src)) {
          error_ = where(r, lane, step) + ": reduces chunks of different parts (sizes may differ)";
          return true;
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
          return true;
        }
        if (msg->part != part_of(r, s.src)) {
          error_ = where(r, lane, step) + cat_str(": message of part ", msg->part, " reduced with part ",
                                                  part_of(r, s.src), " (sizes may differ)");
          return true;
        }
        if (msg->value.finals > 0 || src->finals > 0) {
          error_ = where(r, lane, step) + ": reduces a value that was already finished";
          return true;
        }
        result = *src;
        result.contribs = merge(msg->value.contribs, src->contribs);
        merge_quant(result, msg->value);
        result.version = ++versions_;
        part = msg->part;
        break;
    }
    if (s.final) {
      if (!is_reduction(prog_.coll)) {
        // Harmless without a reducer, but a program bug all the same.
        error_ = where(r, lane, step) + ": marks a value final in a collective without a reduction";
        return true;
      }
      result.finals += 1;
      result.version = ++versions_;  // the division changes the bits
    }
    bool coded_out = false;
    if (s.code & kCodedOut) {
      coded_out = true;
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
        return true;
      }
      if (!write_dst(r, lane, step, s, result)) return true;
    }
    if (outq) {
      outq->push_back(Message{result, part, coded_out});
      ++res.messages;
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

 private:
  const Program& prog_;
  VerifyOptions opt_;
  std::vector<Value> cells_;
  std::vector<RankCells> map_;
  std::map<FifoKey, std::deque<Message>> fifos_;
  std::string error_;
  int64_t versions_ = 0;
};

}  // namespace

bool has_in_place_form(Coll coll) { return coll != Coll::AllToAll && coll != Coll::AllToAllv; }

VerifyResult verify(const Program& program, const VerifyOptions& options) {
  Run run(program, options);
  return run.go();
}

}  // namespace chorus::algo
