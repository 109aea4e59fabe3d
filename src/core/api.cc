// The C boundary: validates handles, converts chorus::Error into chorusResult_t and keeps the error text for
// chorusGetLastError. Nothing throws across it.
#include <chorus/chorus.h>

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bootstrap/launch_env.h"
#include "bootstrap/socket.h"
#include "core/communicator.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/log.h"
#include "runtime/cuda_stream.h"

// Handles are never freed: destroy clears `impl` and leaves a small tombstone, so a handle used after destroy is
// reported (chorusInvalidUsage) instead of reading freed memory, without a global lookup on every call.
struct chorusComm {
  std::atomic<chorus::CommImpl*> impl{nullptr};
  // API calls inside this communicator now (Live): a retired communicator is freed once the calls that found it
  // live have left, so chorusCommAbort from a watchdog thread never frees what another thread is using.
  std::atomic<int> users{0};
  int rank = -1;  // the rank, kept after destroy (the handle is never freed): error texts name it
  // The process that made it, as the number of forks seen so far (g_forks) and its pid: a forked child's copy
  // belongs to the parent.
  uint64_t forks = 0;
  pid_t pid = 0;
  // Where a communicator made by chorusCommSplit came from, after its rank in every error text:
  // " (split color 1 of rank 3)", nested for a split of a split. Empty for one made by an init.
  std::string origin;
  std::mutex err_mu;
  std::string last_error;
};

struct chorusRequest {
  std::shared_ptr<chorus::RequestState> state;
  chorusComm* comm = nullptr;
};

namespace {
// Every live request. A request is freed by chorusRequestFree (a training loop makes millions: no tombstones as for
// communicators), so a handle is looked up here before use: one freed is chorusInvalidUsage, not freed memory (until
// a newer request happens to get its address, as with any handle passed by value).
std::mutex g_requests_mu;
std::unordered_set<const chorusRequest*> g_requests;
}  // namespace

namespace chorus {
namespace {

// Forks this process descends from: incremented in every child, so that a handle made before the fork is known to
// be the parent's.
// The child also gets a fresh lock of the live requests: another thread of the parent may have held it at the fork,
// and the child's refusal of a parent's request looks the request up first.
std::atomic<uint64_t> g_forks{0};
const int g_fork_handler = pthread_atfork(nullptr, nullptr, [] {
  g_forks.fetch_add(1, std::memory_order_relaxed);
  new (&g_requests_mu) std::mutex;
});

bool parents_handle(const chorusComm* comm) {
  return comm != nullptr && comm->forks != g_forks.load(std::memory_order_relaxed);
}

void refuse_parents_handle(const chorusComm* comm) {
  if (parents_handle(comm))
    throw Error(chorusInvalidUsage, Subsys::Core,
                cat("comm was made by process ", comm->pid,
                    ", which then forked this one: a forked child cannot use, destroy or abort its parent's "
                    "communicators or requests (make a communicator of its own)"));
}

thread_local std::string t_last_error;

// An error text of `comm` as the caller sees it: it starts with the rank that reports it (and, for a split
// communicator, where that communicator came from), whatever threw it: "rank is NULL" and "rank 2 left ..." get it
// too.
std::string with_rank(const chorusComm* comm, std::string text) {
  if (comm == nullptr || comm->rank < 0) return text;
  const std::string self = cat("rank ", comm->rank, ": ");
  if (text.rfind(self, 0) == 0) text.erase(0, self.size());
  return cat("rank ", comm->rank, comm->origin, ": ", text);
}

void set_error(chorusComm* comm, const std::string& text) {
  t_last_error = text;
  // Not into a parent's communicator in a forked child: its lock may have been held at the fork.
  if (comm && !parents_handle(comm)) {
    std::lock_guard<std::mutex> lock(comm->err_mu);
    comm->last_error = text;
  }
}

template <typename F>
chorusResult_t guarded(chorusComm* comm, F&& f) {
  try {
    f();
    return chorusSuccess;
  } catch (const Error& e) {
    const std::string text = with_rank(comm, e.what());
    CHORUS_INFO(Core, "%s", text.c_str());
    set_error(comm, text);
    return e.code();
  } catch (const std::bad_alloc&) {
    set_error(comm, "out of memory");
    return chorusSystemError;
  } catch (const std::exception& e) {
    set_error(comm, std::string("internal error: ") + e.what());
    return chorusInternalError;
  }
}

// A copy of the request behind a handle if it is live (an empty one otherwise, and for NULL), so that a
// chorusRequestFree from another thread cannot free what this call uses.
chorusRequest live_request(const chorusRequest* request) {
  if (request == nullptr) return {};
  std::lock_guard<std::mutex> lock(g_requests_mu);
  if (g_requests.count(request) == 0) return {};
  return *request;
}

Error not_a_live_request() {
  return Error(chorusInvalidUsage, Subsys::Core, "request is not a live request (used after chorusRequestFree?)");
}

// One API call's use of a communicator (see chorusComm::users). Sequentially consistent with retire(): either the
// call sees the communicator retired, or retire() sees the call and waits for it.
class Live {
 public:
  explicit Live(chorusComm* comm) : comm_(comm) {
    if (comm == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "comm is NULL");
    refuse_parents_handle(comm);
    comm->users.fetch_add(1);
    impl_ = comm->impl.load();
    if (impl_ == nullptr) {
      comm->users.fetch_sub(1);
      throw Error(chorusInvalidUsage, Subsys::Core,
                  "comm is not a live communicator (used after chorusCommDestroy or chorusCommAbort?)");
    }
  }
  ~Live() { comm_->users.fetch_sub(1); }
  Live(const Live&) = delete;
  Live& operator=(const Live&) = delete;
  CommImpl& operator*() const { return *impl_; }

