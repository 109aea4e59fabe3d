#include "bootstrap/bootstrap.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "bootstrap/auth.h"
#include "bootstrap/root.h"
#include "bootstrap/socket.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

// After the join deadline, how long to wait for the root's list of missing ranks before giving up on it.
constexpr int kStatusGraceMs = 1000;
// How often a join with a caller's stop check (Bootstrap::join) calls it.
constexpr int kStopPollMs = 20;
// Goodbye: time to send Bye, then time for the root to close its side, before the connection is cut anyway.
constexpr int kByeSendMs = 1000;
constexpr int kByeCloseMs = 2000;
// A send that fails (often a broken pipe: the root's process died) races the service thread, which reads the same
// connection and records why it ended; how long the send waits for that record so that its error gives the cause.
constexpr int kSendFailureGraceMs = 1000;

struct Frame {
  FrameHeader header;
  Blob payload;  // a Blob, so that a delivered message is handed over without a copy
};

// Reads one root-to-rank frame. The root is authenticated, but its lengths are still bounded so that a corrupt
// stream fails cleanly instead of allocating without limit.
Frame read_frame(const Socket& sock, Deadline deadline) {
  uint8_t bytes[kFrameHeaderBytes];
  sock.recv_all(bytes, sizeof(bytes), deadline);
  Frame f;
  f.header = decode_header(bytes);
  auto type = static_cast<MsgType>(f.header.type);
  uint64_t limit = (type == MsgType::Failure || type == MsgType::Reject || type == MsgType::Status) ? kMaxTextPayload
                                                                                                    : kMaxRootPayload;
  if (f.header.length > limit)
    throw Error(chorusSystemError, Subsys::Bootstrap,
                cat("the bootstrap root sent a ", msg_type_name(f.header.type), " frame of ", f.header.length,
                    " bytes, over the limit of ", limit));
  f.payload.resize(f.header.length);
  if (!f.payload.empty()) sock.recv_all(f.payload.data(), f.payload.size(), deadline);
  return f;
}

void write_frame(const Socket& sock, MsgType type, int32_t from, int32_t to, uint32_t tag, const void* payload,
                 size_t bytes, Deadline deadline) {
  if (type == MsgType::Error && bytes > kMaxTextPayload) bytes = kMaxTextPayload;  // what the root accepts
  uint8_t header[kFrameHeaderBytes];
  encode_header(FrameHeader{static_cast<uint32_t>(type), from, to, tag, bytes}, header);
  sock.send_all(header, sizeof(header), deadline);
  if (bytes > 0) sock.send_all(payload, bytes, deadline);
}

// True when `sock` has data (or end of file) before `deadline`.
bool wait_readable(const Socket& sock, Deadline deadline) {
  for (;;) {
    pollfd p{sock.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc > 0) return true;
    if (rc == 0 && deadline.passed()) return false;
    if (rc < 0 && errno != EINTR)
      throw Error(chorusSystemError, Subsys::Bootstrap, cat("poll failed: ", std::strerror(errno)));
  }
}

std::string text_of(const Blob& payload) {
  return std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
}

std::vector<Blob> blobs_of(const Blob& list, size_t count) {
  return decode_blobs(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(list.data()), list.size()), count);
}

