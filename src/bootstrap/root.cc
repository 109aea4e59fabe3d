#include "bootstrap/root.h"

#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* msg_type_name(uint32_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::Join: return "Join";
    case MsgType::Allgather: return "Allgather";
    case MsgType::Barrier: return "Barrier";
    case MsgType::P2p: return "P2p";
    case MsgType::Error: return "Error";
    case MsgType::Bye: return "Bye";
    case MsgType::StatusQuery: return "StatusQuery";
    case MsgType::Rendezvous: return "Rendezvous";
    case MsgType::AllgatherResult: return "AllgatherResult";
    case MsgType::BarrierResult: return "BarrierResult";
    case MsgType::Deliver: return "Deliver";
    case MsgType::Failure: return "Failure";
    case MsgType::Reject: return "Reject";
    case MsgType::Status: return "Status";
  }
  return "unknown";
}

void encode_header(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  put_u32(out, h.type);
  put_u32(out + 4, static_cast<uint32_t>(h.from));
  put_u32(out + 8, static_cast<uint32_t>(h.to));
  put_u32(out + 12, h.tag);
  put_u64(out + 16, h.length);
}

FrameHeader decode_header(const uint8_t in[kFrameHeaderBytes]) {
  FrameHeader h;
  h.type = get_u32(in);
  h.from = static_cast<int32_t>(get_u32(in + 4));
  h.to = static_cast<int32_t>(get_u32(in + 8));
  h.tag = get_u32(in + 12);
  h.length = get_u64(in + 16);
  return h;
}

std::vector<uint8_t> make_frame(MsgType type, int32_t from, int32_t to, uint32_t tag, const void* payload,
                                size_t bytes) {
  std::vector<uint8_t> frame(kFrameHeaderBytes + bytes);
  encode_header(FrameHeader{static_cast<uint32_t>(type), from, to, tag, bytes}, frame.data());
  if (bytes > 0) std::memcpy(frame.data() + kFrameHeaderBytes, payload, bytes);
  return frame;
}

namespace {

template <typename Blobs>
size_t blob_list_bytes(const Blobs& blobs) {
  size_t total = 0;
  for (const auto& b : blobs) total += 8 + b.size();
  return total;
}

// Writes the blob list at `p`, which has room for blob_list_bytes(blobs).
template <typename Blobs>
void write_blob_list(const Blobs& blobs, uint8_t* p) {
  for (const auto& b : blobs) {
    put_u64(p, b.size());
    if (!b.empty()) std::memcpy(p + 8, b.data(), b.size());
    p += 8 + b.size();
  }
}

}  // namespace

std::vector<uint8_t> encode_blobs(const std::vector<Blob>& blobs) {
  std::vector<uint8_t> out(blob_list_bytes(blobs));
  write_blob_list(blobs, out.data());
  return out;
}

std::vector<Blob> decode_blobs(std::span<const uint8_t> payload, size_t count) {
  std::vector<Blob> blobs(count);
  size_t off = 0;
  for (size_t i = 0; i < count; ++i) {
    if (payload.size() - off < 8)
      throw Error(chorusSystemError, Subsys::Bootstrap, cat("malformed blob list: truncated before blob ", i));
    uint64_t len = get_u64(payload.data() + off);
    off += 8;
    if (len > payload.size() - off)
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("malformed blob list: blob ", i, " claims ", len, " bytes, ", payload.size() - off, " remain"));
    const auto* start = reinterpret_cast<const std::byte*>(payload.data() + off);
    blobs[i].assign(start, start + len);
    off += len;
  }
  if (off != payload.size())
    throw Error(chorusSystemError, Subsys::Bootstrap,
                cat("malformed blob list: ", payload.size() - off, " bytes after ", count, " blobs"));
  return blobs;
}

namespace {

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  int busy = 0;         // services with a joined rank still connected
  int busy_failed = 0;  // of them, those whose job failed: every rank still connected was told
  // Per unique id served here (RootOptions::one_rendezvous), once nobody can join: what happened
  // (root_closed_here). The most recent kMaxClosed only, oldest first in `closed_order`.
  std::map<Secret, std::string> closed;
  std::set<Secret> completed;  // of `closed`, those whose rendezvous completed (every rank joined)
  std::deque<Secret> closed_order;
  std::multiset<Secret> serving;  // secrets of the services whose thread is running (root_serving_here)
};
constexpr size_t kMaxClosed = 4096;

Registry& registry() {
  static Registry* r = new Registry();  // never freed: detached service threads may outlive static destruction
  return *r;
}

void set_closed(const Secret& secret, const std::string& what, bool completed) {
  std::lock_guard<std::mutex> lock(registry().mu);
  Registry& r = registry();
  if (completed) r.completed.insert(secret);
  if (r.closed.insert_or_assign(secret, what).second) {
    r.closed_order.push_back(secret);
    if (r.closed_order.size() > kMaxClosed) {
      r.closed.erase(r.closed_order.front());
      r.completed.erase(r.closed_order.front());
      r.closed_order.pop_front();
    }
  }
}

