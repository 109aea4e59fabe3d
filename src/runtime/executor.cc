#include "runtime/executor.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "algorithms/algorithms.h"
#include "core/dtype.h"
#include "core/error.h"

namespace chorus {

using algo::BufKind;
using algo::OpCode;
using algo::Step;

void Layout::set_uniform(BufKind kind, void* base, int nblocks, size_t block_elems, int parts) {
  Buffer& b = bufs_[static_cast<int>(kind)];
  b.base = static_cast<std::byte*>(base);
  b.nblocks = nblocks;
  b.block_elems = block_elems;
  b.block_ptr.clear();
  b.block_elem.clear();
  b.parts = parts;
}

void Layout::set_blocks(BufKind kind, std::vector<std::byte*> ptrs, std::vector<size_t> elems, int parts) {
  Buffer& b = bufs_[static_cast<int>(kind)];
  b.nblocks = static_cast<int>(ptrs.size());
  b.block_ptr = std::move(ptrs);
  b.block_elem = std::move(elems);
  b.parts = parts;
}

Span Layout::chunk(const algo::ChunkRef& ref) const {
  const Buffer& b = bufs_[static_cast<int>(ref.buf)];
  CHORUS_ASSERT(ref.chunk >= 0 && ref.count >= 1);
  const auto parts = static_cast<size_t>(b.parts);
  const size_t first = static_cast<size_t>(ref.chunk), last = first + static_cast<size_t>(ref.count) - 1;
  const size_t block = first / parts, last_block = last / parts;
  CHORUS_ASSERT(last_block < static_cast<size_t>(b.nblocks));
  // Part p of a block of e elements is [e * p / parts, e * (p + 1) / parts).
  auto bound = [parts](size_t e, size_t p) {
    return static_cast<size_t>(static_cast<unsigned __int128>(e) * p / parts);
  };
  if (!b.block_ptr.empty()) {
    CHORUS_ASSERT(block == last_block);  // explicit blocks lie anywhere: a run stays in one (the verifier checks)
    const size_t e = b.block_elem[block];
    const size_t begin = bound(e, first % parts), end = bound(e, last % parts + 1);
    return {b.block_ptr[block] ? b.block_ptr[block] + begin * elem_size : nullptr, end - begin};
  }
  const size_t e = b.block_elems;
  const size_t begin = block * e + bound(e, first % parts), end = last_block * e + bound(e, last % parts + 1);
  return {b.base ? b.base + begin * elem_size : nullptr, end - begin};
}

std::string describe_call(int rank, const WireHeader& h) {
  auto coll = static_cast<algo::Coll>(h.coll);
  if (coll == algo::Coll::SendRecv) return cat("rank ", rank, ": SendRecv");
  return cat("rank ", rank, ": ", algo::coll_name(coll), " #", h.seq);
}

std::string describe_header(const WireHeader& h) {
  // A point-to-point header carries no count or dtype (each message's size is its own): say what it is.
  if (static_cast<algo::Coll>(h.coll) == algo::Coll::SendRecv)
    return cat("SendRecv(point-to-point, seq=", h.seq & ~(uint64_t{1} << 63), ")");
  std::string s = cat(algo::coll_name(static_cast<algo::Coll>(h.coll)), "(count=", h.count, ", ",
                      dtype_name(static_cast<chorusDataType_t>(h.dtype)));
  auto coll = static_cast<algo::Coll>(h.coll);
  if (coll == algo::Coll::AllReduce || coll == algo::Coll::Reduce || coll == algo::Coll::ReduceScatter)
    s += cat(", ", op_name(static_cast<chorusRedOp_t>(h.op)));
  if (algo::rooted(coll)) s += cat(", root=", h.root);
  if (h.algo >= algo::kCompressedIdBase && (h.root & 15) >= 1 && (h.root & 15) <= 5) {
    // Compressed calls carry the codec's fingerprint in the root field (communicator.cc, codec_fingerprint).
    static const char* const kCodecs[] = {"int8", "fp8_e4m3", "int4", "sign1", "sign_vote"};
    const uint32_t f = static_cast<uint32_t>(h.root), b32 = (f >> 6) & 2047u;
    s += cat(", codec=", kCodecs[(f & 15) - 1], " block=", b32 == 2047 ? std::string(">65504") : cat(b32 * 32),
             (f & 16) ? " stochastic" : "", (f & 32) ? " rotation" : "",
             // The hash covers the block too: shown only where a seed and step are used (it then tells them apart
             // when the blocks printed are equal).
             (f & 48) ? cat(" seed/step#", f >> 17) : std::string());
  }
  const algo::AlgorithmInfo* info = algo::algorithm_by_id(h.algo);
  s += cat(", algorithm=", info ? info->name : "?", info && info->id >= algo::kCompressedIdBase ? " (compressed)" : "");
  return s + cat(", seq=", h.seq & ~(uint64_t{1} << 63), ")");
}

bool same_call(const WireHeader& a, const WireHeader& b) {
  return a.comm_id == b.comm_id && a.seq == b.seq && a.coll == b.coll && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root && a.count == b.count && a.algo == b.algo;
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

struct LaneState {
  size_t phase = 0;  // first step of the current phase (Step::fence)
  size_t step = 0;
  size_t slice = 0;
  bool more = false;  // a step of this pass over the phase has slices after `slice`
  bool done = false;
};

class Run {
 public:
  explicit Run(const ExecPlan& p) : p_(p), prog_(*p.program) {
    const size_t nl = prog_.lanes.size();
    lanes_.resize(nl);
    for (size_t l = 0; l < nl; ++l) lanes_[l].done = prog_.lanes[l].steps.empty();
  }

  void run() {
    uint64_t idle = 0;
    auto idle_since = std::chrono::steady_clock::now();
    for (uint64_t iter = 0;; ++iter) {
      bool progress = false, all_done = true;
      for (size_t l = 0; l < lanes_.size(); ++l) {
        if (lanes_[l].done) continue;
        progress |= advance(l);
        all_done &= lanes_[l].done;
      }
      if (all_done) break;
      for (Connection* c : *p_.all_conns) progress |= c->progress();
      if ((iter & 255) == 0 && p_.check_abort) p_.check_abort();
      if (progress) {
        idle = 0;
        continue;
      }
      if (idle++ == 0) idle_since = std::chrono::steady_clock::now();
      wait_a_little(idle, idle_since, blocked_);
    }
    // Flush: messages committed to a pumped transport must leave before the call returns.
    for (uint64_t idle2 = 1;; ++idle2) {
      bool idle_all = true, moved = false;
      Blocked pending;
      for (Connection* c : *p_.all_conns) {
        moved |= c->progress();
        if (!c->send_idle()) pending = {c, false};
        idle_all &= c->send_idle();
      }
      if (idle_all) break;
      if (moved) idle_since = std::chrono::steady_clock::now();
      wait_a_little(idle2, idle_since, pending);
    }
  }

 private:
  size_t step_elems(const Step& s) const {
    if (algo::op_writes_dst(s.op)) return p_.layout->chunk(s.dst).elems;
    if (algo::op_reads_src(s.op)) return p_.layout->chunk(s.src).elems;
    return 0;
  }
  // Every step has at least one slice (possibly empty), so even a zero-byte call exchanges its headers.
  size_t nslices(const Step& s) const {
    return std::max<size_t>(1, (step_elems(s) + p_.slice_elems - 1) / p_.slice_elems);
  }

  struct Blocked {
    Connection* conn = nullptr;
    bool on_recv = false;
  };

  // Spin for a few microseconds (the answer usually comes that fast when every rank has a core); with more ranks
  // than cores, yield instead, so the rank we wait for gets the core; then sleep on the connection the stalled
  // step waits for. Sleeps are short, so other lanes, aborts and the deadline are re-checked often.
  void wait_a_little(uint64_t idle, std::chrono::steady_clock::time_point since, Blocked blocked) {
    const auto waited = std::chrono::steady_clock::now() - since;
    if (waited < std::chrono::microseconds(p_.spin_us)) {
      cpu_relax();
      return;
    }
    if ((idle & 63) == 0) {
      if (p_.check_abort) p_.check_abort();
      if (p_.deadline.passed()) timeout(since);
    }
    if ((idle & 63) == 0) {
      check_foreign_messages();
      // Every connection of the communicator and the bootstrap's queue: at most every 10 ms.
      const auto now = std::chrono::steady_clock::now();
      if (p_.check_peers && now - last_peer_check_ >= std::chrono::milliseconds(10)) {
        last_peer_check_ = now;
        p_.check_peers();
      }
    }
    if (waited < std::chrono::microseconds(p_.spin_us + p_.yield_us) || blocked.conn == nullptr) {
      sched_yield();
      return;
    }
    const int us = lanes_.size() > 1 ? 200 : 1000;
    if (blocked.conn->poll_fd() >= 0) {
      wait_sockets(us);
    } else if (blocked.on_recv) {
      blocked.conn->wait_recv(us);
    } else {
      blocked.conn->wait_send(us);
    }
  }

  // While stalled, look at what waits at the head of every connection of the call: a message of this very call
  // number with another fingerprint (another root, say, whose chain never sends us what we wait for) is a mismatch
  // that would otherwise only end at the deadline. Messages of later calls are a peer running ahead: fine.
  void check_foreign_messages() const {
    for (Connection* c : *p_.all_conns) {
      MessageView m;
      try {
        m = c->recv_peek();
      } catch (const Error&) {
        continue;  // a peer done with its part may have closed; a step that still needs it reports that
      }
      if (m.header && m.header->seq == p_.header.seq && !same_call(*m.header, p_.header))
        throw Error(chorusRemoteError, Subsys::Runtime,
                    cat(describe_call(p_.rank, p_.header), ": mismatched collective: this rank called ",
                        describe_header(p_.header), " but rank ", c->peer(), " called ", describe_header(*m.header)));
    }
  }

  // Sleeps until any descriptor of the call can move bytes: a socket readable, or writable with bytes queued; an
  // event fd (UCX worker, verbs completion channel) signalled. Connections sharing one descriptor are armed once.
  void wait_sockets(int timeout_us) {
    fds_.clear();
    for (Connection* c : *p_.all_conns) {
      const int fd = c->poll_fd();
      if (fd < 0) continue;
      if (std::any_of(fds_.begin(), fds_.end(), [fd](const pollfd& p) { return p.fd == fd; })) continue;
      const short events = c->arm_poll();
      if (events == 0) return;  // something is pending already: go and progress it
      fds_.push_back({fd, events, 0});
    }
    poll(fds_.data(), fds_.size(), std::max(1, timeout_us / 1000));
  }

  // `last_progress`: when a step last ran (the idle wait began).
  [[noreturn]] void timeout(std::chrono::steady_clock::time_point last_progress) {
    std::string waiting;
    for (size_t l = 0; l < lanes_.size() && waiting.empty(); ++l) {
      if (lanes_[l].done) continue;
      const Step& s = prog_.lanes[l].steps[lanes_[l].step];
      const StepConns& c = (*p_.conns)[l][lanes_[l].step];
      if (c.recv && !c.recv->recv_peek().header)
        waiting = cat("waiting for data from rank ", s.recv_peer);
      else if (c.send)
        waiting = cat("waiting for rank ", s.send_peer, " to free a slot (it has not taken the slices sent)");
      else
        waiting = "waiting";
      waiting += cat(" (channel ", prog_.lanes[l].channel, ", step ", lanes_[l].step, " ", algo::opcode_name(s.op),
                     ", slice ", lanes_[l].slice, ")");
    }
    if (waiting.empty()) waiting = "sending its last slices (the peers have not taken them)";  // the flush
    // A deadline that passes while slices still arrive is a call too long for it (much data over a slow link), not a
    // peer that stopped: say so, and what to raise.
    const auto now = std::chrono::steady_clock::now();
    const auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress).count();
    const auto ran_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - start_).count();
    if (idle_ms < kStillMovingMs && ran_ms > 2 * idle_ms)
      waiting += cat("; data still moved (last ", idle_ms, " ms before this, ", ran_ms,
                     " ms into the call): CHORUS_TIMEOUT_MS bounds each whole call, raise it for calls that move this "
                     "much data over these links");
    throw Error(chorusTimeout, Subsys::Runtime, cat(describe_call(p_.rank, p_.header), ": timed out ", waiting));
  }