// Blocks until `sock` is readable; true when the peer has closed the connection cleanly between frames.
bool closed_between_frames(const Socket& sock) {
  wait_readable(sock, Deadline::never());
  for (;;) {
    uint8_t byte;
    ssize_t n = ::recv(sock.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n == 0;
  }
}

// Bootstraps alive in this process. A child forked from a process with live ones inherits this count but not their
// threads: the count belongs to the process that made it, and a bootstrap counts down only in the process that
// made it.
std::mutex g_alive_mu;
int g_alive = 0;
pid_t g_alive_pid = 0;

void alive_add() {
  std::lock_guard<std::mutex> lock(g_alive_mu);
  if (g_alive_pid != getpid()) {
    g_alive_pid = getpid();
    g_alive = 0;
  }
  ++g_alive;
}
void alive_sub(pid_t made_in) {
  std::lock_guard<std::mutex> lock(g_alive_mu);
  if (made_in == getpid() && g_alive_pid == made_in) --g_alive;
}

class RootBootstrap final : public Bootstrap {
 public:
  RootBootstrap(Socket sock, std::string root_text, int rank, int nranks, std::vector<Blob> peer_info,
                int io_timeout_ms)
      : sock_(std::move(sock)),
        root_text_(std::move(root_text)),
        rank_(rank),
        nranks_(nranks),
        peer_info_(std::move(peer_info)),
        io_timeout_ms_(io_timeout_ms) {
    alive_add();
    service_ = std::thread([this] { service_loop(); });
  }

  ~RootBootstrap() override {
    struct Count {
      pid_t made_in;
      ~Count() { alive_sub(made_in); }
    } count{made_in_};
    State before;
    {
      std::lock_guard<std::mutex> lock(mu_);
      before = state_;
      if (state_ == State::Running) state_ = State::Leaving;
    }
    if (before == State::Running) {
      try {
        std::lock_guard<std::mutex> lock(send_mu_);
        write_frame(sock_, MsgType::Bye, rank_, -1, 0, note_.data(), note_.size(), Deadline::after_ms(kByeSendMs));
      } catch (const Error& e) {
        CHORUS_INFO(Bootstrap, "rank %d: could not say goodbye to the bootstrap root: %s", rank_, e.what());
      }
      // Half-close and let the root close its side first, so our Bye is read before any reset.
      sock_.shutdown(/*write_only=*/true);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(kByeCloseMs), [&] { return service_done_; });
    }
    sock_.shutdown();
    if (service_.joinable()) service_.join();
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  const std::vector<Blob>& peer_info() const override { return peer_info_; }

  std::vector<Blob> allgather(uint32_t tag, const Blob& mine, Deadline deadline) override {
    check_size(mine, "allgather blob");
    const std::string what = cat("the bootstrap allgather with tag ", tag);
    send_frame(MsgType::Allgather, -1, tag, mine.data(), mine.size(), what);
    return blobs_of(take(MsgType::Allgather, -1, tag, deadline, what), static_cast<size_t>(nranks_));
  }

  void barrier(uint32_t tag, Deadline deadline) override {
    const std::string what = cat("the bootstrap barrier with tag ", tag);
    send_frame(MsgType::Barrier, -1, tag, nullptr, 0, what);
    take(MsgType::Barrier, -1, tag, deadline, what);
  }

  void send(int peer, uint32_t tag, const Blob& data) override {
    check_peer(peer);
    check_size(data, "bootstrap message");
    send_frame(MsgType::P2p, peer, tag, data.data(), data.size(),
               cat("a bootstrap send to rank ", peer, " (tag ", tag, ")"));
  }

  Blob recv(int peer, uint32_t tag, Deadline deadline) override {
    check_peer(peer);
    return take(MsgType::P2p, peer, tag, deadline, cat("a bootstrap message from rank ", peer, " (tag ", tag, ")"));
  }

  void set_status(std::function<Blob()> status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
  }

  void leave_note(uint64_t progress) override {
    note_.resize(sizeof(progress));
    std::memcpy(note_.data(), &progress, sizeof(progress));
  }

  std::vector<std::pair<int, Blob>> peek(uint32_t tag) const override {
    std::vector<std::pair<int, Blob>> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, queue] : mailbox_)
      if (std::get<0>(key) == static_cast<uint32_t>(MsgType::P2p) && std::get<2>(key) == tag && !queue.empty())
        out.emplace_back(std::get<1>(key), queue.front());
    return out;
  }

  void report_failure(const std::string& text_in) override {
    std::string text = text_in.substr(0, kMaxTextPayload);
    try {
      std::lock_guard<std::mutex> lock(send_mu_);
      write_frame(sock_, MsgType::Error, rank_, -1, 0, text.data(), text.size(),
                  Deadline::after_ms(std::min(io_timeout_ms_, 5000)));
    } catch (const Error& e) {
      // The root cannot tell the others; at least this rank knows.
      CHORUS_WARN(Bootstrap, "rank %d: could not report a failure to the bootstrap root (%s): %s", rank_, e.what(),
                  text.c_str());
      set_failure(rank_, text);
    }
  }

  PeerFailure failure() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  void abort() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ == State::Aborted) return;
      state_ = State::Aborted;
      set_failure_locked(rank_, cat("rank ", rank_, " aborted its bootstrap connection"));
    }
    cv_.notify_all();
    sock_.shutdown();  // wakes the service thread; the fd stays open until destruction, so it cannot be reused
    if (service_.joinable() && service_.get_id() != std::this_thread::get_id()) service_.join();
  }

 private:
  enum class State { Running, Leaving, Aborted };
  using Key = std::tuple<uint32_t, int, uint32_t>;  // (request type, from rank or -1, tag)

  void check_peer(int peer) const {
    if (peer < 0 || peer >= nranks_)
      throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                  cat("rank ", rank_, ": bootstrap peer ", peer, " is out of range for nranks=", nranks_));
  }

  void check_size(const Blob& b, const char* what) const {
    if (b.size() > kMaxRankPayload)
      throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                  cat("rank ", rank_, ": ", what, " of ", b.size(), " bytes exceeds the bootstrap limit of ",
                      kMaxRankPayload, " bytes"));
  }

  [[noreturn]] void throw_failed(const std::string& what) const {
    throw Error(chorusRemoteError, Subsys::Bootstrap, cat("rank ", rank_, ": ", what, " failed: ", failure_.text));
  }

  void send_frame(MsgType type, int to, uint32_t tag, const void* payload, size_t bytes, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.load(std::memory_order_relaxed)) throw_failed(what);
    }
    try {
      std::lock_guard<std::mutex> lock(send_mu_);
      write_frame(sock_, type, rank_, to, tag, payload, bytes, Deadline::after_ms(io_timeout_ms_));
    } catch (const Error& e) {
      std::unique_lock<std::mutex> lock(mu_);
      if (std::this_thread::get_id() != service_.get_id())  // the service thread would wait for itself
        cv_.wait_for(lock, std::chrono::milliseconds(kSendFailureGraceMs),
                     [&] { return failed_.load(std::memory_order_relaxed) || service_done_; });
      if (failed_.load(std::memory_order_relaxed)) throw_failed(what);
      throw Error(e.code(), Subsys::Bootstrap, cat("rank ", rank_, ": ", what, " failed: ", e.what()));
    }
  }

  // Waits for the next message filed under (type, from, tag).
  Blob take(MsgType type, int from, uint32_t tag, Deadline deadline, const std::string& what) {
    const Key key{static_cast<uint32_t>(type), from, tag};
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = mailbox_.find(key);
      if (it != mailbox_.end()) {
        Blob b = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) mailbox_.erase(it);
        return b;
      }
      if (failed_.load(std::memory_order_relaxed)) throw_failed(what);
      if (deadline.passed())
        throw Error(chorusTimeout, Subsys::Bootstrap, cat("rank ", rank_, ": timed out waiting for ", what));
      if (deadline.time() == Deadline::Clock::time_point::max())
        cv_.wait(lock);
      else
        cv_.wait_until(lock, deadline.time());
    }
  }

  void set_failure_locked(int rank, std::string text) {
    if (failed_.load(std::memory_order_relaxed)) return;  // the first failure is the one that explains the rest
    failure_ = PeerFailure{rank, std::move(text)};
    failed_.store(true, std::memory_order_release);
  }

  void set_failure(int rank, std::string text) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      set_failure_locked(rank, std::move(text));
    }
    cv_.notify_all();
  }

  // The only reader of sock_ after join: files every frame from the root, until the connection ends.
  void service_loop() {
    for (;;) {
      Frame f;
      bool ended = false;
      std::string why;  // empty when the root closed cleanly between frames
      try {
        ended = closed_between_frames(sock_);
        if (!ended) f = read_frame(sock_, Deadline::never());
      } catch (const Error& e) {
        ended = true;
        why = e.what();
      }
      if (ended) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          // Leaving or aborted: this end is expected. Otherwise the root (or its process) is gone, and with it
          // every rank's control plane.
          if (state_ == State::Running) {
            std::string text = cat("the bootstrap root (", root_text_, ") closed the connection");
            if (!why.empty()) text += cat(": ", why);
            CHORUS_WARN(Bootstrap, "rank %d: %s", rank_, text.c_str());
            if (!failed_.load(std::memory_order_relaxed)) {
              set_failure_locked(0, std::move(text));
              failure_.root_lost = true;
            }
          }
          service_done_ = true;
        }
        cv_.notify_all();
        return;
      }
      const FrameHeader& h = f.header;
      std::optional<Key> key;
      switch (static_cast<MsgType>(h.type)) {
        case MsgType::Deliver:
          if (h.tag == kTagStatus) {
            answer_status(h.from);
            continue;
          }
          key = Key{static_cast<uint32_t>(MsgType::P2p), h.from, h.tag};
          break;
        case MsgType::AllgatherResult: key = Key{static_cast<uint32_t>(MsgType::Allgather), -1, h.tag}; break;
        case MsgType::BarrierResult: key = Key{static_cast<uint32_t>(MsgType::Barrier), -1, h.tag}; break;
        case MsgType::Failure: {
          std::string text = text_of(f.payload);
          CHORUS_INFO(Bootstrap, "rank %d: failure reported by the bootstrap root: %s", rank_, text.c_str());
          set_failure(h.from, std::move(text));
          continue;
        }
        case MsgType::Status: continue;  // an answer that arrived after join stopped waiting for it
        default:
          CHORUS_WARN(Bootstrap, "rank %d: ignored an unexpected %s frame from the bootstrap root", rank_,
                      msg_type_name(h.type));
          continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::deque<Blob>& queue = mailbox_[*key];
        // A peer's leave note is only ever looked at (peek), never taken: one of them is all a rank needs (the
        // root answers every message sent to a rank that has left with its note again).
        if (h.tag == kTagLeft && !queue.empty()) continue;
        queue.push_back(std::move(f.payload));
      }
      cv_.notify_all();
    }
  }

  // From the service thread: a peer asked how far this rank is (kTagStatus).
  void answer_status(int peer) {
    std::function<Blob()> status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = status_;
    }
    const Blob answer = status ? status() : Blob{};
    try {
      send_frame(MsgType::P2p, peer, kTagStatusReply, answer.data(), answer.size(), "a status answer");
    } catch (const Error& e) {
      CHORUS_INFO(Bootstrap, "rank %d: could not answer rank %d's status question: %s", rank_, peer, e.what());
    }
  }

  Socket sock_;
  const std::string root_text_;
  const int rank_;
  const int nranks_;
  const std::vector<Blob> peer_info_;
  const int io_timeout_ms_;         // bound on one write to the root (CHORUS_TIMEOUT_MS)
  const pid_t made_in_ = getpid();  // the process whose count of live bootstraps this one is in (alive_add)

  std::mutex send_mu_;  // serialises writers of sock_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::map<Key, std::deque<Blob>> mailbox_;
  Blob note_;                     // sent with the goodbye (leave_note)
  std::function<Blob()> status_;  // the answer to kTagStatus (set_status), under mu_
  PeerFailure failure_;
  State state_ = State::Running;
  bool service_done_ = false;

  std::thread service_;  // last: started once every member above exists
};