// A connection is closed if its peer queues more output than this without reading it: it is stuck or hostile.
constexpr size_t kMaxQueuedBytes = size_t{2} << 30;
// Ranks in one rendezvous; bounds what a Join can make the root allocate.
constexpr int32_t kMaxRanks = 1 << 24;
// Frames handled per connection per poll wake-up, so one chatty rank cannot starve the others.
constexpr int kFramesPerWake = 64;
// How long a refused joiner gets to read its Reject before its connection is closed anyway.
constexpr int kRejectLingerMs = 2000;
// How long to stop accepting after accept() failed for lack of resources.
constexpr int kAcceptPauseMs = 100;

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  size_t shown = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (shown++ == 32) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + (i == j ? cat(ranks[i]) : cat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return out;
}

class RootService {
 public:
  RootService(Socket listener, const Secret& secret, const RootOptions& options)
      : listener_(std::move(listener)),
        addr_(sockaddr_to_string(listener_.local_addr())),
        secret_(secret),
        options_(options) {}

  // Thread body: runs until finished(); never throws.
  void run() {
    try {
      loop();
      CHORUS_INFO(Bootstrap, "root %s: every rank has left; service stopped", addr_.c_str());
    } catch (const std::exception& e) {
      CHORUS_WARN(Bootstrap, "root %s: service stopped by an error: %s", addr_.c_str(), e.what());
    }
    // OpenSSL keeps per-thread state (its error queue) for this detached thread. It is freed here, before the
    // service stops counting as busy: a process exit waits for busy services only, and would otherwise race the
    // thread's own teardown (LeakSanitizer then reported that state as leaked).
    OPENSSL_thread_stop();
    if (options_.one_rendezvous)
      set_closed(secret_,
                 phase_ == Phase::Gathering ? cat("its service at ", addr_, " stopped")
                                            : cat(closed_text(), " and its service has stopped"),
                 phase_ == Phase::Complete);
    set_busy(false);
  }

  // For root_closed_here, once nobody can join: how the rendezvous ended.
  std::string closed_text() const {
    return phase_ == Phase::Complete ? cat("its rendezvous at ", addr_, " completed (all ", nranks_, " ranks joined)")
                                     : cat("its rendezvous at ", addr_, " failed (", failure_text_, ")");
  }

 private:
  enum class ConnState { Authenticating, AwaitJoin, Joined, Rejected, Closed };
  enum class Phase { Gathering, Complete, Failed };
  enum class ReadState { Header, Payload };
  using Buffer = std::shared_ptr<const std::vector<uint8_t>>;

  struct Conn {
    Socket sock;
    std::string peer;
    ConnState state = ConnState::Authenticating;
    std::unique_ptr<AuthServer> auth;
    Deadline deadline = Deadline::never();  // to authenticate and join, or (Rejected) to flush the Reject
    int rank = -1;
    bool said_bye = false;
    bool reported = false;  // its failure was already broadcast: closing adds nothing
    ReadState read_state = ReadState::Header;
    uint8_t header_bytes[kFrameHeaderBytes] = {};
    size_t got = 0;
    FrameHeader header;
    std::vector<uint8_t> payload;
    std::deque<std::pair<Buffer, size_t>> out;  // frames and the offset already sent of the first
    size_t out_bytes = 0;
  };

  // Allgather / barrier rounds of one (type, tag): the k-th contribution of each rank belongs to round k.
  struct Round {
    std::vector<std::vector<uint8_t>> blobs;  // the payloads as received: gathering copies nothing
    std::vector<bool> have;
    int count = 0;
  };