 private:
  chorusComm* comm_;
  CommImpl* impl_ = nullptr;
};

chorusComm* wrap(std::unique_ptr<CommImpl> impl) {
  auto* c = new chorusComm;
  c->rank = impl->rank();
  c->forks = g_forks.load(std::memory_order_relaxed);
  c->pid = getpid();
  c->impl.store(impl.release(), std::memory_order_release);
  return c;
}

// Frees the communicator and leaves the handle as a tombstone, kept in a list so it stays reachable (a deliberate
// few bytes per destroyed communicator, not a leak). The caller holds one Live of `comm`; of several threads that
// retire it at once, one frees it, after every other call inside it has left (an aborted communicator's calls fail
// at once; a call that races a destroy, which the API forbids, is waited for).
void retire(chorusComm* comm) {
  CommImpl* impl = comm->impl.exchange(nullptr);
  if (impl == nullptr) return;
  while (comm->users.load() > 1) std::this_thread::sleep_for(std::chrono::microseconds(100));
  delete impl;
  static std::mutex mu;
  static auto* tombstones = new std::vector<chorusComm*>();
  std::lock_guard<std::mutex> lock(mu);
  tombstones->push_back(comm);
}

// Group state: the calls made between chorusGroupStart and chorusGroupEnd, per thread.
struct GroupOp {
  chorusComm* comm = nullptr;
  std::optional<CollArgs> coll;  // a collective (validated), else the point-to-point call `op`
  P2POp op;
  chorusStream_t stream = nullptr;
  int on_stream = -1;  // 1: stream-ordered (a stream or a device buffer), 0: host, -1: either (no stream, no bytes)
};
struct GroupState {
  int depth = 0;
  std::vector<GroupOp> ops;
  // The first call refused when it was made inside the group (its code and text): chorusGroupEnd returns it too.
  chorusResult_t refused = chorusSuccess;
  std::string refused_text;
  // The communicators that had a call refused, with the first refusal's text: one that also has collectives in the
  // group runs none of its calls (its collectives would meet other collectives of its peers).
  struct Refusal {
    chorusComm* comm;
    chorusResult_t code;
    std::string text;
    bool collective;  // a collective was refused on it (not queued: it still counts for "all or none")
  };
  std::vector<Refusal> refused_on;
};
thread_local GroupState t_group;

// The result of a call on `comm` that may be made inside a group (`collective`: a collective call): a refusal there
// is kept for chorusGroupEnd.
chorusResult_t noted_in_group(chorusComm* comm, chorusResult_t r, bool collective = false) {
  if (r == chorusSuccess || t_group.depth == 0) return r;
  if (t_group.refused == chorusSuccess) {
    t_group.refused = r;
    t_group.refused_text = t_last_error;
  }
  auto known = std::find_if(t_group.refused_on.begin(), t_group.refused_on.end(),
                            [&](const GroupState::Refusal& e) { return e.comm == comm; });
  if (known == t_group.refused_on.end())
    t_group.refused_on.push_back({comm, r, t_last_error, collective});
  else
    known->collective |= collective;
  return r;
}

// Calls that block on their peers, or would end the group's queued calls, are refused inside a group: they would
// wait for peers that wait for this group's chorusGroupEnd, or drop what it queued.
void refuse_in_group(const char* call) {
  if (t_group.depth > 0)
    throw Error(chorusInvalidUsage, Subsys::Core,
                cat(call,
                    " inside a group (of the calls that communicate, a group takes the blocking collectives and "
                    "chorusSend/chorusRecv; call chorusGroupEnd first)"));
}

// Device buffers (CUDA builds): a call with a stream, or with device buffers, is stream-ordered
// (src/runtime/cuda_stream.h); the other forms take host buffers only.
bool uses_device(const CollArgs& a) {
#ifdef CHORUS_WITH_CUDA
  if (cuda_stream::is_device_pointer(a.send) || cuda_stream::is_device_pointer(a.recv)) return true;
  for (const P2POp& op : a.p2p)
    if (cuda_stream::is_device_pointer(op.buf)) return true;
#else
  (void)a;
#endif
  return false;
}

void host_buffers_only(const CollArgs& a, const char* form) {
  if (uses_device(a))
    throw Error(chorusNotSupported, Subsys::Core,
                cat("device buffers: ", form, " takes host buffers; use the blocking form with a CUDA stream"));
}

void no_stream_without_cuda(chorusStream_t stream) {
#ifndef CHORUS_WITH_CUDA
  if (stream != nullptr)
    throw Error(chorusNotSupported, Subsys::Core, "stream: CUDA streams need a CUDA build; pass NULL for host buffers");
#else
  (void)stream;
#endif
}

// The caller's stream as the library sees it: cudaStreamLegacy ((cudaStream_t)0x1, CUDA runtime API) is NULL, the
// legacy default stream that the library's CUDA calls take NULL to mean (it is built without per-thread default
// streams). So the two are one stream in a group, and host buffers with either are a blocking host call.
chorusStream_t canonical(chorusStream_t stream) {
  return reinterpret_cast<uintptr_t>(stream) == 0x1 ? nullptr : stream;
}

// Runs the validated call `a` (a collective, or point-to-point calls of one communicator) under the caller's guard:
// stream-ordered when there is a stream or a device buffer (src/runtime/cuda_stream.h), else on the host.
void run(CommImpl& c, CollArgs a, chorusStream_t stream) {
#ifdef CHORUS_WITH_CUDA
  if (stream != nullptr || uses_device(a)) {
    cuda_stream::enqueue(c, std::move(a), stream);
    return;
  }
#endif
  c.run_blocking(std::move(a));
}

// Queues a validated call made inside a group: the collective `coll`, else the point-to-point call `op`. Every call
// of one communicator in a group takes one stream, and all device or all host buffers (they run as one program).
void add_to_group(chorusComm* comm, std::optional<CollArgs> coll, const P2POp& op, chorusStream_t stream) {
  const CollArgs* a = coll ? &*coll : nullptr;
  CollArgs one;
  if (a == nullptr) {
    one.coll = algo::Coll::SendRecv;
    one.p2p.push_back(op);
    a = &one;
  }
  const std::string what = !coll ? cat(op.is_send ? "sendbuff" : "recvbuff", " is") : "this collective's buffers are";
  const bool moves_bytes = !coll ? op.count > 0 : a->count > 0 || a->coll == algo::Coll::AllToAllv;
  const int on_stream = (stream != nullptr || uses_device(*a)) ? 1 : (moves_bytes ? 0 : -1);
  for (const GroupOp& g : t_group.ops) {
    if (g.comm != comm) continue;
    if (g.stream != stream)
      throw Error(chorusInvalidUsage, Subsys::Core,
                  "stream: the calls of one communicator in a group take one stream (this call's differs from an "
                  "earlier call's)");
    if (g.on_stream >= 0 && on_stream >= 0 && g.on_stream != on_stream)
      throw Error(chorusInvalidArgument, Subsys::Core,
                  cat(what, " ", on_stream ? "device" : "host", " memory, but an earlier call of this group on ",
                      "this communicator has ", g.on_stream ? "device" : "host", " buffers (a group moves one or ",
                      "the other)"));
  }
  t_group.ops.push_back({comm, std::move(coll), op, stream, on_stream});
}

chorusResult_t collective(chorusComm* comm, CollArgs a, chorusStream_t stream) {
  stream = canonical(stream);
  const chorusResult_t r = guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    no_stream_without_cuda(stream);
    CommImpl::Guard guard(c);
    c.validate(a);
    if (t_group.depth > 0) {
      // Its buffers are checked now too, as outside a group, so that a refusal leaves nothing of it queued.
#ifdef CHORUS_WITH_CUDA
      if (stream != nullptr || uses_device(a)) cuda_stream::check_buffers(c, a);
#endif
      add_to_group(comm, std::move(a), P2POp{}, stream);
      return;
    }
    run(c, std::move(a), stream);
  });
  return noted_in_group(comm, r, /*collective=*/true);
}