  static constexpr int64_t kStillMovingMs = 1000;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  // Runs as many steps of lane l as are ready. Returns true if any ran.
  bool advance(size_t l) {
    LaneState& ls = lanes_[l];
    const auto& steps = prog_.lanes[l].steps;
    bool moved = false;
    while (!ls.done) {
      const size_t ns = nslices(steps[ls.step]);
      if (ls.slice < ns) {
        if (!try_step(steps[ls.step], (*p_.conns)[l][ls.step], ls.slice)) return moved;
        moved = true;
        ls.more |= ls.slice + 1 < ns;
      }
      ls.done = !algo::next_step_slice(steps.data(), steps.size(), ls.phase, ls.step, ls.slice, ls.more);
    }
    return moved;
  }

  Span slice_of(const algo::ChunkRef& ref, size_t slice) const {
    Span c = p_.layout->chunk(ref);
    size_t begin = std::min(c.elems, slice * p_.slice_elems);
    size_t n = std::min(c.elems - begin, p_.slice_elems);
    return {c.ptr ? c.ptr + begin * p_.layout->elem_size : nullptr, n};
  }

  void check_header(const WireHeader& got, const Step& s, size_t bytes, bool last) const {
    const WireHeader& want = p_.header;
    if (!same_call(got, want)) {
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat(describe_call(p_.rank, p_.header), ": mismatched collective: this rank called ",
                      describe_header(want), " but rank ", s.recv_peer, " called ", describe_header(got),
                      got.comm_id != want.comm_id ? " on another communicator" : ""));
    }
    const bool their_last = (got.flags & WireHeader::kLastSlice) != 0;
    if (got.bytes != bytes || their_last != last)
      throw Error(chorusRemoteError, Subsys::Runtime,
                  cat(describe_call(p_.rank, p_.header), ": rank ", s.recv_peer, " sent a slice of ", got.bytes,
                      " bytes", their_last ? " that ends its message" : " with more of its message to follow",
                      " where this rank expected one of ", bytes, " bytes",
                      last ? " that ends the message" : " with more of the message to follow",
                      ": the two sides' counts disagree"));
  }

  bool try_step(const Step& s, const StepConns& c, size_t slice) {
    MessageView in;
    std::byte* out = nullptr;
    if (c.recv) {
      in = c.recv->recv_peek();
      if (!in.header) {
        blocked_ = {c.recv, true};
        return false;
      }
    }
    if (c.send) {
      out = c.send->send_slot();
      if (!out) {
        blocked_ = {c.send, false};
        return false;
      }
    }
    const kernels::Reducer* red = p_.reducer;
    const size_t esz = p_.layout->elem_size;
    Span src, dst;
    if (algo::op_reads_src(s.op)) src = slice_of(s.src, slice);
    if (algo::op_writes_dst(s.op)) dst = slice_of(s.dst, slice);
    const size_t n = algo::op_writes_dst(s.op) ? dst.elems : src.elems;
    const bool src_input = s.src.buf == BufKind::Input;
    const bool last = slice + 1 == nslices(s);
    if (s.code != 0) {
      coded_step(s, c, in, out, src, dst, n, slice, last);
      return true;
    }
    if (cache_ptr_ != nullptr && dst.ptr == cache_ptr_) cache_ptr_ = nullptr;
    if (c.recv) check_header(*in.header, s, n * esz, last);
    auto copy = [&](std::byte* to, const std::byte* from, bool from_input, bool fin) {
      if (red) {
        red->copy(to, from, n, from_input, fin);
      } else if (to != from && n > 0) {
        std::memcpy(to, from, n * esz);
      }
    };
    switch (s.op) {
      case OpCode::Send: copy(out, src.ptr, src_input, false); break;
      case OpCode::Recv: copy(dst.ptr, in.payload, false, s.final); break;
      case OpCode::Copy:
        if (dst.ptr != src.ptr || (red && ((src_input && red->spec().premul) || s.final)))
          copy(dst.ptr, src.ptr, src_input, s.final);
        break;
      case OpCode::RecvReduce: red->reduce(dst.ptr, in.payload, src.ptr, n, src_input, s.final); break;
      case OpCode::Reduce: red->reduce(dst.ptr, dst.ptr, src.ptr, n, src_input, s.final); break;
      case OpCode::RecvReduceSend: red->reduce(out, in.payload, src.ptr, n, src_input, s.final); break;
      case OpCode::RecvReduceCopySend:
        red->reduce(dst.ptr, in.payload, src.ptr, n, src_input, s.final);
        if (n > 0) std::memcpy(out, dst.ptr, n * esz);
        break;
      case OpCode::RecvCopySend:
        if (n > 0) {
          std::memcpy(dst.ptr, in.payload, n * esz);
          std::memcpy(out, in.payload, n * esz);
        }
        break;
    }
    if (c.send) {
      WireHeader h = p_.header;
      h.bytes = static_cast<uint32_t>(n * esz);
      h.flags = last ? WireHeader::kLastSlice : 0;
      c.send->send_commit(h);
    }
    if (c.recv) c.recv->recv_release();
    return true;
  }

  // A step with StepCode bits (algo::StepCode in program.h gives the rules): the value is formed from the decoded
  // message and src (in place where it can be, else in fp32 scratch), then encoded into the outgoing slot; a step
  // that writes dst writes what the receivers will decode. Float32 only (validated by the communicator).
  // Encodes of the same slice (the owner's result sent to every peer) reuse the first encode's bytes.
  void coded_step(const Step& s, const StepConns& c, MessageView in, std::byte* out, Span src, Span dst, size_t n,
                  size_t slice, bool last) {
    const WireCodec& codec = *p_.codec;
    const kernels::Reducer* red = p_.reducer;
    const bool coded_in = s.code & algo::kCodedIn, coded_out = s.code & algo::kCodedOut;
    const bool src_input = s.src.buf == BufKind::Input;
    if (c.recv) check_header(*in.header, s, coded_in ? codec.encoded_bytes(n) : n * sizeof(float), last);
    if (c.send && (coded_out ? codec.encoded_bytes(n) : n * sizeof(float)) > c.send->slot_bytes())
      throw Error(chorusInternalError, Subsys::Runtime,
                  cat(describe_call(p_.rank, p_.header), ": a message of ", n, " elements does not fit a slot of ",
                      c.send->slot_bytes(), " bytes"));
    if (value_.size() < n) {
      value_.resize(n);
      decoded_.resize(n);
    }
    float* v = value_.data();
    auto fp = [](std::byte* b) { return reinterpret_cast<float*>(b); };
    auto bytes = [](const float* f) { return reinterpret_cast<const std::byte*>(f); };
    const bool transform_src = s.final || (red && src_input && red->spec().premul);
    const float* m = nullptr;  // the message's values
    if (c.recv) {
      if (!coded_in) {
        m = reinterpret_cast<const float*>(in.payload);
      } else if (s.op == OpCode::RecvReduce && !coded_out && dst.ptr == src.ptr && !transform_src &&
                 red->spec().kind == kernels::ReduceKind::Sum) {
        codec.decode_accumulate(in.payload, n, fp(dst.ptr));  // acc += D(message): one pass
        if (cache_ptr_ == dst.ptr) cache_ptr_ = nullptr;
        finish_step(c, 0, last);
        return;
      } else {
        codec.decode(in.payload, n, decoded_.data());
        m = decoded_.data();
      }
    }
    // The value of the step, as the uncompressed op would produce it; written straight to dst when dst keeps it.
    const bool value_to_dst = algo::op_writes_dst(s.op) && !coded_out;
    float* into = value_to_dst ? fp(dst.ptr) : v;
    const float* val = into;
    switch (s.op) {
      case OpCode::Send:
      case OpCode::Copy:
        if (!transform_src && !value_to_dst) {
          val = fp(src.ptr);
        } else if (red) {
          red->copy(into, src.ptr, n, src_input, s.final);
        } else if (n > 0 && into != fp(src.ptr)) {
          std::memcpy(into, src.ptr, n * sizeof(float));
        }
        break;
      case OpCode::Recv:
      case OpCode::RecvCopySend:
        if (!s.final && !value_to_dst) {
          val = m;
        } else if (red) {
          red->copy(into, bytes(m), n, false, s.final);
        } else if (n > 0) {
          std::memcpy(into, m, n * sizeof(float));
        }
        break;
      case OpCode::RecvReduce:
      case OpCode::RecvReduceSend:
      case OpCode::RecvReduceCopySend: red->reduce(into, bytes(m), src.ptr, n, src_input, s.final); break;
      case OpCode::Reduce: red->reduce(into, dst.ptr, src.ptr, n, src_input, s.final); break;
    }
    if (value_to_dst && cache_ptr_ == dst.ptr) cache_ptr_ = nullptr;  // the cached codes' source changed
    size_t out_bytes = n * sizeof(float);
    if (!coded_out) {
      if (out && n > 0) std::memcpy(out, val, n * sizeof(float));
      finish_step(c, out_bytes, last);
      return;
    }
    float* residual = nullptr;
    if ((s.code & algo::kErrorFeedback) && p_.residual) {
      residual = reinterpret_cast<float*>(slice_in(*p_.residual, s.src, slice).ptr);
      if (val != v && n > 0) std::memcpy(v, val, n * sizeof(float));
      for (size_t i = 0; i < n; ++i) v[i] += residual[i];
      val = v;
      if (!src_input && n > 0) {
        std::memcpy(src.ptr, v, n * sizeof(float));  // later encodes of src agree
        if (cache_ptr_ == src.ptr) cache_ptr_ = nullptr;
      }
    }
    out_bytes = codec.encoded_bytes(n);
    if (out == nullptr) {  // a coded copy: encode aside
      if (code_.size() < out_bytes) code_.resize(out_bytes);
      out = code_.data();
    }
    // The slice whose codes these are, when they come from a chunk (the cache key).
    const std::byte* origin = algo::op_reads_src(s.op) && val == fp(src.ptr) ? src.ptr : nullptr;
    if (s.op == OpCode::RecvCopySend && coded_in) {
      std::memcpy(out, in.payload, out_bytes);  // forward the codes exactly as they came
    } else if (origin != nullptr && origin == cache_ptr_ && n == cache_n_) {
      if (out != cache_.data()) std::memcpy(out, cache_.data(), out_bytes);
    } else {
      codec.encode(val, n, out, key(algo::op_reads_src(s.op) ? s.src : s.dst, slice));
      if (origin != nullptr) {
        if (cache_.size() < out_bytes) cache_.resize(out_bytes);
        std::memcpy(cache_.data(), out, out_bytes);
        cache_ptr_ = origin;
        cache_n_ = n;
      }
    }
    if (algo::op_writes_dst(s.op) || residual) {
      // What the receivers get: into dst directly unless the residual needs it first.
      float* d = algo::op_writes_dst(s.op) && !residual && dst.ptr != src.ptr ? fp(dst.ptr) : decoded_.data();
      codec.decode(out, n, d);
      if (residual)
        for (size_t i = 0; i < n; ++i)
          if (std::isfinite(d[i])) residual[i] = v[i] - d[i];  // a non-finite block keeps its residual
      if (algo::op_writes_dst(s.op)) {
        if (d != fp(dst.ptr) && n > 0) std::memcpy(dst.ptr, d, n * sizeof(float));
        if (cache_ptr_ == dst.ptr) cache_ptr_ = nullptr;
      }
    }
    finish_step(c, out_bytes, last);
  }

  void finish_step(const StepConns& c, size_t out_bytes, bool last) {
    if (c.send) {
      WireHeader h = p_.header;
      h.bytes = static_cast<uint32_t>(out_bytes);
      h.flags = last ? WireHeader::kLastSlice : 0;
      c.send->send_commit(h);
    }
    if (c.recv) c.recv->recv_release();
  }

  Span slice_in(const Layout& layout, const algo::ChunkRef& ref, size_t slice) const {
    Span c = layout.chunk(ref);
    size_t begin = std::min(c.elems, slice * p_.slice_elems);
    return {c.ptr ? c.ptr + begin * sizeof(float) : nullptr, std::min(c.elems - begin, p_.slice_elems)};
  }

  // Stochastic-rounding position of a slice: buffer, chunk and element offset, so distinct slices get distinct
  // element ranges and two encodes of one chunk's slice get the same codes.
  uint64_t key(const algo::ChunkRef& ref, size_t slice) const {
    return (static_cast<uint64_t>(ref.buf) << 60) + (static_cast<uint64_t>(static_cast<uint32_t>(ref.chunk)) << 36) +
           slice * p_.slice_elems;
  }

  const ExecPlan& p_;
  const algo::RankProgram& prog_;
  std::vector<float> value_, decoded_;  // one slice: the step's value and a decoded message
  std::vector<std::byte> code_;         // codes of a coded copy
  std::vector<std::byte> cache_;        // the last codes encoded from a chunk's slice, and that slice
  const std::byte* cache_ptr_ = nullptr;
  size_t cache_n_ = 0;
  std::vector<LaneState> lanes_;
  Blocked blocked_;                                          // what the last step that could not run waits for
  std::chrono::steady_clock::time_point last_peer_check_{};  // when check_peers last ran
  std::vector<pollfd> fds_;  // every socket of the call (a tree over tcp has many), reused between sleeps
};

}  // namespace

void execute(const ExecPlan& plan) {
  Run run(plan);
  run.run();
}

}  // namespace chorus