  void loop() {
    std::vector<pollfd> pfds;
    for (;;) {
      pfds.clear();
      // At max_pending connections authenticating, the next ones wait in the listen backlog (the kernel's, bounded)
      // until some are through: a flood cannot exhaust descriptors, and a job of more ranks than that still joins.
      if (listener_.valid() && accept_pause_.passed() && authenticating() < options_.max_pending)
        pfds.push_back({listener_.fd(), POLLIN, 0});
      const size_t base = pfds.size();
      const size_t polled = conns_.size();
      for (const auto& c : conns_) {
        short events = c->state == ConnState::Rejected ? 0 : POLLIN;
        if (!c->out.empty()) events |= POLLOUT;
        pfds.push_back({c->sock.fd(), events, 0});
      }
      int rc = ::poll(pfds.data(), pfds.size(), next_timeout_ms());
      if (rc < 0 && errno != EINTR)
        throw Error(chorusSystemError, Subsys::Bootstrap, cat("poll failed: ", std::strerror(errno)));
      if (rc > 0) {
        if (base == 1 && pfds[0].revents != 0) accept_all();
        for (size_t i = 0; i < polled; ++i) {
          Conn& c = *conns_[i];
          short re = pfds[base + i].revents;
          if (re == 0 || c.state == ConnState::Closed) continue;
          if (c.state == ConnState::Rejected && (re & (POLLHUP | POLLERR)) != 0) {
            close_conn(c);
            continue;
          }
          if ((re & (POLLIN | POLLHUP | POLLERR)) != 0 && c.state != ConnState::Rejected) on_readable(c);
          if ((re & POLLOUT) != 0 && c.state != ConnState::Closed) flush(c);
        }
      }
      close_overflowed();
      expire_deadlines();
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->state == ConnState::Closed; });
      if (finished()) return;  // run() stops counting as busy
      set_busy(std::any_of(conns_.begin(), conns_.end(), [](const std::unique_ptr<Conn>& c) {
        return c->state == ConnState::Joined && !c->said_bye;
      }));
    }
  }

  // Nobody can join any more and every rank that joined has left or died.
  bool finished() const {
    if (phase_ == Phase::Gathering) return false;
    if (phase_ == Phase::Failed && !failed_linger_.passed()) return false;
    return std::none_of(conns_.begin(), conns_.end(), [](const std::unique_ptr<Conn>& c) {
      return c->state == ConnState::Joined || c->state == ConnState::Rejected;
    });
  }

  int next_timeout_ms() const {
    int ms = 1000;  // also bounds how late a deadline check can be
    if (!accept_pause_.passed()) ms = std::min(ms, accept_pause_.remaining_ms() + 1);
    for (const auto& c : conns_) {
      if (c->state == ConnState::Joined) continue;
      int left = c->deadline.remaining_ms();
      if (left < ms) ms = left + 1;
    }
    return ms;
  }

  int authenticating() const {
    return static_cast<int>(std::count_if(conns_.begin(), conns_.end(), [](const std::unique_ptr<Conn>& x) {
      return x->state == ConnState::Authenticating;
    }));
  }

  void accept_all() {
    for (;;) {
      if (authenticating() >= options_.max_pending) return;  // the rest wait in the backlog (loop())
      sockaddr_storage peer{};
      Socket s;
      try {
        s = listener_.try_accept(&peer);
      } catch (const Error& e) {
        // Out of descriptors or memory: the ranks already connected must go on. The listener stays readable, so
        // pause accepting instead of spinning on it.
        CHORUS_WARN(Bootstrap, "root %s: %s; not accepting connections for %d ms", addr_.c_str(), e.what(),
                    kAcceptPauseMs);
        accept_pause_ = Deadline::after_ms(kAcceptPauseMs);
        return;
      }
      if (!s.valid()) return;
      auto c = std::make_unique<Conn>();
      c->sock = std::move(s);
      c->peer = sockaddr_to_string(peer);
      c->auth = std::make_unique<AuthServer>(secret_);
      c->deadline = Deadline::after_ms(options_.auth_timeout_ms);
      CHORUS_TRACE(Bootstrap, "root %s: connection from %s", addr_.c_str(), c->peer.c_str());
      conns_.push_back(std::move(c));
    }
  }

  void expire_deadlines() {
    for (auto& c : conns_) {
      if (c->state == ConnState::Joined || c->state == ConnState::Closed || !c->deadline.passed()) continue;
      if (c->state == ConnState::Rejected) {
        close_conn(*c);
      } else if (c->state == ConnState::AwaitJoin && phase_ == Phase::Gathering) {
        // Silent before its Join, its host gone without a FIN: as a close.
        fail_unjoined(*c, cat("authenticated but did not join within ", options_.auth_timeout_ms,
                              " ms: its process or host stopped"));
      } else {
        CHORUS_WARN(
            Bootstrap, "root %s: refused connection from %s: %s within %d ms", addr_.c_str(), c->peer.c_str(),
            c->state == ConnState::Authenticating ? "it did not authenticate" : "it authenticated but did not join",
            options_.auth_timeout_ms);
        close_conn(*c);
      }
    }
  }

  // ---- Reading ----

  void on_readable(Conn& c) {
    if (c.state == ConnState::Authenticating) {
      switch (c.auth->on_readable(c.sock.fd())) {
        case AuthServer::Status::NeedMore: return;
        case AuthServer::Status::Refused:
          CHORUS_WARN(Bootstrap, "root %s: refused connection from %s: it %s", addr_.c_str(), c.peer.c_str(),
                      c.auth->why().c_str());
          close_conn(c);
          return;
        case AuthServer::Status::Ok:
          c.auth.reset();
          c.state = ConnState::AwaitJoin;
          CHORUS_TRACE(Bootstrap, "root %s: %s authenticated", addr_.c_str(), c.peer.c_str());
          return;  // poll is level-triggered: a Join already here wakes the next round
      }
    }
    for (int frames = 0; frames < kFramesPerWake && c.state != ConnState::Closed && c.state != ConnState::Rejected;) {
      uint8_t* dst;
      size_t want;
      if (c.read_state == ReadState::Header) {
        dst = c.header_bytes + c.got;
        want = kFrameHeaderBytes - c.got;
      } else {
        dst = c.payload.data() + c.got;
        want = c.payload.size() - c.got;
      }
      ssize_t n = ::recv(c.sock.fd(), dst, want, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        peer_gone(c, n == 0 ? std::string() : std::string(std::strerror(errno)));
        return;
      }
      c.got += static_cast<size_t>(n);
      if (c.read_state == ReadState::Header) {
        if (c.got < kFrameHeaderBytes) continue;
        c.header = decode_header(c.header_bytes);
        c.got = 0;
        std::string bad = check_header(c, c.header);
        if (!bad.empty()) {
          protocol_error(c, bad);
          return;
        }
        c.payload.assign(c.header.length, 0);
        if (c.header.length > 0) {
          c.read_state = ReadState::Payload;
          continue;
        }
      } else if (c.got < c.payload.size()) {
        continue;
      }
      c.read_state = ReadState::Header;
      c.got = 0;
      ++frames;
      dispatch(c, c.header, std::move(c.payload));
      c.payload = {};
    }
  }

  // Why this header must not be accepted, or "" when it is well-formed.
  std::string check_header(const Conn& c, const FrameHeader& h) const {
    uint64_t limit = 0;
    switch (static_cast<MsgType>(h.type)) {
      case MsgType::Join:
      case MsgType::Allgather:
      case MsgType::P2p: limit = kMaxRankPayload; break;
      case MsgType::Error: limit = kMaxTextPayload; break;
      case MsgType::Bye: limit = 8; break;  // the leaving rank's note
      case MsgType::Barrier:
      case MsgType::StatusQuery: limit = 0; break;
      default: return cat("unknown frame type ", h.type);
    }
    if (h.length > limit)
      return cat(msg_type_name(h.type), " frame of ", h.length, " bytes exceeds the limit of ", limit, " bytes");
    if (c.state == ConnState::AwaitJoin && static_cast<MsgType>(h.type) != MsgType::Join)
      return cat("sent ", msg_type_name(h.type), " before Join");
    if (c.state == ConnState::Joined) {
      if (static_cast<MsgType>(h.type) == MsgType::Join) return "sent Join twice";
      if (h.from != c.rank) return cat("claims to be rank ", h.from);
    }
    return "";
  }

  void dispatch(Conn& c, const FrameHeader& h, std::vector<uint8_t> payload) {
    switch (static_cast<MsgType>(h.type)) {
      case MsgType::Join: on_join(c, h, std::move(payload)); return;
      case MsgType::Allgather:
      case MsgType::Barrier: on_gather(c, h, std::move(payload)); return;
      case MsgType::P2p: on_p2p(c, h, std::move(payload)); return;
      case MsgType::Error: {
        c.reported = true;
        fail(c.rank, std::string(payload.begin(), payload.end()));
        return;
      }
      case MsgType::Bye:
        CHORUS_INFO(Bootstrap, "root %s: rank %d (%s) said goodbye", addr_.c_str(), c.rank, c.peer.c_str());
        c.said_bye = true;
        // Its note (Bootstrap::leave_note) goes to every rank still here when it is lower than any before: one that
        // waits for the rank learns at once that it will not come.
        if (payload.size() == sizeof(uint64_t) && phase_ == Phase::Complete) {
          uint64_t progress = 0;
          std::memcpy(&progress, payload.data(), sizeof(progress));
          departed_notes_[c.rank] = progress;
          // A rank whose connection request it did not answer gets the note too: the request may have been
          // relayed to it just before it left.
          const bool lowest = progress < lowest_note_;
          if (lowest) lowest_note_ = progress;
          const std::vector<int> waiting = take_unanswered_connects(c.rank);
          for (int r = 0; r < nranks_; ++r)
            if (r != c.rank && by_rank_[r] != nullptr &&
                (lowest || std::find(waiting.begin(), waiting.end(), r) != waiting.end()))
              enqueue(*by_rank_[r],
                      make_buffer(MsgType::Deliver, c.rank, r, Bootstrap::kTagLeft, payload.data(), payload.size()));
        }
        close_conn(c);
        if (phase_ == Phase::Complete) {
          departed_.push_back(c.rank);
          fail_rounds_without_departed();
        }
        return;
      case MsgType::StatusQuery: {
        std::string text = status_text();
        enqueue(c, make_buffer(MsgType::Status, -1, c.rank, 0, text.data(), text.size()));
        return;
      }
      default: break;
    }
    CHORUS_ASSERT(false && "check_header admits only the rank-to-root frame types");
  }

  void on_join(Conn& c, const FrameHeader& h, std::vector<uint8_t> payload) {
    const int rank = h.from, n = h.to;
    auto reject = [&](chorusResult_t code, const std::string& text) {
      CHORUS_WARN(Bootstrap, "root %s: refused Join from %s: %s", addr_.c_str(), c.peer.c_str(), text.c_str());
      enqueue(c, make_buffer(MsgType::Reject, -1, rank, static_cast<uint32_t>(code), text.data(), text.size()));
      c.state = ConnState::Rejected;
      c.deadline = Deadline::after_ms(kRejectLingerMs);
    };
    if (phase_ == Phase::Failed)
      return reject(chorusRemoteError, cat("the rendezvous at ", addr_, " already failed: ", failure_text_));
    if (phase_ == Phase::Complete)
      return reject(chorusInvalidUsage, cat("rank ", rank, " cannot join: all ", nranks_,
                                            " ranks of the rendezvous at ", addr_, " have joined"));
    // A join that contradicts the job (its size, or a rank already taken) means the launch is misconfigured and
    // cannot complete: the joiner is refused and the rendezvous fails, so that the ranks already waiting (and later
    // ones of this process, through root_closed_here) learn why at once instead of at the timeout.
    auto refuse_job = [&](chorusResult_t code, const std::string& text) {
      reject(code, text);
      fail(-1, cat("a join from ", c.peer, " was refused: ", text));
    };
    if (n <= 0 || n > kMaxRanks)
      return refuse_job(chorusInvalidArgument, cat("nranks=", n, " is out of range [1, ", kMaxRanks, "]"));
    if (nranks_ != 0 && n != nranks_)
      return refuse_job(chorusInvalidArgument, cat("rank ", rank, " joined with nranks=", n, " but rank ", first_rank_,
                                                   " (first to join) joined with nranks=", nranks_));
    if (rank < 0 || rank >= n)
      return refuse_job(chorusInvalidArgument, cat("rank ", rank, " is out of range for nranks=", n));
    if (nranks_ != 0 && joined_[rank])
      return refuse_job(chorusInvalidUsage, cat("rank ", rank, " has already joined (from ", rank_peer_[rank], ")"));

    if (nranks_ == 0) {
      nranks_ = n;
      first_rank_ = rank;
      joined_.assign(n, false);
      by_rank_.assign(n, nullptr);
      rank_peer_.assign(n, std::string());
      join_blobs_.assign(n, {});
    }
    c.state = ConnState::Joined;
    c.rank = rank;
    c.deadline = Deadline::never();
    joined_[rank] = true;
    by_rank_[rank] = &c;
    rank_peer_[rank] = c.peer;
    join_blobs_[rank] = std::move(payload);
    ++njoined_;
    CHORUS_INFO(Bootstrap, "root %s: rank %d of %d joined from %s (%d joined)", addr_.c_str(), rank, n, c.peer.c_str(),
                njoined_);
    if (njoined_ == nranks_) complete_rendezvous();
  }

  void complete_rendezvous() {
    Buffer frame = blob_list_frame(MsgType::Rendezvous, 0, join_blobs_);
    join_blobs_.clear();
    join_blobs_.shrink_to_fit();
    if (frame == nullptr) {
      fail(-1, cat("the rendezvous at ", addr_, " failed: the ranks' info blobs total over the limit of ",
                   kMaxRootPayload, " bytes"));
      return;
    }
    phase_ = Phase::Complete;
    if (options_.one_rendezvous) set_closed(secret_, closed_text(), /*completed=*/true);
    broadcast(frame);
    CHORUS_INFO(Bootstrap, "root %s: rendezvous complete, %d ranks", addr_.c_str(), nranks_);
    // Nobody else can join: stop listening, and drop strangers still authenticating.
    listener_.close();
    for (auto& c : conns_)
      if (c->state == ConnState::Authenticating || c->state == ConnState::AwaitJoin) close_conn(*c);
  }

  void on_gather(Conn& c, const FrameHeader& h, std::vector<uint8_t> payload) {
    if (phase_ != Phase::Complete)
      return protocol_error(c, cat("sent ", msg_type_name(h.type), " before the rendezvous"));
    if (gathers_failed_) return;  // every rank was told of a failure: no gather completes any more
    const uint64_t key = (uint64_t{h.type} << 32) | h.tag;
    std::deque<Round>& rounds = rounds_[key];
    auto it = std::find_if(rounds.begin(), rounds.end(), [&](const Round& r) { return !r.have[c.rank]; });
    if (it == rounds.end()) {
      rounds.emplace_back();
      it = std::prev(rounds.end());
      it->blobs.resize(nranks_);
      it->have.assign(nranks_, false);
    }
    it->blobs[c.rank] = std::move(payload);
    it->have[c.rank] = true;
    ++it->count;
    while (!rounds.empty() && rounds.front().count == nranks_) {
      if (static_cast<MsgType>(h.type) == MsgType::Barrier) {
        broadcast(make_buffer(MsgType::BarrierResult, -1, -1, h.tag, nullptr, 0));
      } else {
        Buffer frame = blob_list_frame(MsgType::AllgatherResult, h.tag, rounds.front().blobs);
        if (frame == nullptr)
          return fail(-1, cat("the allgather with tag ", h.tag, " gathered over the limit of ", kMaxRootPayload,
                              " bytes"));  // (which ends every gather)
        broadcast(frame);
      }
      rounds.pop_front();
    }
    if (rounds.empty()) {
      rounds_.erase(key);
      return;
    }
    fail_rounds_without_departed();
  }

  // A gather that a rank which has left (destroyed its communicator) did not join can never complete: the ranks in
  // it are told once, at once (a split called after a peer's destroy), instead of waiting for it until their
  // timeout; later contributions are dropped (their ranks have had the failure). Costs nothing while no rank has
  // left.
  void fail_rounds_without_departed() {
    if (departed_.empty() || gathers_failed_) return;
    for (const auto& [key, rounds] : rounds_) {
      for (const Round& round : rounds) {
        std::vector<int> missing, waiting;
        for (int r : departed_)
          if (!round.have[r]) missing.push_back(r);
        if (missing.empty()) continue;
        std::sort(missing.begin(), missing.end());
        for (int r = 0; r < nranks_; ++r)
          if (round.have[r]) waiting.push_back(r);
        const std::string text =
            cat("rank(s) ", rank_ranges(missing), " left (destroyed the communicator) without joining the bootstrap ",
                msg_type_name(static_cast<uint32_t>(key >> 32)), " with tag ", static_cast<uint32_t>(key),
                " that rank(s) ", rank_ranges(waiting), " are in, so it cannot complete");
        return fail(-1, text);  // which ends every gather
      }
    }
  }

  void on_p2p(Conn& c, const FrameHeader& h, std::vector<uint8_t> payload) {
    if (phase_ != Phase::Complete) return protocol_error(c, "sent P2p before the rendezvous");
    if (h.to < 0 || h.to >= nranks_) return protocol_error(c, cat("sent P2p to rank ", h.to, " of ", nranks_));
    Conn* dest = by_rank_[h.to];
    if (dest == nullptr && h.tag == Bootstrap::kTagStatus) {
      // A status question to a rank that has left: the root answers for it (one byte: "left").
      const uint8_t left = 1;
      enqueue(c, make_buffer(MsgType::Deliver, h.to, c.rank, Bootstrap::kTagStatusReply, &left, 1));
      return;
    }
    if (dest == nullptr) {
      // The destination left or died (a death was already reported to everyone): nobody can receive it. The sender
      // gets the note the rank left with (it may have it already): a rank that waits for a point-to-point
      // connection to it then fails at once instead of at its timeout.
      CHORUS_WARN(Bootstrap, "root %s: dropped a message from rank %d to rank %d (tag %u): rank %d has left",
                  addr_.c_str(), c.rank, h.to, h.tag, h.to);
      auto note = departed_notes_.find(h.to);
      if (note != departed_notes_.end())
        enqueue(c,
                make_buffer(MsgType::Deliver, h.to, c.rank, Bootstrap::kTagLeft, &note->second, sizeof(note->second)));
      return;
    }
    if (h.tag == Bootstrap::kTagConnect) pair_connect(c.rank, h.to);
    enqueue(*dest, make_buffer(MsgType::Deliver, c.rank, h.to, h.tag, payload.data(), payload.size()));
  }

  // Connection requests (Bootstrap::kTagConnect) not yet answered by the peer's own request, by (from, to): a
  // request from `from` to `to` answers one of `to`'s to `from`, or else waits for one. Complete exchanges leave
  // nothing here, so the map holds only requests in flight.
  static uint64_t pair_key(int from, int to) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
  }
  void pair_connect(int from, int to) {
    auto answered = unanswered_connects_.find(pair_key(to, from));
    if (answered != unanswered_connects_.end()) {
      if (--answered->second == 0) unanswered_connects_.erase(answered);
      return;
    }
    ++unanswered_connects_[pair_key(from, to)];
  }
  // The ranks whose requests `rank` did not answer; forgets every request to and from it.
  std::vector<int> take_unanswered_connects(int rank) {
    std::vector<int> waiting;
    for (auto it = unanswered_connects_.begin(); it != unanswered_connects_.end();) {
      const int from = static_cast<int>(it->first >> 32), to = static_cast<int>(it->first & 0xFFFFFFFFu);
      if (to == rank) waiting.push_back(from);
      it = from == rank || to == rank ? unanswered_connects_.erase(it) : std::next(it);
    }
    return waiting;
  }

  std::string status_text() const {
    switch (phase_) {
      case Phase::Complete: return cat("all ", nranks_, " ranks have joined");
      case Phase::Failed: return cat("the rendezvous failed: ", failure_text_);
      case Phase::Gathering: break;
    }
    std::vector<int> missing;
    for (int r = 0; r < nranks_; ++r)
      if (!joined_[r]) missing.push_back(r);
    return cat(njoined_, " of ", nranks_, " ranks have joined; missing: ", rank_ranges(missing));
  }

  // ---- Failures and closing ----

  // Broadcasts a failure to every rank still connected; a failure before the rendezvous completes also fails it.
  void fail(int rank, std::string text) {
    if (text.size() > kMaxTextPayload) text.resize(kMaxTextPayload);  // what every rank accepts (read_frame)
    // Every rank learns of it and stops waiting in gathers: those still open are moot (their blobs are freed), and a
    // rank that leaves now must not be reported a second time as the reason one cannot complete.
    if (phase_ == Phase::Complete) {
      gathers_failed_ = true;
      rounds_.clear();
    }
    CHORUS_WARN(Bootstrap, "root %s: %s", addr_.c_str(), text.c_str());
    if (phase_ == Phase::Gathering) {
      phase_ = Phase::Failed;
      failure_text_ = text;
      // A rank that joins later is refused with the reason: at once from this process (Bootstrap::join), and from
      // elsewhere by this service, which stays a while for it. Only for a unique id's own (ephemeral) port: a
      // launcher's fixed port must be free again for a retry.
      if (options_.one_rendezvous) {
        set_closed(secret_, closed_text(), /*completed=*/false);
        int64_t ms = 60000;
        try {
          ms = std::min<int64_t>(ms, param_int(Param::TimeoutMs));
        } catch (...) {
        }
        failed_linger_ = Deadline::after_ms(ms);
      }
    }
    broadcast(make_buffer(MsgType::Failure, rank, -1, 0, text.data(), text.size()));
  }

  void peer_gone(Conn& c, const std::string& os_error) {
    if (c.state == ConnState::Joined && phase_ == Phase::Failed) {
      // The rendezvous failed and every joined rank was told so: their leaving is the expected consequence.
      CHORUS_INFO(Bootstrap, "root %s: rank %d (%s) left the failed rendezvous", addr_.c_str(), c.rank, c.peer.c_str());
      close_conn(c);
      return;
    }
    if (c.state == ConnState::Joined && !c.said_bye && !c.reported && gathers_failed_) {
      // The job already failed and every rank was told: ranks end without a goodbye then (they abort), which says
      // nothing new (it was logged as a death of each of them; helper-79).
      CHORUS_INFO(Bootstrap, "root %s: rank %d (%s) left after the job failed", addr_.c_str(), c.rank, c.peer.c_str());
      close_conn(c);
      return;
    }
    if (c.state == ConnState::Joined && !c.said_bye && !c.reported) {
      c.reported = true;
      std::string text = cat("rank ", c.rank, " (", c.peer,
                             ") closed its bootstrap connection without a goodbye: its process died, or it aborted "
                             "its communicator");
      if (!os_error.empty()) text += cat(" (", os_error, ")");
      close_conn(c);
      fail(c.rank, text);
      return;
    }
    if (c.state == ConnState::AwaitJoin && phase_ == Phase::Gathering) {
      fail_unjoined(c, cat("closed after authenticating, before joining: its process died or it gave up",
                           os_error.empty() ? "" : cat(" (", os_error, ")")));
      return;
    }
    if (c.state == ConnState::AwaitJoin)
      CHORUS_WARN(Bootstrap, "root %s: connection from %s closed after authenticating, before joining", addr_.c_str(),
                  c.peer.c_str());
    close_conn(c);
  }

  // A connection that proved it holds the job's secret, so a rank's, and that will not join (`why`): the rendezvous
  // cannot complete, and the ranks waiting learn it now instead of at their timeout.
  void fail_unjoined(Conn& c, const std::string& why) {
    const std::string text = cat("a rank's connection from ", c.peer, " ", why);
    close_conn(c);
    fail(-1, text);
  }

  void protocol_error(Conn& c, const std::string& why) {
    if (c.state == ConnState::Joined && !c.reported) {
      c.reported = true;
      std::string text = cat("rank ", c.rank, " (", c.peer, ") broke the bootstrap protocol: ", why);
      close_conn(c);
      fail(c.rank, text);
      return;
    }
    CHORUS_WARN(Bootstrap, "root %s: closed connection from %s: %s", addr_.c_str(), c.peer.c_str(), why.c_str());
    close_conn(c);
  }

  // Marks `c` closed (the sweep in loop() releases it), and forgets its rank's connection.
  void close_conn(Conn& c) {
    if (c.state == ConnState::Closed) return;
    if (c.state == ConnState::Joined) by_rank_[c.rank] = nullptr;
    c.state = ConnState::Closed;
    c.out.clear();
    c.out_bytes = 0;
    c.sock.shutdown();
  }

  // ---- Writing ----

  static Buffer make_buffer(MsgType type, int32_t from, int32_t to, uint32_t tag, const void* payload, size_t bytes) {
    // A text longer than every rank accepts (read_frame) is cut, here for every kind of text frame.
    if ((type == MsgType::Failure || type == MsgType::Reject || type == MsgType::Status) && bytes > kMaxTextPayload)
      bytes = kMaxTextPayload;
    return std::make_shared<const std::vector<uint8_t>>(make_frame(type, from, to, tag, payload, bytes));
  }

  // A frame carrying `blobs` as a blob list, built in one pass (one copy of each blob); nullptr when the result
  // would exceed kMaxRootPayload.
  static Buffer blob_list_frame(MsgType type, uint32_t tag, const std::vector<std::vector<uint8_t>>& blobs) {
    const size_t bytes = blob_list_bytes(blobs);
    if (bytes > kMaxRootPayload) return nullptr;
    auto frame = std::make_shared<std::vector<uint8_t>>(kFrameHeaderBytes + bytes);
    encode_header(FrameHeader{static_cast<uint32_t>(type), -1, -1, tag, bytes}, frame->data());
    write_blob_list(blobs, frame->data() + kFrameHeaderBytes);
    return frame;
  }

  void broadcast(const Buffer& frame) {
    for (Conn* c : by_rank_)
      if (c != nullptr) enqueue(*c, frame);
  }

  // Queues a frame; loop() sends it when the socket is writable. Never writes here, so a failing write never
  // closes a connection while the caller is iterating over connections.
  void enqueue(Conn& c, const Buffer& frame) {
    if (c.state == ConnState::Closed) return;
    c.out.emplace_back(frame, 0);
    c.out_bytes += frame->size();
    if (c.out_bytes > kMaxQueuedBytes && c.state == ConnState::Joined && !c.reported) {
      // Deferred to close_overflowed(): fail() here would re-enter enqueue while the caller iterates.
      c.reported = true;
      overflowed_.push_back(c.rank);
    }
  }

  void flush(Conn& c) {
    while (!c.out.empty()) {
      auto& [buf, off] = c.out.front();
      ssize_t n = ::send(c.sock.fd(), buf->data() + off, buf->size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        peer_gone(c, std::strerror(errno));
        return;
      }
      off += static_cast<size_t>(n);
      c.out_bytes -= static_cast<size_t>(n);
      if (off == buf->size()) c.out.pop_front();
    }
    if (c.out.empty() && c.state == ConnState::Rejected) close_conn(c);
  }

  void close_overflowed() {
    while (!overflowed_.empty()) {
      std::vector<int> ranks = std::move(overflowed_);
      overflowed_.clear();
      for (int r : ranks) {
        if (by_rank_[r] == nullptr) continue;
        std::string peer = by_rank_[r]->peer;
        close_conn(*by_rank_[r]);
        fail(r, cat("rank ", r, " (", peer, ") stopped reading its bootstrap connection (over ", kMaxQueuedBytes >> 20,
                    " MiB queued for it)"));
      }
    }
  }

  Socket listener_;
  const std::string addr_;
  const Secret secret_;
  const RootOptions options_;
  std::vector<std::unique_ptr<Conn>> conns_;
  Phase phase_ = Phase::Gathering;
  int nranks_ = 0;  // set by the first Join
  int first_rank_ = -1;
  void set_busy(bool busy) {
    const bool failed = busy && (phase_ == Phase::Failed || gathers_failed_);
    if (busy == busy_ && failed == busy_failed_) return;
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().busy += int(busy) - int(busy_);
    registry().busy_failed += int(failed) - int(busy_failed_);
    busy_ = busy;
    busy_failed_ = failed;
    registry().cv.notify_all();
  }

  bool busy_ = false, busy_failed_ = false;
  int njoined_ = 0;
  std::vector<bool> joined_;                // ever joined
  std::vector<Conn*> by_rank_;              // live connection of each joined rank
  uint64_t lowest_note_ = UINT64_MAX;       // the lowest leave note delivered (Bootstrap::leave_note)
  std::map<int, uint64_t> departed_notes_;  // every leave note, by rank
  std::vector<int> departed_;               // ranks that said goodbye after the rendezvous, in that order
  std::unordered_map<uint64_t, int> unanswered_connects_;  // see pair_connect
  bool gathers_failed_ = false;                            // failed after the rendezvous: gathers are over
  std::vector<std::string> rank_peer_;
  std::vector<std::vector<uint8_t>> join_blobs_;
  std::string failure_text_;
  Deadline failed_linger_ = Deadline::after_ms(0);  // a failed unique id's rendezvous still refuses joiners until then
  std::map<uint64_t, std::deque<Round>> rounds_;
  std::vector<int> overflowed_;
  Deadline accept_pause_ = Deadline::after_ms(0);
};

}  // namespace