// Before returning, a joiner that gave up asks the root who is missing (for its error) and reports its timeout,
// so the ranks already waiting fail now with that text instead of timing out one by one.
[[noreturn]] void give_up_join(const Socket& sock, int rank, const std::string& root_text,
                               std::chrono::steady_clock::time_point start) {
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  std::string text =
      cat("rank ", rank, ": timed out after ", waited.count(), " ms waiting for the rendezvous at ", root_text);
  try {
    Deadline grace = Deadline::after_ms(kStatusGraceMs);
    write_frame(sock, MsgType::StatusQuery, rank, -1, 0, nullptr, 0, grace);
    while (wait_readable(sock, grace)) {
      Frame f = read_frame(sock, grace);
      if (static_cast<MsgType>(f.header.type) == MsgType::Status) {
        text += cat(" (the root says: ", text_of(f.payload), ")");
        break;
      }
    }
    write_frame(sock, MsgType::Error, rank, -1, 0, text.data(), text.size(), grace);
  } catch (const Error& e) {
    CHORUS_INFO(Bootstrap, "rank %d: could not ask the root who is missing: %s", rank, e.what());
  }
  throw Error(chorusTimeout, Subsys::Bootstrap, text);
}

}  // namespace

int bootstraps_alive() {
  std::lock_guard<std::mutex> lock(g_alive_mu);
  return g_alive_pid == getpid() ? g_alive : 0;
}