chorusResult_t icollective(chorusComm* comm, CollArgs a, chorusRequest_t* request) {
  const chorusResult_t r = guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    if (request == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "request is NULL");
    refuse_in_group("a non-blocking collective");
    host_buffers_only(a, "a non-blocking call");
    CommImpl::Guard guard(c);
    c.validate(a);
    auto r = std::make_unique<chorusRequest>();
    r->comm = comm;
    r->state = c.submit(std::move(a));
    {
      std::lock_guard<std::mutex> lock(g_requests_mu);
      g_requests.insert(r.get());
    }
    *request = r.release();
  });
  // Refused in every group, on every rank alike: never queued anywhere, so it cannot leave a peer's collective
  // unmatched, and does not count for "all or none".
  return noted_in_group(comm, r, /*collective=*/false);
}

chorusResult_t p2p(chorusComm* comm, bool is_send, void* buf, size_t count, chorusDataType_t dtype, int peer,
                   chorusStream_t stream) {
  stream = canonical(stream);
  const chorusResult_t r = guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    no_stream_without_cuda(stream);
    const P2POp op{is_send, peer, buf, count, dtype};
    CollArgs a;
    a.coll = algo::Coll::SendRecv;
    a.p2p.push_back(op);
    // A group's calls are checked one by one here, and as a whole (self-sends against self-receives) at its end.
    if (t_group.depth > 0)
      c.validate_p2p_op(op);
    else
      c.validate(a);
#ifdef CHORUS_WITH_CUDA
    if ((stream != nullptr || uses_device(a)) && count > 0)
      cuda_stream::require_device_buffer(buf, is_send ? "sendbuff" : "recvbuff");
#endif
    if (t_group.depth > 0) {
      add_to_group(comm, std::nullopt, op, stream);
      return;
    }
    CommImpl::Guard guard(c);
    run(c, std::move(a), stream);
  });
  return noted_in_group(comm, r);
}

}  // namespace

std::string last_algorithm(chorusComm_t comm) {
  if (comm == nullptr) return "";
  try {
    Live live(comm);
    return (*live).last_algorithm();
  } catch (const Error&) {
    return "";  // destroyed
  }
}

}  // namespace chorus

using namespace chorus;

extern "C" {

chorusResult_t chorusGetVersion(int* version) {
  if (version == nullptr) {
    set_error(nullptr, "version is NULL");
    return chorusInvalidArgument;
  }
  *version = CHORUS_VERSION_CODE;
  return chorusSuccess;
}

const char* chorusGetErrorString(chorusResult_t r) {
  switch (r) {
    case chorusSuccess: return "no error";
    case chorusUnhandledCudaError: return "unhandled cuda error";
    case chorusSystemError: return "unhandled system error (network, shared memory, ...)";
    case chorusInternalError: return "internal error (a bug in Chorus)";
    case chorusInvalidArgument: return "invalid argument";
    case chorusInvalidUsage: return "invalid usage";
    case chorusRemoteError: return "remote process failed or called a mismatched operation";
    case chorusInProgress: return "operation in progress";
    case chorusTimeout: return "operation timed out";
    case chorusNotSupported: return "not supported";
    default: return "unknown result code";
  }
}

const char* chorusGetLastError(chorusComm_t comm) {
  if (comm == nullptr || comm->impl.load(std::memory_order_acquire) == nullptr || parents_handle(comm))
    return t_last_error.c_str();
  // Copied into a buffer of its own, so that asking about a communicator leaves this thread's last error alone.
  thread_local std::string t_comm_error;
  std::lock_guard<std::mutex> lock(comm->err_mu);
  t_comm_error = comm->last_error;
  return t_comm_error.c_str();
}

size_t chorusTypeSize(chorusDataType_t dtype) { return dtype_valid(dtype) ? dtype_size(dtype) : 0; }

chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId) {
  return guarded(nullptr, [&] {
    if (uniqueId == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "uniqueId is NULL");
    *uniqueId = encode_unique_id(create_unique_id());
  });
}

chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "comm is NULL");
    warn_unknown_settings_once();
    try {
      *comm = wrap(std::make_unique<CommImpl>(decode_unique_id(commId), nranks, rank));
    } catch (const Error& e) {
      // NCCL defers the inits of a group to its end and runs them together; here each blocks where it is called.
      if (e.code() != chorusTimeout || t_group.depth == 0) throw;
      throw Error(e.code(), e.subsys(),
                  cat(e.what(),
                      " (this init was inside a group: each init blocks until its rendezvous completes, "
                      "so initialise each rank from its own thread or process)"));
    }
  });
}

