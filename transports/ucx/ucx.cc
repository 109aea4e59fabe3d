// ucx: any two ranks UCX can join, over whatever UCX picks underneath (RDMA, shared memory, TCP; CHORUS_UCX_TLS or
// UCX's own UCX_TLS narrows the choice). Built only with UCX (CMake CHORUS_UCX).
//
// One UCP context and worker per communicator (transport instance); the worker is driven by the one thread that
// runs the communicator's work at a time (UCS_THREAD_MODE_SERIALIZED). Each rank sends its worker address through
// the bootstrap (prepare()); one endpoint per peer is shared by that peer's channels, created with
// UCP_ERR_HANDLING_MODE_PEER so that a dead peer is an endpoint error, turned into a chorus::Error naming it.
//
// The slot FIFO maps onto tagged messages. Tag = [sender rank: 24 bits][channel: 8][message sequence: 32], matched
// exactly, so neither channels nor messages of one connection can be confused:
//  - receive: `depth` slots, each with a tagged receive pre-posted for the next sequence number that lands in it;
//    recv_peek() shows the oldest slot once its receive completed (in place, zero-copy); recv_release() posts the
//    receive for sequence + depth into the same slot;
//  - send: `depth` slots; send_commit() posts a tagged send of [header, payload] straight from the slot, which stays
//    owned until UCX completes the send (eager: copied out; rendezvous: fetched by the peer).
// Both rings are registered once (ucp_mem_map) and passed as memory handles, so rendezvous skips registration.
// progress() is ucp_worker_progress; the executor sleeps on the worker's event fd (ucp_worker_arm then poll).
#include <dlfcn.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "transports/transports.h"

namespace chorus {

namespace {

constexpr int kRankBits = 24;
constexpr int kChannelBits = 8;
constexpr int kMaxRank = (1 << kRankBits) - 1;
// The header is followed by the payload at a 16-byte boundary (like the shm FIFO), so reductions read aligned data.
constexpr size_t kHeaderSpace = 48;
static_assert(sizeof(WireHeader) <= kHeaderSpace);

uint64_t make_tag(int rank, int channel, uint64_t seq) {
  return (static_cast<uint64_t>(rank) << (64 - kRankBits)) | (static_cast<uint64_t>(channel) << 32) |
         (seq & 0xffffffffu);
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// UCX logs its own errors to stderr (a dead peer's refused connections, say); Chorus reports what matters itself,
// with the peer's rank. UCX_LOG_LEVEL=warn shows UCX's own diagnostics again.
void quiet_ucx_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("UCX_LOG_LEVEL");
    if (v == nullptr || *v == '\0') ucs_global_opts_set_value("LOG_LEVEL", "fatal");
  });
}

// libucs installs its own handlers for the error signals (SIGSEGV, SIGBUS, SIGILL, SIGFPE) and for SIGHUP (its
// debug signal) as it loads, whether or not any communicator uses UCX: a crash would then print UCX's report instead
// of reaching the application's handlers (Python's faulthandler, a framework's), and SIGHUP would no longer end the
// process. This runs after libucs's own initialisation (a library's constructors run after those of the libraries
// it needs) and gives back each signal whose handler is still UCX's (ucs_debug_disable_signal restores the action
// that was there before), unless the user asked for UCX's handling with UCX_HANDLE_ERRORS or UCX_DEBUG_SIGNO.
bool handled_by_libucs(int sig) {
  struct sigaction sa {};
  if (sigaction(sig, nullptr, &sa) != 0) return false;
  void* handler = (sa.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(sa.sa_sigaction)
                                                  : reinterpret_cast<void*>(sa.sa_handler);
  Dl_info theirs{}, ours{};
  if (handler == reinterpret_cast<void*>(SIG_DFL) || handler == reinterpret_cast<void*>(SIG_IGN) ||
      dladdr(handler, &theirs) == 0 || dladdr(reinterpret_cast<void*>(&ucs_debug_disable_signal), &ours) == 0)
    return false;
  return theirs.dli_fbase == ours.dli_fbase;  // the very libucs this library uses (not another copy)
}

__attribute__((constructor)) void give_back_signals_ucx_took() {
  std::vector<int> signals;
  if (std::getenv("UCX_HANDLE_ERRORS") == nullptr) {
    signals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < ucs_global_opts.error_signals.count; ++i)
      signals.push_back(ucs_global_opts.error_signals.signals[i]);
  }
  if (std::getenv("UCX_DEBUG_SIGNO") == nullptr) {
    signals.push_back(SIGHUP);
    if (ucs_global_opts.debug_signo > 0) signals.push_back(static_cast<int>(ucs_global_opts.debug_signo));
  }
  std::sort(signals.begin(), signals.end());
  signals.erase(std::unique(signals.begin(), signals.end()), signals.end());
  for (int sig : signals)
    if (handled_by_libucs(sig)) ucs_debug_disable_signal(sig);
}