namespace {
// The process whose threads serve the roots started here (start_root).
std::atomic<pid_t> g_root_process{0};

// After a job failed, what the ranks still connected may need of the root: the status questions of their timeout
// diagnosis, which ends about 2 s after the failure (at most 10 s with thousands of ranks).
constexpr int64_t kFailedJobExitWaitMs = 10000;

// The process that hosts a root must not take it down while ranks elsewhere still use it (rank 0 often finishes
// first): at exit, wait for every joined rank to say goodbye or die, for at most CHORUS_TIMEOUT_MS, or
// kFailedJobExitWaitMs when every job still served has failed (a rank whose host or network died never says goodbye
// nor closes its connection, and the job would end a whole timeout after its error; helper-79). Only when no
// communicator of this process is still alive: those would say goodbye after this handler, so waiting for them
// could only time out. Only in the process whose threads serve the roots (g_root_process): a child forked from it
// inherits this handler and the registry's counts, but not the service threads that would bring them down.
void wait_for_roots_at_exit() {
  if (getpid() != g_root_process.load()) return;
  if (bootstraps_alive() > 0) return;
  int64_t ms = 300000;
  try {
    ms = param_int(Param::TimeoutMs);
  } catch (...) {
  }
  std::unique_lock<std::mutex> lock(registry().mu);
  Registry& reg = registry();
  if (reg.busy == 0) return;
  const bool all_failed = reg.busy == reg.busy_failed;
  if (all_failed) ms = std::min(ms, kFailedJobExitWaitMs);
  CHORUS_INFO(Bootstrap, "process exit: waiting at most %lld ms for %d rendezvous service(s) still in use%s",
              static_cast<long long>(ms), reg.busy, all_failed ? " by failed jobs" : "");
  const Deadline until = Deadline::after_ms(static_cast<int>(std::min<int64_t>(ms, INT32_MAX)));
  // In slices: a job that fails while this waits shortens the wait.
  while (reg.busy > 0 && !until.passed()) {
    reg.cv.wait_for(lock, std::chrono::milliseconds(std::min(100, until.remaining_ms() + 1)));
    if (reg.busy > 0 && reg.busy == reg.busy_failed && ms > kFailedJobExitWaitMs) {
      CHORUS_INFO(Bootstrap, "process exit: the jobs still served failed; waiting at most %lld ms more",
                  static_cast<long long>(kFailedJobExitWaitMs));
      reg.cv.wait_for(lock, std::chrono::milliseconds(std::min<int64_t>(kFailedJobExitWaitMs, until.remaining_ms())),
                      [&] { return reg.busy == 0; });
      return;
    }
  }
}
}  // namespace