chorusResult_t chorusCommInitAll(chorusComm_t* comms, int nranks) {
  return guarded(nullptr, [&] {
    if (nranks < 1) throw Error(chorusInvalidArgument, Subsys::Core, cat("nranks=", nranks, " must be at least 1"));
    if (comms == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "comms is NULL");
    warn_unknown_settings_once();
    const UniqueIdData id = create_unique_id();
    // Each rank joins the rendezvous from a thread of its own (an init blocks until every rank has joined). The
    // threads start only once all of them exist, so a thread that cannot be created leaves no rank waiting for it;
    // a rank that was made while another failed is freed by its own thread, alongside the others.
    const auto n = static_cast<size_t>(nranks);
    std::vector<std::unique_ptr<CommImpl>> made(n);
    std::vector<std::optional<Error>> failed(n);
    // The first rank to fail ends the others' waits at once (their rendezvous would otherwise wait for it until
    // CHORUS_TIMEOUT_MS), and its error is the one returned: theirs only say that it failed.
    std::atomic<int> first_failed{-1};
    auto check_stop = [&] {
      if (const int f = first_failed.load(); f >= 0)
        throw Error(chorusRemoteError, Subsys::Core, cat("rank ", f, " of this chorusCommInitAll failed"));
    };
    std::mutex mu;
    std::condition_variable cv;
    enum class Gate { Wait, Go, Stop } start = Gate::Wait, finish = Gate::Wait;
    int done = 0;
    auto await = [&](const Gate& g) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return g != Gate::Wait; });
      return g;
    };
    auto open = [&](Gate& g, Gate to) {
      {
        std::lock_guard<std::mutex> lock(mu);
        g = to;
      }
      cv.notify_all();
    };
    std::vector<std::thread> threads;
    threads.reserve(n);
    std::string spawn_error;
    try {
      for (size_t r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          if (await(start) == Gate::Stop) return;
          try {
            made[r] = std::make_unique<CommImpl>(id, nranks, static_cast<int>(r), nullptr, check_stop);
          } catch (const Error& e) {
            failed[r] = e;
          } catch (const std::bad_alloc&) {
            failed[r] = Error(chorusSystemError, Subsys::Core, "out of memory");
          } catch (const std::exception& e) {
            failed[r] = Error(chorusInternalError, Subsys::Core, cat("internal error: ", e.what()));
          }
          if (failed[r]) {
            int none = -1;
            first_failed.compare_exchange_strong(none, static_cast<int>(r));
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            ++done;
          }
          cv.notify_all();
          if (await(finish) == Gate::Stop) made[r].reset();
        });
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc for the thread's state
      spawn_error = cat("cannot start a thread for rank ", threads.size(), " of ", nranks, ": ", e.what());
    }
    open(start, spawn_error.empty() ? Gate::Go : Gate::Stop);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !spawn_error.empty() || done == nranks; });
    }
    const int first = first_failed.load();
    open(finish, spawn_error.empty() && first < 0 ? Gate::Go : Gate::Stop);
    for (std::thread& t : threads) t.join();
    if (!spawn_error.empty()) throw Error(chorusSystemError, Subsys::Core, spawn_error);
    if (first >= 0) {
      const Error& e = *failed[static_cast<size_t>(first)];
      throw Error(e.code(), e.subsys(), cat("rank ", first, " of ", nranks, " failed to initialise: ", e.what()));
    }
    for (size_t r = 0; r < n; ++r) comms[r] = wrap(std::move(made[r]));
  });
}

chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "comm is NULL");
    warn_unknown_settings_once();  // before the launch variables are read: a misspelt one is why they fail
    LaunchEnv env = read_launch_env();
    UniqueIdData id;
    id.secret = env.secret;
    id.root = resolve(env.root_host, env.root_port);
    if (env.rank == 0) {
      // Rank 0 serves the rendezvous on the launcher's port, on every local address of the family the root's
      // address resolves to (the others resolve the same name): IPv4, or IPv6 for a MASTER_ADDR such as ::1.
      sockaddr_storage any = resolve(id.root.ss_family == AF_INET6 ? "::" : "0.0.0.0", env.root_port);
      try {
        start_root_service(any, env.secret);
      } catch (const Error& e) {
        throw Error(e.code(), e.subsys(),
                    cat("rank 0 cannot serve the rendezvous on the port that ", env.root_from, " give(s): ", e.what()));
      }
    }
    *comm = wrap(std::make_unique<CommImpl>(id, env.nranks, env.rank));
  });
}

chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm) {
  const chorusResult_t r = guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    refuse_in_group("chorusCommSplit");
    CommImpl::Guard guard(c);
    auto impl = c.split(color, key, newcomm != nullptr);
    chorusComm* child = impl ? wrap(std::move(impl)) : nullptr;
    if (child != nullptr) child->origin = cat(" (split color ", color, " of rank ", comm->rank, comm->origin, ")");
    *newcomm = child;
  });
  return noted_in_group(comm, r);
}

chorusResult_t chorusCommDestroy(chorusComm_t comm) {
  if (comm == nullptr) return chorusSuccess;  // as ncclCommDestroy(NULL): cleanup code may destroy what it never made
  // A retired handle stays allocated (retire), so its error text can be set even after a failed second destroy.
  const chorusResult_t r = guarded(comm, [&] {
    const Live use(comm);
    refuse_in_group("chorusCommDestroy");
    {
      // Refused while another thread is inside a call on this communicator.
      CommImpl::Guard guard(*use);
      // Queued work finishes first, while the communicator is still published: a watchdog's chorusCommAbort can
      // then end a wait for a peer that will not come, instead of finding the handle retired.
      (*use).drain();
    }
    retire(comm);
  });
  return noted_in_group(comm, r);
}

chorusResult_t chorusCommAbort(chorusComm_t comm) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    c.abort();
    retire(comm);
  });
}

chorusResult_t chorusCommCount(const chorusComm_t comm, int* count) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    if (count == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "count is NULL");
    *count = c.nranks();
  });
}

chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    if (rank == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "rank is NULL");
    *rank = c.rank();
  });
}

chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    if (asyncError == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "asyncError is NULL");
    std::string text;
    *asyncError = c.async_error(&text);
    if (*asyncError != chorusSuccess) set_error(comm, with_rank(comm, text));
  });
}

chorusResult_t chorusRedOpCreatePreMulSum(chorusRedOp_t* op, void* scalar, chorusDataType_t datatype,
                                          chorusScalarResidence_t residence, chorusComm_t comm) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    if (op == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "op is NULL");
    if (residence == chorusScalarDevice)
      throw Error(chorusNotSupported, Subsys::Core,
                  "residence=chorusScalarDevice is not supported (in any build): pass the scalar's value with "
                  "chorusScalarHostImmediate");
    if (residence != chorusScalarHostImmediate)
      throw Error(chorusInvalidArgument, Subsys::Core, cat("residence=", static_cast<int>(residence), " is invalid"));
    CommImpl::Guard guard(c);
    *op = c.create_premul(scalar, datatype);
  });
}

chorusResult_t chorusRedOpDestroy(chorusRedOp_t op, chorusComm_t comm) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    CommImpl::Guard guard(c);
    c.destroy_premul(op);
  });
}