// The "tl/device" resources a context found, from ucp_context_print_info's "resource" lines.
std::vector<std::string> context_resources(ucp_context_h ctx) {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return {};
  ucp_context_print_info(ctx, f);
  std::fclose(f);
  std::vector<std::string> out;
  std::istringstream in(std::string(text, len));
  std::free(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("resource") == std::string::npos) continue;
    const size_t at = line.find("-- ");
    if (at == std::string::npos) continue;
    std::string r = line.substr(at + 3);
    while (!r.empty() && (r.back() == ' ' || r.back() == '\r')) r.pop_back();
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

bool is_shm_tl(const std::string& tl) {
  return tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" || tl == "knem";
}

struct Endpoint {
  ucp_ep_h ep = nullptr;
  ucs_status_t status = UCS_OK;  // set by the error handler (inside ucp_worker_progress)
  int rank = -1;
  bool peer_failure = false;  // created with UCP_ERR_HANDLING_MODE_PEER (only such an endpoint closes by force)
};

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<Endpoint*>(arg);
  if (e->status == UCS_OK) e->status = status;
  CHORUS_INFO(Transport, "ucx: endpoint to rank %d failed: %s", e->rank, ucs_status_string(status));
}

// A connection's two slot rings and their registration; owned by the worker once the connection is gone, because
// UCX may still touch them until the endpoints are closed.
struct Ring {
  void* mem = nullptr;
  ucp_mem_h memh = nullptr;
};