sockaddr_storage start_root(const sockaddr_storage& bind_addr, const Secret& secret, const RootOptions& options) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] {
    // OpenSSL's one-time setup (it loads its configuration, with per-thread error state) runs here, in the
    // caller's thread, rather than inside the detached service thread's first HMAC.
    OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr);
    std::atexit(wait_for_roots_at_exit);
  });
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (g_root_process.load() != getpid()) {
      // The first root of this process (or of a child forked after its parent served some): the counts it
      // inherited belong to service threads that do not run here.
      registry().busy = registry().busy_failed = registry().running = 0;
      registry().serving.clear();
      g_root_process = getpid();
    }
  }
  Socket listener = Socket::listen(bind_addr);
  sockaddr_storage bound = listener.local_addr();
  auto service = std::make_shared<RootService>(std::move(listener), secret, options);
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    ++registry().running;
    registry().serving.insert(secret);
  }
  std::thread([service, secret] {
    service->run();
    std::lock_guard<std::mutex> lock(registry().mu);
    --registry().running;
    registry().serving.erase(registry().serving.find(secret));
  }).detach();
  CHORUS_INFO(Bootstrap, "root service listening on %s", sockaddr_to_string(bound).c_str());
  return bound;
}

std::string root_closed_here(const Secret& secret) {
  std::lock_guard<std::mutex> lock(registry().mu);
  const auto it = registry().closed.find(secret);
  return it == registry().closed.end() ? std::string() : it->second;
}

bool root_completed_here(const Secret& secret) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().completed.count(secret) > 0;
}

bool root_serving_here(const Secret& secret) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().serving.count(secret) > 0;
}

int root_services_running() {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().running;
}

}  // namespace chorus