namespace {
// Copies the caller's options into the call's arguments (validated with them); an error is reported as the call's.
chorusResult_t apply_options(chorusComm* comm, CollArgs& a, const chorusCollOptions_t* options) {
  if (options != nullptr) {
    if (options->size < offsetof(chorusCollOptions_t, algorithm) + sizeof(options->algorithm))
      return guarded(comm, [&] {
        throw Error(
            chorusInvalidArgument, Subsys::Core,
            cat("options->size=", options->size, " is too small: initialise options with CHORUS_COLL_OPTIONS_INIT"));
      });
    if (options->algorithm != nullptr) a.algorithm = options->algorithm;
    const bool has_compression =
        options->size >= offsetof(chorusCollOptions_t, compression) + sizeof(options->compression);
    if (has_compression && options->compression != nullptr) {
      const chorusCompression_t& z = *options->compression;
      chorusResult_t bad = chorusSuccess;
      std::string why;
      if (z.size < offsetof(chorusCompression_t, error_feedback_elems) + sizeof(z.error_feedback_elems)) {
        bad = chorusInvalidArgument;
        why = cat("options->compression->size=", z.size,
                  " is too small: initialise it with CHORUS_COMPRESSION_INIT(codec)");
      } else if (z.codec < chorusCodecInt8 || z.codec > chorusCodecSignVote) {
        bad = chorusInvalidArgument;
        why = cat("options->compression->codec=", static_cast<int>(z.codec), " is not a chorusCodec_t");
      } else if (z.stochastic_rounding != 0 && z.stochastic_rounding != 1) {
        bad = chorusInvalidArgument;
        why = cat("options->compression->stochastic_rounding=", z.stochastic_rounding, " must be 0 or 1");
      } else if (z.size >= offsetof(chorusCompression_t, rotation) + sizeof(z.rotation) && z.rotation != 0 &&
                 z.rotation != 1) {
        bad = chorusInvalidArgument;
        why = cat("options->compression->rotation=", z.rotation, " must be 0 or 1");
      } else if (z.error_feedback == nullptr && z.error_feedback_elems != 0) {
        bad = chorusInvalidArgument;
        why = cat("options->compression->error_feedback is NULL with error_feedback_elems=", z.error_feedback_elems);
      }
      if (bad != chorusSuccess) return guarded(comm, [&] { throw Error(bad, Subsys::Core, why); });
      a.compressed = true;
      a.codec.kind = kernels::codec::codec_kind(z.codec);
      a.codec.block = z.block;
      a.codec.stochastic_rounding = z.stochastic_rounding != 0;
      a.codec.seed = z.seed;
      a.codec.rotation = z.size >= offsetof(chorusCompression_t, rotation) + sizeof(z.rotation) && z.rotation != 0;
      a.codec_step = z.step;
      a.error_feedback = z.error_feedback;
      a.error_feedback_elems = z.error_feedback_elems;
    }
  }
  return chorusSuccess;
}

chorusResult_t collective_ex(chorusComm* comm, CollArgs a, const chorusCollOptions_t* options, chorusStream_t stream) {
  const chorusResult_t r = noted_in_group(comm, apply_options(comm, a, options), /*collective=*/true);
  return r != chorusSuccess ? r : collective(comm, std::move(a), stream);
}

chorusResult_t icollective_ex(chorusComm* comm, CollArgs a, const chorusCollOptions_t* options,
                              chorusRequest_t* request) {
  const chorusResult_t r = noted_in_group(comm, apply_options(comm, a, options), /*collective=*/false);
  return r != chorusSuccess ? r : icollective(comm, std::move(a), request);
}
}  // namespace

chorusResult_t chorusAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                 chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                 chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::AllReduce;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = count;
  a.dtype = datatype;
  a.op = op;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusBroadcastEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                 int root, const chorusCollOptions_t* options, chorusComm_t comm,
                                 chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::Broadcast;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = count;
  a.dtype = datatype;
  a.root = root;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusRedOp_t op, int root, const chorusCollOptions_t* options, chorusComm_t comm,
                              chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::Reduce;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = count;
  a.dtype = datatype;
  a.op = op;
  a.root = root;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                 const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::AllGather;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = sendcount;
  a.dtype = datatype;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                     chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                     chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::ReduceScatter;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = recvcount;
  a.dtype = datatype;
  a.op = op;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusAllToAllEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::AllToAll;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = count;
  a.dtype = datatype;
  return collective_ex(comm, std::move(a), options, stream);
}

chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream) {
  return chorusAllReduceEx(sendbuff, recvbuff, count, datatype, op, nullptr, comm, stream);
}
chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                               chorusComm_t comm, chorusStream_t stream) {
  return chorusBroadcastEx(sendbuff, recvbuff, count, datatype, root, nullptr, comm, stream);
}
chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                            chorusRedOp_t op, int root, chorusComm_t comm, chorusStream_t stream) {
  return chorusReduceEx(sendbuff, recvbuff, count, datatype, op, root, nullptr, comm, stream);
}
chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream) {
  return chorusAllGatherEx(sendbuff, recvbuff, sendcount, datatype, nullptr, comm, stream);
}
chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                   chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream) {
  return chorusReduceScatterEx(sendbuff, recvbuff, recvcount, datatype, op, nullptr, comm, stream);
}
chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusComm_t comm, chorusStream_t stream) {
  return chorusAllToAllEx(sendbuff, recvbuff, count, datatype, nullptr, comm, stream);
}

chorusResult_t chorusGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                              int root, const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::Gather;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = sendcount;
  a.dtype = datatype;
  a.root = root;
  return collective_ex(comm, std::move(a), options, stream);
}
chorusResult_t chorusScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                               int root, const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::Scatter;
  a.send = sendbuff;
  a.recv = recvbuff;
  a.count = recvcount;
  a.dtype = datatype;
  a.root = root;
  return collective_ex(comm, std::move(a), options, stream);
}
chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype, int root,
                            chorusComm_t comm, chorusStream_t stream) {
  return chorusGatherEx(sendbuff, recvbuff, sendcount, datatype, root, nullptr, comm, stream);
}
chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusStream_t stream) {
  return chorusScatterEx(sendbuff, recvbuff, recvcount, datatype, root, nullptr, comm, stream);
}