// One context and worker (per communicator) and its endpoints; shared by the transport and its connections, so it
// outlives whichever goes first.
class Worker {
 public:
  // nullptr, with *why set, when UCX cannot start here (bad UCX_TLS, no transport).
  static std::shared_ptr<Worker> create(std::string* why) {
    quiet_ucx_logs();
    auto w = std::shared_ptr<Worker>(new Worker);
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) {
      *why = cat("ucp_config_read failed: ", ucs_status_string(st));
      return nullptr;
    }
    const std::string tls = param_str(Param::UcxTls);
    if (!tls.empty() && (st = ucp_config_modify(config, "TLS", tls.c_str())) != UCS_OK) {
      ucp_config_release(config);
      *why = cat("CHORUS_UCX_TLS='", tls, "' is not a valid UCX transport list: ", ucs_status_string(st));
      return nullptr;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.name = "chorus";
    st = ucp_init(&params, config, &w->ctx_);
    ucp_config_release(config);
    const std::string which = !tls.empty()                        ? cat(" (CHORUS_UCX_TLS=", tls, ")")
                              : std::getenv("UCX_TLS") != nullptr ? cat(" (UCX_TLS=", std::getenv("UCX_TLS"), ")")
                                                                  : std::string();
    if (st != UCS_OK) {
      w->ctx_ = nullptr;
      *why = cat("ucp_init failed: ", ucs_status_string(st), which);
      return nullptr;
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time drives a communicator
    if ((st = ucp_worker_create(w->ctx_, &wp, &w->worker_)) != UCS_OK) {
      w->worker_ = nullptr;
      *why = cat("ucp_worker_create failed: ", ucs_status_string(st), which);
      return nullptr;
    }
    if (ucp_worker_get_efd(w->worker_, &w->efd_) != UCS_OK) w->efd_ = -1;  // then waits yield instead of sleeping
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    if ((st = ucp_worker_get_address(w->worker_, &addr, &len)) != UCS_OK) {
      *why = cat("ucp_worker_get_address failed: ", ucs_status_string(st));
      return nullptr;
    }
    w->address_.assign(reinterpret_cast<std::byte*>(addr), reinterpret_cast<std::byte*>(addr) + len);
    ucp_worker_release_address(w->worker_, addr);
    w->resources_ = context_resources(w->ctx_);
    for (const std::string& r : w->resources_) {
      const std::string tl = r.substr(0, r.find('/'));
      if (is_shm_tl(tl)) w->has_shm_ = true;
      if (tl != "self" && !is_shm_tl(tl)) w->has_net_ = true;
    }
    if (!w->has_shm_ && !w->has_net_) {
      *why = cat("UCX found no transport to reach another process", which);
      return nullptr;
    }
    return w;
  }

  ~Worker() {
    if (worker_ != nullptr && stranded()) {
      // UCX 1.13 closes an endpoint by force only in UCP_ERR_HANDLING_MODE_PEER (shared memory has none: the force
      // close is refused, UCS_ERR_INVALID_PARAM), and destroying a worker with an operation still queued on such an
      // endpoint (a rendezvous copy from a peer that died) fails an assertion and aborts the process: a surviving
      // rank died in chorusCommDestroy in about 1 of 7 three-rank kill jobs over ucx sm. After such a failure the
      // worker, its context and the rings are left to the process's exit instead.
      CHORUS_INFO(Transport,
                  "ucx: a call failed with a shared-memory endpoint in use, which UCX cannot close by force: "
                  "leaving its worker to the process's exit");
      return;
    }
    if (worker_ != nullptr) {
      close_endpoints();
      ucp_worker_destroy(worker_);
    }
    for (Ring& r : rings_) {
      if (r.memh != nullptr) ucp_mem_unmap(ctx_, r.memh);
      std::free(r.mem);
    }
    if (ctx_ != nullptr) ucp_cleanup(ctx_);
  }

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_context_h context() const { return ctx_; }
  ucp_worker_h worker() const { return worker_; }
  int efd() const { return efd_; }
  const std::vector<std::byte>& address() const { return address_; }
  const std::vector<std::string>& resources() const { return resources_; }
  bool has_shm() const { return has_shm_; }
  bool has_net() const { return has_net_; }

  // The endpoint to `peer`, created from its worker address on first use. `peer_failure`: UCX reports a dead or
  // unreachable peer as an endpoint error (UCP_ERR_HANDLING_MODE_PEER), which excludes the UCX transports that
  // cannot (shared memory, in UCX 1.13).
  Endpoint* endpoint(int peer, const std::vector<std::byte>& address, bool peer_failure) {
    auto& e = endpoints_[peer];
    if (e) return e.get();
    auto made = std::make_unique<Endpoint>();
    made->rank = peer;
    made->peer_failure = peer_failure;
    ucp_ep_params_t p{};
    p.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = on_endpoint_error;
    p.err_handler.arg = made.get();
    ucs_status_t st = ucp_ep_create(worker_, &p, &made->ep);
    if (st != UCS_OK) {
      endpoints_.erase(peer);
      throw Error(chorusSystemError, Subsys::Transport,
                  cat("ucx: cannot create an endpoint to rank ", peer, ": ", ucs_status_string(st),
                      " (do both ranks see a common UCX transport? chorus-info lists them)"));
    }
    e = std::move(made);
    return e.get();
  }

  bool progress() {
    bool any = false;
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) any = true;
    return any;
  }

  // poll(2) events to sleep on efd(), or 0 when events are pending (progress first).
  short arm() {
    if (efd_ < 0) return 0;
    return ucp_worker_arm(worker_) == UCS_OK ? POLLIN : 0;
  }

  void wait(int timeout_us) {
    if (arm() == 0) {
      sched_yield();
      return;
    }
    pollfd p{efd_, POLLIN, 0};
    poll(&p, 1, std::max(1, timeout_us / 1000));
  }