std::unique_ptr<Bootstrap> Bootstrap::join(const UniqueIdData& id, int rank, int nranks, const Blob& info,
                                           Deadline deadline, const std::function<void()>& check_stop) {
  if (nranks < 1) throw Error(chorusInvalidArgument, Subsys::Bootstrap, cat("nranks=", nranks, " must be at least 1"));
  if (rank < 0 || rank >= nranks)
    throw Error(chorusInvalidArgument, Subsys::Bootstrap, cat("rank ", rank, " is out of range for nranks=", nranks));
  if (info.size() > kMaxRankPayload)
    throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                cat("rank ", rank, ": info blob of ", info.size(), " bytes exceeds the limit of ", kMaxRankPayload));
  const int io_timeout_ms = static_cast<int>(std::clamp<int64_t>(param_int(Param::TimeoutMs), 1, INT32_MAX));
  const std::string root_text = sockaddr_to_string(id.root);
  const auto start = std::chrono::steady_clock::now();

  // Every step names the rank, so that with many ranks logging at once the reader knows whose error it is.
  auto with_rank = [&](const Error& e) {
    return Error(e.code(), Subsys::Bootstrap, cat("rank ", rank, ": ", e.what()));
  };
  // A unique id serves one rendezvous. Reusing one whose root this process served would otherwise retry the
  // closed port until the timeout.
  if (const std::string closed = root_closed_here(id.secret); !closed.empty())
    throw Error(chorusInvalidUsage, Subsys::Bootstrap,
                cat("rank ", rank, ": this unique id was already used: ", closed,
                    "; a unique id serves one communicator (make a new one with chorusGetUniqueId)"));
  // The same, found while joining: a root of this process whose rendezvous completed meanwhile, every rank having
  // joined, ended its job without this rank (a second rank with this rank's number), which is why the connection
  // failed. A rendezvous that failed or a service that stopped otherwise keep their own error.
  auto ended_without_this_rank = [&](const Error& e) -> std::optional<Error> {
    if (!root_completed_here(id.secret)) return std::nullopt;
    const std::string closed = root_closed_here(id.secret);
    return Error(chorusInvalidUsage, Subsys::Bootstrap,
                 cat("rank ", rank, ": the rendezvous of this unique id ended while this rank was joining: ", closed,
                     " (did another rank join as rank ", rank,
                     ", or was the unique id used again? a unique id serves one communicator; here: ", e.what(), ")"));
  };
  Socket sock;
  ConnectRetries retries(cat("rank ", rank, ": the bootstrap root at ", root_text));
  // In 1 s slices: between them the stop check (if any) may end the retries (the root may be gone with it), and a
  // long wait is said once as a warning.
  for (;;) {
    const Deadline slice = deadline.remaining_ms() > 1000 ? Deadline::after_ms(1000) : deadline;
    try {
      sock = Socket::connect(id.root, slice);
      break;
    } catch (const Error& e) {
      if (auto ended = ended_without_this_rank(e)) throw *ended;
      if (!retries.retry(e, slice, deadline))
        throw Error(e.code(), Subsys::Bootstrap,
                    cat("rank ", rank, ": cannot reach the bootstrap root: ", retries.why(e)));
    }
    if (check_stop) check_stop();
  }
  try {
    auth_client(sock, id.secret, deadline, check_stop);
    write_frame(sock, MsgType::Join, rank, nranks, 0, info.data(), info.size(), deadline);
  } catch (const Error& e) {
    if (e.code() == chorusTimeout) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      throw Error(chorusTimeout, Subsys::Bootstrap,
                  cat("rank ", rank, ": timed out after ", waited.count(), " ms waiting for the rendezvous at ",
                      root_text, " (", e.what(), ")"));
    }
    if (auto ended = ended_without_this_rank(e)) throw *ended;
    throw with_rank(e);
  }
  CHORUS_TRACE(Bootstrap, "rank %d: joined the rendezvous at %s; waiting for %d ranks", rank, root_text.c_str(),
               nranks);

  for (;;) {
    const bool polled = check_stop && deadline.remaining_ms() > kStopPollMs;
    if (!wait_readable(sock, polled ? Deadline::after_ms(kStopPollMs) : deadline)) {
      if (!polled) give_up_join(sock, rank, root_text, start);
      try {
        check_stop();
      } catch (const Error& e) {
        // The others learn why from the root at once, instead of waiting for this rank until their timeout.
        const std::string text = cat("rank ", rank, " left the rendezvous: ", e.what());
        try {
          write_frame(sock, MsgType::Error, rank, -1, 0, text.data(), text.size(), Deadline::after_ms(kStatusGraceMs));
        } catch (const Error& lost) {
          CHORUS_INFO(Bootstrap, "rank %d: could not tell the root why it left: %s", rank, lost.what());
        }
        throw;
      }
      continue;
    }
    Frame f;
    try {
      // A frame, once started, arrives whole: finish it even if the join deadline passes meanwhile.
      f = read_frame(sock, Deadline::after_ms(io_timeout_ms));
    } catch (const Error& e) {
      if (auto ended = ended_without_this_rank(e)) throw *ended;
      throw Error(e.code(), Subsys::Bootstrap,
                  cat("rank ", rank, ": lost the bootstrap root at ", root_text, " during the rendezvous: ", e.what()));
    }
    switch (static_cast<MsgType>(f.header.type)) {
      case MsgType::Rendezvous: {
        std::vector<Blob> peers;
        try {
          peers = blobs_of(f.payload, static_cast<size_t>(nranks));
        } catch (const Error& e) {
          throw with_rank(e);
        }
        CHORUS_INFO(Bootstrap, "rank %d of %d: rendezvous at %s complete", rank, nranks, root_text.c_str());
        return std::make_unique<RootBootstrap>(std::move(sock), root_text, rank, nranks, std::move(peers),
                                               io_timeout_ms);
      }
      case MsgType::Reject: {
        auto code = static_cast<chorusResult_t>(f.header.tag);
        if (code != chorusInvalidArgument && code != chorusInvalidUsage && code != chorusRemoteError)
          code = chorusInvalidArgument;
        throw Error(
            code, Subsys::Bootstrap,
            cat("rank ", rank, ": the bootstrap root at ", root_text, " refused the join: ", text_of(f.payload)));
      }
      case MsgType::Failure:
        throw Error(chorusRemoteError, Subsys::Bootstrap,
                    cat("rank ", rank, ": the rendezvous at ", root_text, " failed: ", text_of(f.payload)));
      case MsgType::Status: continue;
      default:
        throw Error(chorusSystemError, Subsys::Bootstrap,
                    cat("rank ", rank, ": the bootstrap root at ", root_text, " sent an unexpected ",
                        msg_type_name(f.header.type), " frame during the rendezvous"));
    }
  }
}

}  // namespace chorus