namespace {
chorusResult_t alltoallv_args(CollArgs& a, chorusComm* comm, const void* sendbuff, const size_t* sendcounts,
                              const size_t* sdispls, void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                              chorusDataType_t datatype) {
  return guarded(comm, [&] {
    const Live use(comm);
    CommImpl& c = *use;
    size_t n = static_cast<size_t>(c.nranks());
    const std::pair<const size_t*, const char*> arrays[] = {
        {sendcounts, "sendcounts"}, {sdispls, "sdispls"}, {recvcounts, "recvcounts"}, {rdispls, "rdispls"}};
    for (const auto& [array, name] : arrays)
      if (array == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, cat(name, " is NULL"));
    a.coll = algo::Coll::AllToAllv;
    a.send = sendbuff;
    a.recv = recvbuff;
    a.dtype = datatype;
    a.sendcounts.assign(sendcounts, sendcounts + n);
    a.sdispls.assign(sdispls, sdispls + n);
    a.recvcounts.assign(recvcounts, recvcounts + n);
    a.rdispls.assign(rdispls, rdispls + n);
  });
}
}  // namespace

chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                               const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  chorusResult_t r = noted_in_group(
      comm, alltoallv_args(a, comm, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype),
      /*collective=*/true);
  return r != chorusSuccess ? r : collective(comm, std::move(a), stream);
}

chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream) {
  CollArgs a;
  a.coll = algo::Coll::Barrier;
  a.dtype = chorusUint8;
  return collective(comm, std::move(a), stream);
}

chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream) {
  return p2p(comm, true, const_cast<void*>(sendbuff), count, datatype, peer, stream);
}

chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream) {
  return p2p(comm, false, recvbuff, count, datatype, peer, stream);
}

chorusResult_t chorusGroupStart(void) {
  ++t_group.depth;
  return chorusSuccess;
}