  // Keeps a connection's rings until the endpoints are closed. `clean`: no request of the connection was left
  // unfinished (a call failed half-way otherwise, and the endpoints must be closed by force).
  void adopt(Ring r, bool clean) {
    rings_.push_back(r);
    unclean_ |= !clean;
  }

 private:
  // Waits for UCX requests, progressing the worker, until all completed or `until`; returns true if they did.
  bool wait_all(const std::vector<void*>& reqs, std::chrono::steady_clock::time_point until) {
    for (;;) {
      bool pending = false;
      for (void* r : reqs) pending |= r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS;
      if (!pending) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      ucp_worker_progress(worker_);
    }
  }

  // True when a call failed and an endpoint without peer failure handling may still have operations queued (see
  // ~Worker).
  bool stranded() const {
    for (const auto& [rank, e] : endpoints_)
      if (!e->peer_failure && (unclean_ || e->status != UCS_OK)) return true;
    return false;
  }

  // After clean calls, endpoints whose flush completes (everything sent was delivered) close gracefully. When a
  // call failed half-way (a receive or send still pending, a peer dead) every endpoint with peer failure handling
  // is closed by force, which cancels what is pending on it: destroying a worker with requests pending on an
  // endpoint (a rendezvous receive from a dead peer, say) is an assertion failure in UCX (endpoints without it are
  // never closed after a failure: ~Worker). Bounded, so a peer that never answers cannot hold up the
  // communicator's destruction.
  void close_endpoints() {
    using clock = std::chrono::steady_clock;
    std::vector<void*> flushes(endpoints_.size(), nullptr);
    std::vector<bool> flushed(endpoints_.size(), false);
    size_t i = 0;
    for (auto& [rank, e] : endpoints_) {
      if (e->status == UCS_OK && !unclean_) {
        ucp_request_param_t p{};
        void* r = ucp_ep_flush_nbx(e->ep, &p);
        flushes[i] = UCS_PTR_IS_PTR(r) ? r : nullptr;
        flushed[i] = r == nullptr;
      }
      ++i;
    }
    wait_all(flushes, clock::now() + std::chrono::seconds(1));
    std::vector<void*> closes;
    i = 0;
    for (auto& [rank, e] : endpoints_) {
      if (flushes[i] != nullptr) {
        flushed[i] = ucp_request_check_status(flushes[i]) == UCS_OK && e->status == UCS_OK;
        ucp_request_free(flushes[i]);
      }
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = flushed[i] || !e->peer_failure ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(e->ep, &p);
      if (UCS_PTR_IS_PTR(r))
        closes.push_back(r);
      else if (UCS_PTR_IS_ERR(r))
        CHORUS_INFO(Transport, "ucx: closing the endpoint to rank %d: %s", rank, ucs_status_string(UCS_PTR_STATUS(r)));
      ++i;
    }
    wait_all(closes, clock::now() + std::chrono::seconds(2));
    for (void* r : closes) ucp_request_free(r);
  }

 public:
 private:
  Worker() = default;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<std::byte> address_;
  std::vector<std::string> resources_;
  bool has_shm_ = false, has_net_ = false;
  bool unclean_ = false;
  std::map<int, std::unique_ptr<Endpoint>> endpoints_;
  std::vector<Ring> rings_;
};

class UcxConnection : public Connection {
 public:
  UcxConnection(std::shared_ptr<Worker> w, Endpoint* ep, int rank, int peer, int channel, size_t slot_bytes, int depth)
      : Connection(peer, channel, slot_bytes),
        w_(std::move(w)),
        ep_(ep),
        rank_(rank),
        depth_(static_cast<uint64_t>(depth)),
        stride_(round_up(kHeaderSpace + slot_bytes, 64)),
        send_req_(depth, nullptr),
        recv_req_(depth, nullptr),
        recv_ready_(depth, false),
        recv_info_(depth) {
    const size_t bytes = round_up(2 * depth_ * stride_, 4096);
    ring_.mem = std::aligned_alloc(4096, bytes);
    if (ring_.mem == nullptr)
      throw Error(chorusSystemError, Subsys::Transport, cat("ucx: cannot allocate ", bytes, " bytes of slots"));
    std::memset(ring_.mem, 0, bytes);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = ring_.mem;
    mp.length = bytes;
    if (ucp_mem_map(w_->context(), &mp, &ring_.memh) != UCS_OK) ring_.memh = nullptr;  // UCX registers per send
    try {
      for (uint64_t s = 0; s < depth_; ++s) post_recv(s);
    } catch (...) {
      release();
      throw;
    }
  }

  ~UcxConnection() override { release(); }

  std::byte* send_slot() override {
    if (send_head_ - send_tail_ >= depth_) {
      reap_sends();
      if (send_head_ - send_tail_ >= depth_) {
        if (ep_->status != UCS_OK) fail_endpoint();
        return nullptr;
      }
    }
    return send_at(send_head_) + kHeaderSpace;
  }

  void send_commit(const WireHeader& h) override {
    if (ep_->status != UCS_OK) fail_endpoint();
    std::byte* s = send_at(send_head_);
    std::memcpy(s, &h, sizeof(h));
    ucp_request_param_t p{};
    if (ring_.memh != nullptr) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      p.memh = ring_.memh;
    }
    void* r = ucp_tag_send_nbx(ep_->ep, s, kHeaderSpace + h.bytes, make_tag(rank_, channel(), send_head_), &p);
    if (UCS_PTR_IS_ERR(r)) fail(cat("send failed: ", ucs_status_string(UCS_PTR_STATUS(r))));
    send_req_[send_head_ % depth_] = r;  // nullptr: completed at once
    ++send_head_;
  }

  MessageView recv_peek() override {
    const uint64_t i = recv_tail_ % depth_;
    if (!recv_ready_[i]) {
      // A receive that failed (or could not be posted) has no request left: every later look fails the same way,
      // since callers may look again after an error (CommImpl::for_each_waiting_header skips failed connections).
      if (recv_req_[i] == nullptr) fail(recv_failed_);
      {
        const ucs_status_t st = ucp_tag_recv_request_test(recv_req_[i], &recv_info_[i]);
        if (st == UCS_INPROGRESS) {
          // Only an error once data is actually missing: a peer that finished may close while we drain.
          if (ep_->status != UCS_OK) fail_endpoint();
          return {};
        }
        ucp_request_free(recv_req_[i]);
        recv_req_[i] = nullptr;
        if (st != UCS_OK) {
          recv_failed_ = cat(
              "receive failed: ", ucs_status_string(st),
              st == UCS_ERR_MESSAGE_TRUNCATED ? " (a message larger than the slot: CHORUS_SLICE_BYTES differs?)" : "");
          fail(recv_failed_);
        }
      }
      if (std::string bad = check_arrived(i); !bad.empty()) {
        recv_failed_ = std::move(bad);  // the next look must not take the bad message for a good one
        fail(recv_failed_);
      }
      recv_ready_[i] = true;
    }
    std::byte* s = recv_at(i);
    return {reinterpret_cast<const WireHeader*>(s), s + kHeaderSpace};
  }

  void recv_release() override {
    const uint64_t seq = recv_tail_;
    recv_ready_[seq % depth_] = false;
    ++recv_tail_;
    post_recv(seq + depth_);
  }

  bool progress() override {
    bool moved = w_->progress();
    moved |= reap_sends();
    return moved;
  }

  bool send_idle() const override {
    for (uint64_t s = send_tail_; s < send_head_; ++s) {
      void* r = send_req_[s % depth_];
      if (r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    }
    return true;
  }

  void wait_recv(int timeout_us) override { w_->wait(timeout_us); }
  void wait_send(int timeout_us) override { w_->wait(timeout_us); }
  int poll_fd() const override { return w_->efd(); }
  short arm_poll() override { return w_->arm(); }

 private:
  std::byte* send_at(uint64_t seq) const { return static_cast<std::byte*>(ring_.mem) + (seq % depth_) * stride_; }
  std::byte* recv_at(uint64_t seq) const {
    return static_cast<std::byte*>(ring_.mem) + (depth_ + seq % depth_) * stride_;
  }

  // Cancels the posted receives and hands the rings to the worker, which frees them once no endpoint can touch them.
  void release() {
    bool clean = ep_->status == UCS_OK;
    for (void*& r : recv_req_)
      if (r != nullptr) {
        ucp_request_cancel(w_->worker(), r);  // a receive still waiting for its match completes at once
        clean &= ucp_request_check_status(r) != UCS_INPROGRESS;
        ucp_request_free(r);  // released by UCX once it is done with it
        r = nullptr;
      }
    for (void*& r : send_req_)
      if (r != nullptr) {
        clean &= ucp_request_check_status(r) != UCS_INPROGRESS;
        ucp_request_free(r);
        r = nullptr;
      }
    w_->adopt(ring_, clean);
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(chorusRemoteError, Subsys::Transport,
                cat("ucx connection to rank ", peer(), " (channel ", channel(), "): ", what));
  }
  [[noreturn]] void fail_endpoint() const {
    fail(cat("endpoint failed: ", ucs_status_string(ep_->status), " (peer died, closed or unreachable)"));
  }

  void post_recv(uint64_t seq) {
    const uint64_t i = seq % depth_;
    // Always a request, tested in recv_peek (ucp_tag_recv_request_test fills the length): UCX 1.13 does not always
    // fill recv_info when a receive completes at once from the unexpected queue, seen here as stale lengths.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    if (ring_.memh != nullptr) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = ring_.memh;
    }
    void* r = ucp_tag_recv_nbx(w_->worker(), recv_at(seq), kHeaderSpace + slot_bytes(),
                               make_tag(peer(), channel(), seq), ~uint64_t{0}, &p);
    if (!UCS_PTR_IS_PTR(r)) {
      recv_failed_ =
          cat("cannot post a receive: ", ucs_status_string(r == nullptr ? UCS_ERR_NO_MESSAGE : UCS_PTR_STATUS(r)));
      fail(recv_failed_);
    }
    recv_req_[i] = r;
  }

  // Every length read from the wire is bounded: the header must be whole and describe exactly what arrived.
  // Returns what is wrong with the message in slot i, or "".
  std::string check_arrived(uint64_t i) const {
    const size_t len = recv_info_[i].length;
    if (len < kHeaderSpace) return cat("received a message of ", len, " bytes, shorter than a header");
    WireHeader h;
    std::memcpy(&h, recv_at(i), sizeof(h));
    if (h.magic != WireHeader::kMagic) return "received a message with a bad magic";
    if (h.bytes > slot_bytes() || kHeaderSpace + h.bytes != len)
      return cat("received ", len, " bytes for a header announcing ", h.bytes, " payload bytes (slot ", slot_bytes(),
                 ")");
    return {};
  }

  // Frees the slots of completed sends, oldest first. Returns true if any was freed.
  bool reap_sends() {
    bool freed = false;
    while (send_tail_ < send_head_) {
      void*& r = send_req_[send_tail_ % depth_];
      if (r != nullptr) {
        const ucs_status_t st = ucp_request_check_status(r);
        if (st == UCS_INPROGRESS) break;
        ucp_request_free(r);
        r = nullptr;
        if (st != UCS_OK) {
          if (ep_->status != UCS_OK) fail_endpoint();
          fail(cat("send failed: ", ucs_status_string(st)));
        }
      }
      ++send_tail_;
      freed = true;
    }
    return freed;
  }

  std::shared_ptr<Worker> w_;
  Endpoint* ep_;
  int rank_;
  uint64_t depth_;
  size_t stride_;
  Ring ring_;
  std::vector<void*> send_req_, recv_req_;
  std::vector<bool> recv_ready_;
  std::vector<ucp_tag_recv_info_t> recv_info_;
  std::string recv_failed_ = "receive failed";  // why the receive at the tail has no request (set on failure)
  uint64_t send_head_ = 0, send_tail_ = 0, recv_tail_ = 0;
};