chorusResult_t chorusGroupEnd(void) {
  if (t_group.depth == 0) {
    set_error(nullptr, "chorusGroupEnd without chorusGroupStart");
    return chorusInvalidUsage;
  }
  if (--t_group.depth > 0) return chorusSuccess;
  auto ops = std::move(t_group.ops);
  t_group.ops.clear();
  const chorusResult_t refused = std::exchange(t_group.refused, chorusSuccess);
  const std::string refused_text = std::exchange(t_group.refused_text, std::string());
  const auto refused_on = std::exchange(t_group.refused_on, {});
  // One program per communicator, in the order the communicators first appear: its collectives in the order they
  // were called, then its point-to-point calls as one call (issued together).
  struct Program {
    chorusComm* comm = nullptr;
    std::vector<CollArgs> calls;
    chorusStream_t stream = nullptr;  // the same for every call of the communicator (checked when added)
    bool ordered = false;             // stream-ordered (a stream or device buffers), else host
    bool issued = false;              // run, enqueued or submitted (or failed before)
    bool all_or_none = false;         // runs all of its calls or none (below)
    uint64_t comm_id = 0;             // of its communicator (the same for every rank of it)
    int rank = -1;
    chorusResult_t result = chorusSuccess;
    std::string error;  // the thread's error text when `result` was set (another call may replace it since)
  };
  // Sets a program's result from guarded(), which has just written the thread's error text on failure.
  auto settle = [](Program& p, chorusResult_t r) {
    p.result = r;
    if (r != chorusSuccess) p.error = t_last_error;
  };
  // Ranks of one communicator that this thread drives in the group (one thread for several thread-ranks), by
  // communicator id: one that cannot run all of its calls stops the others, whose calls would wait for it.
  std::map<chorusComm*, uint64_t> id_of;  // every communicator named in the group; 0 for one that is not live
  std::map<uint64_t, int> ranks_here;
  auto note = [&](chorusComm* c) {
    if (c == nullptr || id_of.count(c) > 0) return;
    uint64_t id = 0;
    try {
      const Live use(c);
      id = (*use).comm_id();
    } catch (const Error&) {
      // not live: refused below, stopping nothing else
    }
    id_of[c] = id;
    if (id != 0) ++ranks_here[id];
  };
  for (const GroupOp& g : ops) note(g.comm);
  for (const GroupState::Refusal& f : refused_on) note(f.comm);
  auto shared = [&](chorusComm* c) {
    const auto it = id_of.find(c);
    return it != id_of.end() && it->second != 0 && ranks_here[it->second] > 1;
  };
  // The communicators in the order they first appear, then those whose only calls were refused when they were made,
  // if collectives or if another rank of theirs is here: they have nothing to run, but their refusal stops the
  // other ranks this thread drives.
  std::vector<chorusComm*> comms;
  auto add_comm = [&](chorusComm* c) {
    if (c != nullptr && std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  };
  for (const GroupOp& g : ops) add_comm(g.comm);
  for (const GroupState::Refusal& f : refused_on)
    if (f.collective || shared(f.comm)) add_comm(f.comm);
  std::vector<Program> programs;
  for (chorusComm* comm : comms) {
    Program& p = programs.emplace_back();
    p.comm = comm;
    CollArgs p2p;
    p2p.coll = algo::Coll::SendRecv;
    bool first = true;
    for (GroupOp& g : ops) {
      if (g.comm != comm) continue;
      if (std::exchange(first, false)) p.stream = g.stream;
      if (g.coll)
        p.calls.push_back(std::move(*g.coll));
      else
        p2p.p2p.push_back(g.op);
    }
    // A communicator with collectives in the group runs all of its calls or none: without one that was refused, its
    // later collectives would meet other collectives of its peers (the same kind and size: silently wrong values).
    // So does one of which this thread drives other ranks here too: their calls would wait for those not run.
    const bool all_or_none = p.all_or_none =
        !p.calls.empty() || shared(comm) ||
        std::any_of(refused_on.begin(), refused_on.end(),
                    [&](const GroupState::Refusal& f) { return f.comm == p.comm && f.collective; });
    const char* none_ran = "; so none of this communicator's calls in the group ran, its collectives neither";
    settle(p, guarded(p.comm, [&] {
             const Live use(p.comm);
             p.comm_id = (*use).comm_id();
             p.rank = (*use).rank();
             for (const GroupState::Refusal& f : refused_on) {
               if (!all_or_none || f.comm != p.comm) continue;
               std::string why = f.text;  // without this rank's prefix, which the error gets again
               if (const std::string self = cat("rank ", p.rank, ": "); why.rfind(self, 0) == 0)
                 why.erase(0, self.size());
               throw Error(f.code, Subsys::Core,
                           cat("chorusGroupEnd: a call was refused when it was made (", why, ")", none_ran));
             }
             if (!p2p.p2p.empty()) {
               try {
                 (*use).validate(p2p);  // the group as a whole: its sends to this rank against its receives from it
               } catch (const Error& e) {
                 if (!all_or_none) throw;
                 throw Error(e.code(), e.subsys(), cat(e.what(), none_ran));
               }
               p.calls.push_back(std::move(p2p));
             }
             p.ordered = p.stream != nullptr || std::any_of(p.calls.begin(), p.calls.end(), uses_device);
           }));
    p.issued = p.result != chorusSuccess;
  }
  // Other ranks of such a communicator that this thread drives in the same group (one thread for several
  // thread-ranks) would wait for it until the timeout: none of their calls run either, at once.
  for (const Program& failed : programs) {
    if (!failed.all_or_none || failed.result == chorusSuccess || failed.comm_id == 0) continue;
    for (Program& q : programs) {
      if (q.issued || q.comm_id != failed.comm_id) continue;
      q.issued = true;
      settle(q, guarded(q.comm, [&] {
               throw Error(failed.result, Subsys::Core,
                           cat("chorusGroupEnd: rank ", failed.rank,
                               " of this communicator, in this group too, runs "
                               "none of its calls (",
                               failed.error,
                               "); so none of this rank's calls in the group ran "
                               "either: they would wait for rank ",
                               failed.rank));
             }));
    }
  }
  // The first communicator's error, else the first call refused when it was made (the others ran without it). The
  // thread's error text is the one of the error returned, whichever communicator failed last.
  auto first_error = [&] {
    for (const Program& p : programs)
      if (p.result != chorusSuccess) {
        t_last_error = p.error;
        return p.result;
      }
    if (refused != chorusSuccess)
      set_error(nullptr,
                cat("chorusGroupEnd: the group ran without a call it refused when it was made: ", refused_text));
    return refused;
  };
  // One communicator to run: it runs here. Several: their programs run at once, so ranks that called the
  // communicators in other orders still meet: the stream-ordered ones staged together (every post before any wait,
  // cuda_stream::enqueue_together), the host ones on the communicators' worker threads.
  if (std::count_if(programs.begin(), programs.end(), [](const Program& p) { return !p.issued; }) <= 1) {
    for (Program& p : programs)
      if (!p.issued)
        settle(p, guarded(p.comm, [&] {
                 const Live use(p.comm);
                 CommImpl& c = *use;
                 CommImpl::Guard guard(c);
                 for (CollArgs& a : p.calls) run(c, std::move(a), p.stream);
               }));
    return first_error();
  }
  // Several communicators' stream-ordered collectives would have to be staged together as their point-to-point
  // calls are (every post before any wait), which the device-direct paths do not do: refused, with nothing run.
  const auto has_collective = [](const Program& p) {
    return std::any_of(p.calls.begin(), p.calls.end(),
                       [](const CollArgs& a) { return a.coll != algo::Coll::SendRecv; });
  };
  if (std::any_of(programs.begin(), programs.end(),
                  [&](const Program& p) { return !p.issued && p.ordered && has_collective(p); })) {
    for (Program& p : programs)
      if (!p.issued)
        settle(p, guarded(p.comm, [&] {
                 throw Error(chorusNotSupported, Subsys::Core,
                             "chorusGroupEnd: a group that spans several communicators takes collectives on host "
                             "buffers only; on a CUDA stream or device buffers it takes chorusSend/chorusRecv (nothing "
                             "in the group ran: call the collectives outside it, one thread per communicator)");
               }));
    return first_error();
  }
  // A communicator in use by this group end: another thread's call on it is refused (Guard), and a destroy waits
  // (Live), until its program is enqueued or done, as for a single communicator's.
  struct Held {
    explicit Held(chorusComm* comm) : use(comm), guard(*use) {}
    Live use;
    CommImpl::Guard guard;
  };
#ifdef CHORUS_WITH_CUDA
  {
    // Each stream-ordered program under its communicator's guard while it is enqueued.
    std::vector<std::unique_ptr<Held>> held;
    std::vector<Program*> staged;
    std::vector<cuda_stream::Call> calls;
    for (Program& p : programs) {
      if (p.issued || !p.ordered) continue;
      p.issued = true;
      settle(p, guarded(p.comm, [&] {
               held.push_back(std::make_unique<Held>(p.comm));
               // Point-to-point calls only (refused above otherwise): one call.
               calls.push_back(cuda_stream::Call{&*held.back()->use, std::move(p.calls.back()), p.stream, nullptr});
               staged.push_back(&p);
             }));
    }
    if (!calls.empty()) cuda_stream::enqueue_together(calls);
    for (size_t k = 0; k < calls.size(); ++k)
      if (calls[k].error) settle(*staged[k], guarded(staged[k]->comm, [&] { std::rethrow_exception(calls[k].error); }));
  }
#endif
  struct Submitted {
    Program* program;
    std::unique_ptr<Held> held;                       // until the program is done
    std::vector<std::shared_ptr<RequestState>> reqs;  // of its calls, in order
  };
  std::vector<Submitted> submitted;
  for (Program& p : programs) {
    if (p.issued) continue;
    p.issued = true;
    settle(p, guarded(p.comm, [&] {
             auto held = std::make_unique<Held>(p.comm);
             std::vector<std::shared_ptr<RequestState>> reqs;
             for (CollArgs& a : p.calls) reqs.push_back((*held->use).submit(std::move(a)));
             submitted.push_back(Submitted{&p, std::move(held), std::move(reqs)});
           }));
  }
  // Each communicator is let go as soon as its own program is done, whatever the order: an abort of one from
  // another thread must not wait for the others.
  for (size_t left = submitted.size(); left > 0;) {
    // A program's first call still running, or null when all are done.
    auto running = [](const Submitted& s) -> RequestState* {
      for (const auto& r : s.reqs) {
        std::lock_guard<std::mutex> lock(r->mu);
        if (!r->done) return r.get();
      }
      return nullptr;
    };
    for (Submitted& s : submitted) {
      if (!s.held || running(s) != nullptr) continue;
      chorusResult_t code = chorusSuccess;
      std::string error;
      for (const auto& r : s.reqs) {  // the first call that failed (the later ones fail with its error)
        std::lock_guard<std::mutex> lock(r->mu);
        if (r->result == chorusSuccess) continue;
        code = r->result;
        error = r->error;
        break;
      }
      settle(*s.program, guarded(s.program->comm, [&] {
        if (code != chorusSuccess) throw Error(code, Subsys::Core, error);
      }));
      s.held.reset();
      --left;
    }
    for (Submitted& s : submitted)
      if (s.held) {  // the first one still running: wait for it, looking at the others every millisecond
        RequestState* r = running(s);
        if (r == nullptr) break;  // done since the loop above looked
        std::unique_lock<std::mutex> lock(r->mu);
        r->cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return r->done; });
        break;
      }
  }
  return first_error();
}