// "shm,net": the kinds of UCX transport this rank has, published so both ranks of a pair decide alike.
std::string caps_of(const Worker& w) {
  std::string c;
  if (w.has_shm()) c = "shm";
  if (w.has_net()) c += c.empty() ? "net" : ",net";
  return c;
}

bool has_cap(const std::string& caps, const char* what) {
  std::stringstream ss(caps);
  std::string item;
  while (std::getline(ss, item, ','))
    if (item == what) return true;
  return false;
}

class UcxTransport : public Transport {
 public:
  UcxTransport() : worker_(Worker::create(&why_)) {
    if (!worker_) CHORUS_INFO(Transport, "ucx: unavailable: %s", why_.c_str());
  }

  const char* name() const override { return "ucx"; }
  std::string unavailable_reason() const override { return worker_ ? std::string() : why_; }

  void describe(PeerInfo& self) const override {
    host_id_ = self.host_id;
    if (worker_) self.transport_caps["ucx"] = caps_of(*worker_);
  }

  // Ranks of one host need a common kind (shared memory, or network through loopback); ranks of different hosts
  // need the network on both sides.
  bool can_connect(const PeerInfo& self, const PeerInfo& peer) const override {
    if (!worker_ || self.rank > kMaxRank || peer.rank > kMaxRank) return false;
    const auto a = self.transport_caps.find("ucx"), b = peer.transport_caps.find("ucx");
    if (a == self.transport_caps.end() || b == peer.transport_caps.end()) return false;
    const bool net = has_cap(a->second, "net") && has_cap(b->second, "net");
    if (self.host_id != peer.host_id) return net;
    return net || (has_cap(a->second, "shm") && has_cap(b->second, "shm"));
  }

  std::vector<std::byte> prepare(const ConnectSpec&) override { return worker_->address(); }

  std::unique_ptr<Connection> connect(const ConnectSpec& s, const std::vector<std::byte>& peer_data,
                                      Deadline) override {
    if (peer_data.empty() || peer_data.size() > (size_t{1} << 20))
      throw Error(chorusRemoteError, Subsys::Transport,
                  cat("ucx: rank ", s.peer, " sent a worker address of ", peer_data.size(), " bytes"));
    if (s.channel >= (1 << kChannelBits))
      throw Error(chorusInvalidArgument, Subsys::Transport, cat("ucx: channel ", s.channel, " out of range"));
    // Ranks of one host talk through UCX's shared memory, which cannot report a dead peer: there the bootstrap
    // does (the executor polls it while it waits). Between hosts UCX reports it too, as an endpoint error.
    const bool shm =
        s.peer_info->host_id == host_id_ && worker_->has_shm() &&
        has_cap(s.peer_info->transport_caps.count("ucx") ? s.peer_info->transport_caps.at("ucx") : "", "shm");
    Endpoint* ep = worker_->endpoint(s.peer, peer_data, !shm);
    CHORUS_INFO(Transport, "ucx: endpoint to rank %d (%s)", s.peer,
                shm ? "same host: shared memory allowed, peer failures seen by the bootstrap"
                    : "peer failures reported by UCX");
    return std::make_unique<UcxConnection>(worker_, ep, s.rank, s.peer, s.channel, s.slot_bytes, s.fifo_depth);
  }

 private:
  std::string why_;
  std::shared_ptr<Worker> worker_;
  mutable std::string host_id_;  // this rank's, from describe()
};

}  // namespace

std::unique_ptr<Transport> make_ucx_transport() { return std::make_unique<UcxTransport>(); }

std::string ucx_probe(bool* available) {
  std::string why;
  std::shared_ptr<Worker> w = Worker::create(&why);
  *available = w != nullptr;
  std::string out = cat("UCX ", ucp_get_version_string(), ": ");
  if (!w) return out + "unavailable: " + why;
  std::string list;
  for (const std::string& r : w->resources()) list += (list.empty() ? "" : ", ") + r;
  const std::string tls = param_str(Param::UcxTls);
  return out + list + (tls.empty() ? "" : cat(" (CHORUS_UCX_TLS=", tls, ")"));
}

}  // namespace chorus