#define CHORUS_ICOLL(body) \
  CollArgs a;              \
  body;                    \
  return icollective(comm, std::move(a), request)

chorusResult_t chorusIallReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::AllReduce; a.send = sendbuff; a.recv = recvbuff; a.count = count;
               a.dtype = datatype; a.op = op);
}
chorusResult_t chorusIbroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                                chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::Broadcast; a.send = sendbuff; a.recv = recvbuff; a.count = count;
               a.dtype = datatype; a.root = root);
}
chorusResult_t chorusIreduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                             chorusRedOp_t op, int root, chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::Reduce; a.send = sendbuff; a.recv = recvbuff; a.count = count; a.dtype = datatype;
               a.op = op; a.root = root);
}
chorusResult_t chorusIallGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::AllGather; a.send = sendbuff; a.recv = recvbuff; a.count = sendcount;
               a.dtype = datatype);
}
chorusResult_t chorusIreduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                    chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::ReduceScatter; a.send = sendbuff; a.recv = recvbuff; a.count = recvcount;
               a.dtype = datatype; a.op = op);
}
chorusResult_t chorusIallToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::AllToAll; a.send = sendbuff; a.recv = recvbuff; a.count = count;
               a.dtype = datatype);
}
chorusResult_t chorusIgather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::Gather; a.send = sendbuff; a.recv = recvbuff; a.count = sendcount;
               a.dtype = datatype; a.root = root);
}
chorusResult_t chorusIscatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                              int root, chorusComm_t comm, chorusRequest_t* request) {
  CHORUS_ICOLL(a.coll = algo::Coll::Scatter; a.send = sendbuff; a.recv = recvbuff; a.count = recvcount;
               a.dtype = datatype; a.root = root);
}
#undef CHORUS_ICOLL

namespace {
// The arguments of a non-blocking all-reduce, all-gather or reduce-scatter with options.
CollArgs ex_args(algo::Coll coll, const void* send, void* recv, size_t count, chorusDataType_t dtype,
                 chorusRedOp_t op) {
  CollArgs a;
  a.coll = coll;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  return a;
}
}  // namespace

chorusResult_t chorusIallReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                  chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                  chorusRequest_t* request) {
  return icollective_ex(comm, ex_args(algo::Coll::AllReduce, sendbuff, recvbuff, count, datatype, op), options,
                        request);
}
chorusResult_t chorusIallGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                  const chorusCollOptions_t* options, chorusComm_t comm, chorusRequest_t* request) {
  return icollective_ex(comm, ex_args(algo::Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, chorusSum),
                        options, request);
}
chorusResult_t chorusIreduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                      chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                      chorusRequest_t* request) {
  return icollective_ex(comm, ex_args(algo::Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op), options,
                        request);
}

chorusResult_t chorusIallToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                                const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request) {
  CollArgs a;
  chorusResult_t r = noted_in_group(
      comm, alltoallv_args(a, comm, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype),
      /*collective=*/false);
  return r != chorusSuccess ? r : icollective(comm, std::move(a), request);
}

chorusResult_t chorusTest(chorusRequest_t request, int* done) {
  const chorusRequest r = live_request(request);
  return guarded(r.comm, [&] {
    if (request == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "request is NULL");
    if (done == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "done is NULL");
    if (!r.state) throw not_a_live_request();
    refuse_parents_handle(r.comm);
    std::lock_guard<std::mutex> lock(r.state->mu);
    *done = r.state->done ? 1 : 0;
    if (r.state->done && r.state->result != chorusSuccess) throw Error(r.state->result, Subsys::Core, r.state->error);
  });
}

chorusResult_t chorusWait(chorusRequest_t request, int64_t timeout_ms) {
  const chorusRequest r = live_request(request);
  bool running = false;  // still running when timeout_ms passed: not an error (chorusGetLastError keeps its text)
  const chorusResult_t result = guarded(r.comm, [&] {
    if (request == nullptr) throw Error(chorusInvalidArgument, Subsys::Core, "request is NULL");
    if (!r.state) throw not_a_live_request();
    refuse_parents_handle(r.comm);
    RequestState& st = *r.state;
    std::unique_lock<std::mutex> lock(st.mu);
    if (timeout_ms < 0) {
      // Until it ends: an operation ends by itself (its own deadline, CHORUS_TIMEOUT_MS, then the error that says
      // which ranks did not take part), so this does not hang, and a hang is reported by that error, not by a wait
      // that would give up first.
      st.cv.wait(lock, [&] { return st.done; });
    } else {
      // At most a year: wait_for would overflow on INT64_MAX.
      const int64_t ms = std::min<int64_t>(timeout_ms, int64_t{1} << 35);
      if (!st.cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return st.done; })) {
        running = true;
        return;
      }
    }
    if (st.result != chorusSuccess) throw Error(st.result, Subsys::Core, st.error);
  });
  return running ? chorusInProgress : result;
}

chorusResult_t chorusRequestFree(chorusRequest_t request) {
  if (request == nullptr) return chorusSuccess;
  {
    std::lock_guard<std::mutex> lock(g_requests_mu);
    if (g_requests.count(request) == 0) {
      set_error(nullptr, not_a_live_request().what());
      return chorusInvalidUsage;
    }
    if (const chorusResult_t r = guarded(nullptr, [&] { refuse_parents_handle(request->comm); }); r != chorusSuccess)
      return r;  // its operation runs in the parent: waiting for it here would never end
    g_requests.erase(request);
  }
  // Only this thread can reach it now.
  {
    std::unique_lock<std::mutex> lock(request->state->mu);
    request->state->cv.wait(lock, [&] { return request->state->done; });
  }
  delete request;
  return chorusSuccess;
}

}  // extern "C"
