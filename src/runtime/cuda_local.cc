// The device-direct path for ranks as threads of one process: see cuda_local.h.
#include "runtime/cuda_local.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/communicator.h"
#include "core/config.h"
#include "core/deadline.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/reduce.cuh"
#include "runtime/cuda_stream.h"

namespace chorus::cuda_local {
namespace {

using algo::Coll;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(chorusUnhandledCudaError, Subsys::Core,
                cat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// What a rank publishes at a rendezvous phase: its buffers, the event its stream recorded, and (phase 0) the call
// it issued, compared across ranks before anything is enqueued.
struct Entry {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  cudaEvent_t event = nullptr;
  int device = -1;
  Coll coll = Coll::AllReduce;
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  size_t count = 0;
  int root = 0;
};

// One call's rendezvous among the rank threads: phases 0, 1, 2, each complete when every rank arrived.
struct Call {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<Entry>> phase;  // [phase][rank]
  std::vector<std::vector<bool>> arrived;
  std::vector<int> count;
  int left = 0;        // ranks still to leave; the last one removes the call
  std::string failed;  // set by a rank that gave up (timeout, error): every waiting rank fails with it
};

class Registry {
 public:
  std::shared_ptr<Call> join(uint64_t comm, uint64_t seq, int nranks) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& c = calls_[{comm, seq}];
    if (!c) {
      c = std::make_shared<Call>();
      c->phase.assign(3, std::vector<Entry>(static_cast<size_t>(nranks)));
      c->arrived.assign(3, std::vector<bool>(static_cast<size_t>(nranks), false));
      c->count.assign(3, 0);
      c->left = nranks;
    }
    return c;
  }
  void leave(uint64_t comm, uint64_t seq, const std::shared_ptr<Call>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    bool last = false;
    {
      std::lock_guard<std::mutex> cl(c->mu);
      last = --c->left == 0;
    }
    if (last) calls_.erase({comm, seq});
  }

 private:
  std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<Call>> calls_;
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// Marks the call failed with `why` (the first reason stays) and wakes every waiting rank.
void give_up(Call& c, const std::string& why) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.failed.empty()) c.failed = why;
  c.cv.notify_all();
}

// Publishes `e` as rank `rank` in `phase` and waits until every rank did; returns every rank's entry. Throws
// chorusRemoteError naming the ranks missing when the timeout passes (the call is then failed for everyone, so a
// late rank does not go on alone), or with the reason of a rank that gave up. An abort of this rank's communicator,
// or a peer's failure (`comm.stop_reason()`, polled every 10 ms), gives the call up for everyone.
std::vector<Entry> arrive(const CommImpl& comm, Call& c, int phase, int rank, const Entry& e, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(c.mu);
  const int n = static_cast<int>(c.arrived[phase].size());
  if (c.failed.empty()) {
    c.phase[phase][rank] = e;
    c.arrived[phase][rank] = true;
    if (++c.count[phase] == n) c.cv.notify_all();
  }
  const auto done = [&] { return c.count[phase] == n || !c.failed.empty(); };
  const Deadline deadline = Deadline::after_ms(timeout_ms > 0 ? timeout_ms : Deadline::kNeverMs);
  while (!done()) {
    if (std::string why = comm.stop_reason(); !why.empty()) {
      c.failed = cat("rank ", rank, ": ", why);
      c.cv.notify_all();
      break;
    }
    if (deadline.passed()) {
      std::string missing;
      for (int r = 0; r < n; ++r)
        if (!c.arrived[phase][r]) missing += cat(missing.empty() ? "" : ", ", r);
      c.failed = cat("rank ", rank, ": rank(s) ", missing, " did not issue the same device collective within ",
                     timeout_ms, " ms");
      c.cv.notify_all();
      break;
    }
    c.cv.wait_for(lock, std::chrono::milliseconds(10));
  }
  if (!c.failed.empty()) throw Error(chorusRemoteError, Subsys::Core, c.failed);
  return c.phase[phase];
}

// Every rank issued the same call (checked on every rank alike, before anything is enqueued).
void check_same_call(const std::vector<Entry>& in, int me) {
  const Entry& a = in[me];
  const bool has_op = a.coll == Coll::AllReduce || a.coll == Coll::ReduceScatter || a.coll == Coll::Reduce;
  const bool has_root = algo::rooted(a.coll);
  for (int q = 0; q < static_cast<int>(in.size()); ++q) {
    const Entry& b = in[q];
    if (b.coll == a.coll && b.dtype == a.dtype && b.count == a.count && (!has_op || b.op == a.op) &&
        (!has_root || b.root == a.root))
      continue;
    throw Error(chorusRemoteError, Subsys::Core,
                cat("rank ", me, ": mismatched device collective: this rank called ", algo::coll_name(a.coll),
                    " (count ", a.count, ", dtype ", dtype_name(a.dtype), ", op ", static_cast<int>(a.op), ", root ",
                    a.root, "), rank ", q, " called ", algo::coll_name(b.coll), " (count ", b.count, ", dtype ",
                    dtype_name(b.dtype), ", op ", static_cast<int>(b.op), ", root ", b.root, ")"));
  }
}

// Reductions read peers' buffers from kernels: every pair of devices involved must reach each other (the same
// answer on every rank, so all fail alike before anything is enqueued).
void check_peer_access(const std::vector<Entry>& in, int me) {
  for (const Entry& a : in)
    for (const Entry& b : in) {
      if (a.device == b.device) continue;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, a.device, b.device), "cudaDeviceCanAccessPeer");
      if (!can)
        throw Error(chorusNotSupported, Subsys::Core,
                    cat("rank ", me, ": devices ", a.device, " and ", b.device,
                        " cannot access each other's memory, which the device-direct reduction needs (set "
                        "CHORUS_CUDA_DIRECT=0 to stage through host memory)"));
    }
}

// An exported interprocess event that peers may still wait on: never destroyed (three per communicator).
void keep_until_exit(cudaEvent_t e) {
  static std::mutex mu;
  static auto* kept = new std::vector<cudaEvent_t>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(e);
}

// Three events per communicator, reused call after call: a peer's cudaStreamWaitEvent takes the record that was
// current when it was enqueued, and the rendezvous orders every re-record after those. Made again when the
// communicator's calls move to another device. Ranks that are processes create them interprocess and keep what they
// opened of their peers: mapped buffers and events.
struct Events {
  int device = -1;
  bool interprocess = false;
  cudaEvent_t ready = nullptr, mid = nullptr, done = nullptr;
  cudaIpcEventHandle_t ready_h{}, mid_h{}, done_h{};
  unsigned char uuid[16] = {};                // the device's UUID: ranks compare it to know they share the GPU
  std::map<std::string, void*> mapped;        // (peer, allocation handle) -> its base mapped here
  std::map<std::string, cudaEvent_t> opened;  // (peer, event handle) -> the event opened here
  // Per stream this communicator's calls ran on, an event recorded after the call's last work there: what must end
  // before the mappings close (not the whole device, whose other work may wait on things that come later).
  std::map<cudaStream_t, cudaEvent_t> tails;

  void record_tail(cudaStream_t s) {
    auto it = tails.find(s);
    if (it == tails.end()) {
      // Streams come and go (one per step, say): an entry whose last call has ended needs no wait, so entries are
      // dropped when their event has completed, and the map holds only streams with calls in flight.
      for (auto p = tails.begin(); p != tails.end();) {
        const cudaError_t q = cudaEventQuery(p->second);
        if (q == cudaSuccess) {
          cudaEventDestroy(p->second);
          p = tails.erase(p);
        } else {
          // Not ready (or not answerable now): kept, and the answer is not left for a later launch check to see.
          cudaGetLastError();
          ++p;
        }
      }
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      it = tails.emplace(s, e).first;
    }
    check(cudaEventRecord(it->second, s), "cudaEventRecord");
  }
  // After a failed call: its work on `s` counts as a tail; if even that cannot be recorded, teardown waits for the
  // whole device instead. Never throws.
  bool sync_device = false;
  void record_tail_after_failure(cudaStream_t s) {
    try {
      record_tail(s);
    } catch (...) {
      sync_device = true;
    }
  }
  // Waits (host) for the last call on every stream; returns the first error.
  cudaError_t wait_tails() {
    cudaError_t first = cudaSuccess;
    for (auto& [s, e] : tails) {
      const cudaError_t err = cudaEventSynchronize(e);
      if (first == cudaSuccess) first = err;
    }
    return first;
  }

  ~Events() {
    // Released in the device's context (closing a mapping elsewhere would leak it); never throws. Our streams may
    // still read peers' mapped buffers: they end first.
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device && cudaSetDevice(device) == cudaSuccess;
    if (sync_device) cudaDeviceSynchronize();
    wait_tails();
    for (auto& [s, e] : tails) cudaEventDestroy(e);
    for (auto& [key, base] : mapped) cudaIpcCloseMemHandle(base);
    for (auto& [key, e] : opened) cudaEventDestroy(e);
    for (cudaEvent_t e : {ready, mid, done}) {
      if (e == nullptr) continue;
      // A peer's stream may not have run (or its host not yet enqueued) its wait on our last "done" record, and
      // using an imported event after its exporter destroyed it is undefined (CUDA runtime API, IPC): the three
      // exported events of a communicator that used CUDA IPC are kept until the process exits.
      if (interprocess)
        keep_until_exit(e);
      else
        cudaEventDestroy(e);
    }
    if (switched) cudaSetDevice(prev);
    cudaGetLastError();
  }
};

// What the device-direct path keeps per communicator (CommImpl::device_state, released with the communicator).
struct DirectState {
  std::unique_ptr<Events> events;
  // Processes: whether the ranks can take the IPC path at all (-1: not decided yet). Decided once, at the first call
  // that may take the path (the same call on every rank), from every rank's device UUID and IPC support.
  int ipc_usable = -1;
};

DirectState& state_of(CommImpl& comm) {
  if (!comm.device_state()) comm.device_state() = std::make_shared<DirectState>();
  return *static_cast<DirectState*>(comm.device_state().get());
}

// The communicator's events on `device` (made, or made again after a device change). Throws
// chorusUnhandledCudaError when CUDA refuses them (the state stays without events).
Events& events_of(CommImpl& comm, int device, bool interprocess) {
  DirectState& st = state_of(comm);
  if (st.events && st.events->device == device && st.events->interprocess == interprocess) return *st.events;
  st.events.reset();
  auto fresh = std::make_unique<Events>();
  fresh->device = device;
  fresh->interprocess = interprocess;
  const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  for (cudaEvent_t* ev : {&fresh->ready, &fresh->mid, &fresh->done})
    check(cudaEventCreateWithFlags(ev, flags), "cudaEventCreate");
  if (interprocess) {
    check(cudaIpcGetEventHandle(&fresh->ready_h, fresh->ready), "cudaIpcGetEventHandle");
    check(cudaIpcGetEventHandle(&fresh->mid_h, fresh->mid), "cudaIpcGetEventHandle");
    check(cudaIpcGetEventHandle(&fresh->done_h, fresh->done), "cudaIpcGetEventHandle");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::memcpy(fresh->uuid, &prop.uuid, sizeof(fresh->uuid));
  }
  st.events = std::move(fresh);
  return *st.events;
}

void copy_d2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
}

void enable_peer_access(const std::vector<Entry>& peers, int device) {
  for (const Entry& e : peers) {
    if (e.device == device) continue;
    const cudaError_t err = cudaDeviceEnablePeerAccess(e.device, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      continue;
    }
    check(err, "cudaDeviceEnablePeerAccess (a reduction reads a peer's buffer on another device)");
  }
}

void wait_peers(const std::vector<Entry>& peers, int me, cudaStream_t s, int only = -1) {
  for (int q = 0; q < static_cast<int>(peers.size()); ++q)
    if (q != me && (only < 0 || q == only)) check(cudaStreamWaitEvent(s, peers[q].event, 0), "cudaStreamWaitEvent");
}

// dst = op over ranks q of src_q[0, count) (elements), each src_q a peer's input: rank `me` computes it with the
// reduction kernels, its own input first, the division of avg at the last step.
void reduce_from_peers(const kernels::ReduceSpec& spec, std::byte* dst, const std::vector<const std::byte*>& srcs,
                       int me, size_t count, cudaStream_t s) {
  const int n = static_cast<int>(srcs.size());
  if (count == 0) return;
  if (n == 1) {
    kernels::cuda::copy(spec, dst, srcs[me], count, true, true, s);
    return;
  }
  bool first = true;
  for (int k = 1; k < n; ++k) {
    const int q = (me + k) % n;
    const bool last = k == n - 1;
    kernels::cuda::reduce(spec, dst, first ? srcs[me] : dst, srcs[q], count, true, last, s);
    first = false;
  }
}

// Publishes `mine` for a phase and returns every rank's entry (their buffers and events usable here).
using Exchange = std::function<std::vector<Entry>(int phase, const Entry& mine)>;

// Enqueues the collective on `s` once phase 0 (`in`: every rank's buffers and "input ready" event) is known, and
// the later phases through `exchange`.
void run_schedule(CommImpl& comm, const CollArgs& a, cudaStream_t s, int device, Events& ev,
                  const std::vector<Entry>& in, const Exchange& exchange) {
  const int n = comm.nranks(), me = comm.rank();
  const size_t esz = dtype_size(a.dtype);
  // All-reduce: rank q owns elements [off(q), off(q + 1)).
  auto off = [&](int q) { return a.count * static_cast<size_t>(q) / static_cast<size_t>(n); };
  auto* recv = static_cast<std::byte*>(a.recv);
  const auto* send = static_cast<const std::byte*>(a.send);
  bool two_phase = false;  // a reduce-scatter step, then copies of the peers' results
  switch (a.coll) {
    case Coll::AllGather: {
      const size_t b = a.count * esz;
      wait_peers(in, me, s);
      for (int q = 0; q < n; ++q) copy_d2d(recv + q * b, in[q].send, b, s);
      break;
    }
    case Coll::AllToAll: {
      const size_t b = a.count * esz;
      wait_peers(in, me, s);
      for (int q = 0; q < n; ++q) copy_d2d(recv + q * b, in[q].send + me * b, b, s);
      break;
    }
    case Coll::Broadcast: {
      const int root = a.root;
      wait_peers(in, me, s, root);
      copy_d2d(recv, in[root].send, a.count * esz, s);
      break;
    }
    case Coll::Reduce: {
      if (me == a.root) {
        wait_peers(in, me, s);
        std::vector<const std::byte*> srcs;
        for (const Entry& e : in) srcs.push_back(e.send);
        reduce_from_peers(comm.reduce_spec(a), recv, srcs, me, a.count, s);
      }
      break;
    }
    case Coll::ReduceScatter: {
      wait_peers(in, me, s);
      std::vector<const std::byte*> srcs;
      for (const Entry& e : in) srcs.push_back(e.send + me * a.count * esz);
      reduce_from_peers(comm.reduce_spec(a), recv, srcs, me, a.count, s);
      break;
    }
    case Coll::AllReduce: {
      // Each owner reduces its share from every input into its output, then every rank copies each owner's result
      // out of the owner's output.
      wait_peers(in, me, s);
      std::vector<const std::byte*> srcs;
      for (const Entry& e : in) srcs.push_back(e.send + off(me) * esz);
      reduce_from_peers(comm.reduce_spec(a), recv + off(me) * esz, srcs, me, off(me + 1) - off(me), s);
      two_phase = true;
      break;
    }
    default: throw Error(chorusInternalError, Subsys::Core, "device-direct path: unexpected collective");
  }
  if (two_phase) {
    check(cudaEventRecord(ev.mid, s), "cudaEventRecord");
    const std::vector<Entry> mid = exchange(1, Entry{send, recv, ev.mid, device});
    wait_peers(mid, me, s);
    for (int q = 0; q < n; ++q)
      if (q != me) copy_d2d(recv + off(q) * esz, mid[q].recv + off(q) * esz, (off(q + 1) - off(q)) * esz, s);
  }
  // Last phase: no rank's stream moves on while a peer may still read its buffers.
  check(cudaEventRecord(ev.done, s), "cudaEventRecord");
  const std::vector<Entry> done = exchange(2, Entry{send, recv, ev.done, device});
  wait_peers(done, me, s);
  if (ev.interprocess) ev.record_tail(s);  // what teardown and make_room wait for before closing mappings
}

Entry call_entry(const CollArgs& a, cudaEvent_t event, int device) {
  Entry e{static_cast<const std::byte*>(a.send), static_cast<std::byte*>(a.recv), event, device};
  e.coll = a.coll;
  e.dtype = a.dtype;
  e.op = a.op;
  e.count = a.count;
  e.root = a.root;
  return e;
}

// ---- Ranks that are threads of this process: the in-process rendezvous ----

void enqueue_threads(CommImpl& comm, const CollArgs& a, cudaStream_t s, int device) {
  const int n = comm.nranks(), me = comm.rank();
  const uint64_t id = comm.comm_id(), seq = comm.next_direct_seq();
  const int64_t timeout = comm.timeout_ms();
  std::shared_ptr<Call> call = registry().join(id, seq, n);
  struct Leave {
    uint64_t id, seq;
    std::shared_ptr<Call> call;
    ~Leave() { registry().leave(id, seq, call); }
  } leave{id, seq, call};
  try {
    Events& ev = events_of(comm, device, false);
    // Phase 0: every rank's input is ready on its stream; the calls are compared before anything is enqueued.
    check(cudaEventRecord(ev.ready, s), "cudaEventRecord");
    const std::vector<Entry> in = arrive(comm, *call, 0, me, call_entry(a, ev.ready, device), timeout);
    check_same_call(in, me);
    if (a.coll == Coll::AllReduce || a.coll == Coll::ReduceScatter || a.coll == Coll::Reduce) {
      check_peer_access(in, me);
      enable_peer_access(in, device);
    }
    run_schedule(comm, a, s, device, ev, in,
                 [&](int phase, const Entry& e) { return arrive(comm, *call, phase, me, e, timeout); });
  } catch (const Error& e) {
    // Peers waiting in a phase this rank will not reach fail with this reason now, not at their timeout; their
    // streams may wait for events recorded here: nothing later on this communicator can be trusted.
    give_up(*call, e.what());
    comm.break_with(e);
    throw;
  }
}

// ---- Ranks that are processes sharing one GPU: CUDA IPC ----

// What a rank all-gathers at phase 0 (plain bytes): IPC handles of its buffers' allocations and of its events,
// the call, and its device's UUID.
struct Wire {
  cudaIpcMemHandle_t send_h{}, recv_h{};
  cudaIpcEventHandle_t ready_h{}, mid_h{}, done_h{};  // the rank's three events (phase 0; later phases send none)
  uint64_t send_off = 0, recv_off = 0, count = 0;
  unsigned char uuid[16] = {};
  int32_t coll = 0, dtype = 0, op = 0, root = 0;
  int32_t exported = 0;  // 1: both buffers (where used) have IPC handles
  int32_t failed = 0;    // 1: CUDA failed on this rank before the call could be published (every rank fails)
};

// What a rank all-gathers at phases 1 and 2: nothing but whether it failed since phase 0 (1) or not (0); the
// rendezvous itself is the message (every rank recorded the phase's event before it arrives).
struct PhaseFlag {
  int32_t failed = 0;
};

using MemGetAddressRangeFn = CUresult(CUDAAPI*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange from the driver (libchorus does not link libcuda): an IPC handle names a whole allocation.
MemGetAddressRangeFn mem_get_address_range() {
  static const auto fn =
      reinterpret_cast<MemGetAddressRangeFn>(cuda_stream::driver_entry_point("cuMemGetAddressRange"));
  return fn;
}

// The IPC handle of the allocation holding `p` and p's offset in it; false where CUDA gives none (memory from a
// stream-ordered pool or the virtual memory API has no legacy IPC handle).
bool export_buffer(const void* p, cudaIpcMemHandle_t& h, uint64_t& off) {
  if (p == nullptr) return true;
  const MemGetAddressRangeFn range = mem_get_address_range();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range == nullptr || range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
  if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  off = reinterpret_cast<uintptr_t>(p) - static_cast<uintptr_t>(base);
  return true;
}

std::string key_of(int peer, const void* handle, size_t bytes) {
  std::string k(reinterpret_cast<const char*>(&peer), sizeof(peer));
  k.append(static_cast<const char*>(handle), bytes);
  return k;
}

// Peers' buffers are mapped into this process once per allocation and kept until the communicator is destroyed, at
// most kMaxMapped of them: a call that would need more first waits for this communicator's earlier calls to end on
// the device and closes them all (before it maps anything, so it never closes a mapping it uses).
constexpr size_t kMaxMapped = 256;

void make_room(Events& ev, size_t needed) {
  if (ev.mapped.size() + needed <= kMaxMapped) return;
  check(ev.wait_tails(), "cudaEventSynchronize (before closing IPC mappings)");
  for (auto& [k, base] : ev.mapped) cudaIpcCloseMemHandle(base);
  ev.mapped.clear();
}

std::byte* map_peer(Events& ev, int q, const cudaIpcMemHandle_t& h, uint64_t off) {
  const std::string key = key_of(q, &h, sizeof(h));
  auto it = ev.mapped.find(key);
  if (it == ev.mapped.end()) {
    void* base = nullptr;
    check(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
          cat("cudaIpcOpenMemHandle (a buffer of rank ", q, ")").c_str());
    it = ev.mapped.emplace(key, base).first;
  }
  return static_cast<std::byte*>(it->second) + off;
}

cudaEvent_t open_peer_event(Events& ev, int q, const cudaIpcEventHandle_t& h) {
  const std::string key = key_of(q, &h, sizeof(h));
  auto it = ev.opened.find(key);
  if (it == ev.opened.end()) {
    cudaEvent_t e = nullptr;
    check(cudaIpcOpenEventHandle(&e, h), cat("cudaIpcOpenEventHandle (an event of rank ", q, ")").c_str());
    it = ev.opened.emplace(key, e).first;
  }
  return it->second;
}

// All-gathers `mine` (plain bytes) among the ranks through the communicator's host path (which times out and
// names a dead peer).
template <typename T>
std::vector<T> all_gather(CommImpl& comm, const T& mine) {
  std::vector<T> all(static_cast<size_t>(comm.nranks()));
  CollArgs g;
  g.coll = Coll::AllGather;
  g.send = &mine;
  g.recv = all.data();
  g.count = sizeof(T);
  g.dtype = chorusUint8;
  comm.validate(g);
  comm.run_blocking(std::move(g));
  return all;
}

// What ranks all-gather once per communicator to decide on the IPC path.
struct Probe {
  unsigned char uuid[16];
  int32_t ok;  // 1: this rank's interprocess events and IPC handles work
};

// Whether every rank is on the same GPU with working IPC: decided at the communicator's first call here (the same
// call on every rank, whatever its outcome), then kept, so a job of one process per GPU pays one all-gather, not one
// per call.
bool ipc_usable(CommImpl& comm, int device) {
  DirectState& st = state_of(comm);
  if (st.ipc_usable >= 0) return st.ipc_usable == 1;
  Probe mine;
  std::memset(&mine, 0, sizeof(mine));
  try {
    const Events& ev = events_of(comm, device, true);
    std::memcpy(mine.uuid, ev.uuid, sizeof(mine.uuid));
    mine.ok = 1;
  } catch (const Error&) {
    cudaGetLastError();  // this rank cannot: every rank stages
  }
  const std::vector<Probe> all = all_gather(comm, mine);
  std::string why;
  for (int q = 0; q < static_cast<int>(all.size()) && why.empty(); ++q) {
    if (all[q].ok != 1)
      why = cat("rank ", q, " has no interprocess events");
    else if (std::memcmp(all[q].uuid, all[0].uuid, sizeof(all[q].uuid)) != 0)
      why = cat("rank ", q, " is on another GPU than rank 0");
  }
  st.ipc_usable = why.empty() ? 1 : 0;
  if (why.empty())
    CHORUS_INFO(Runtime, "rank %d: device buffers among %d processes on one GPU: device-direct over CUDA IPC",
                comm.rank(), comm.nranks());
  else
    CHORUS_INFO(Runtime, "rank %d: device buffers among %d processes: staged through host memory (%s)", comm.rank(),
                comm.nranks(), why.c_str());
  return why.empty();
}

// False when the call cannot take this path (the ranks are not all on one GPU with IPC, or a rank's buffer has no
// IPC handle): every rank learns the same, from the same all-gather, and stages the call instead.
bool enqueue_processes(CommImpl& comm, const CollArgs& a, cudaStream_t s, int device) {
  if (!ipc_usable(comm, device)) return false;
  const int n = comm.nranks(), me = comm.rank();
  Wire mine;
  std::memset(static_cast<void*>(&mine), 0, sizeof(mine));
  // A CUDA failure here (events made again on another device, a record refused) is still published, so that the
  // peers fail now with this rank named instead of waiting for it until their timeout.
  Events* evp = nullptr;
  std::string local_failure;
  try {
    evp = &events_of(comm, device, true);
    check(cudaEventRecord(evp->ready, s), "cudaEventRecord");
    mine.ready_h = evp->ready_h;
    mine.mid_h = evp->mid_h;
    mine.done_h = evp->done_h;
    std::memcpy(mine.uuid, evp->uuid, sizeof(mine.uuid));
  } catch (const std::exception& e) {
    local_failure = e.what();
    mine.failed = 1;
  }
  // Which buffers peers read: all inputs (broadcast: the root's only), and for all-reduce the outputs too.
  const bool peers_read_send = a.coll != Coll::Broadcast || me == a.root;
  const bool peers_read_recv = a.coll == Coll::AllReduce;
  mine.coll = static_cast<int32_t>(a.coll);
  mine.dtype = a.dtype;
  mine.op = a.op;
  mine.root = a.root;
  mine.count = a.count;
  mine.exported = export_buffer(peers_read_send ? a.send : nullptr, mine.send_h, mine.send_off) &&
                  export_buffer(peers_read_recv ? a.recv : nullptr, mine.recv_h, mine.recv_off);
  const std::vector<Wire> w0 = all_gather(comm, mine);
  if (!local_failure.empty()) {
    const Error e(chorusUnhandledCudaError, Subsys::Core, local_failure);
    comm.break_with(e);  // this rank's device state is unknown
    throw e;
  }
  // A peer that failed is broken, so this communicator is too (its next call would wait for that peer in vain).
  auto fail_if_a_peer_failed = [&](const auto& got, const char* when) {
    for (int q = 0; q < n; ++q)
      if (got[q].failed == 1) {
        const Error e(chorusRemoteError, Subsys::Core,
                      cat("rank ", me, ": rank ", q, " failed ", when, " of a device collective (a CUDA error there)"));
        comm.break_with(e);
        throw e;
      }
  };
  fail_if_a_peer_failed(w0, "before the start (nothing was enqueued here)");
  Events& ev = *evp;
  std::vector<Entry> in(static_cast<size_t>(n));
  bool usable = true;
  for (int q = 0; q < n; ++q) {
    const Wire& x = w0[q];
    in[q].coll = static_cast<Coll>(x.coll);
    in[q].dtype = static_cast<chorusDataType_t>(x.dtype);
    in[q].op = static_cast<chorusRedOp_t>(x.op);
    in[q].count = x.count;
    in[q].root = x.root;
    usable = usable && x.exported == 1 && std::memcmp(x.uuid, ev.uuid, sizeof(ev.uuid)) == 0;
  }
  check_same_call(in, me);
  if (!usable) {
    CHORUS_TRACE(Runtime, "rank %d: %s staged: a rank's buffer has no CUDA IPC handle", me, algo::coll_name(a.coll));
    return false;
  }
  // A failure here after phase 0 is published at the next rendezvous the peers wait in (all-reduce: 1, else 2), so
  // that they fail at once instead of at their timeout; one that comes from the rendezvous itself is not.
  int next_phase = a.coll == Coll::AllReduce ? 1 : 2;
  bool from_rendezvous = false;
  try {
    static const cudaIpcMemHandle_t none{};
    auto has = [](const cudaIpcMemHandle_t& h) { return std::memcmp(&h, &none, sizeof(none)) != 0; };
    size_t needed = 0;
    for (int q = 0; q < n; ++q)
      if (q != me) needed += (has(w0[q].send_h) ? 1 : 0) + (has(w0[q].recv_h) ? 1 : 0);
    make_room(ev, needed);
    // Everything that can fail here is done before phase 1: the peers' buffers mapped and all three of each peer's
    // events opened, so that after the last rendezvous only enqueueing remains.
    std::vector<cudaEvent_t> mid(static_cast<size_t>(n)), done(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      Entry& e = in[q];
      e.device = device;
      if (q == me) {
        e.send = static_cast<const std::byte*>(a.send);
        e.recv = static_cast<std::byte*>(a.recv);
        e.event = ev.ready;
        mid[q] = ev.mid;
        done[q] = ev.done;
      } else {
        // A buffer no peer reads has no handle and stays null.
        if (has(w0[q].send_h)) e.send = map_peer(ev, q, w0[q].send_h, w0[q].send_off);
        if (has(w0[q].recv_h)) e.recv = map_peer(ev, q, w0[q].recv_h, w0[q].recv_off);
        e.event = open_peer_event(ev, q, w0[q].ready_h);
        mid[q] = open_peer_event(ev, q, w0[q].mid_h);
        done[q] = open_peer_event(ev, q, w0[q].done_h);
      }
    }
    run_schedule(comm, a, s, device, ev, in, [&](int phase, const Entry&) {
      from_rendezvous = true;
      const std::vector<PhaseFlag> got = all_gather(comm, PhaseFlag{});
      fail_if_a_peer_failed(got, "during the call");
      from_rendezvous = false;
      next_phase = phase + 1;
      std::vector<Entry> out = in;
      for (int q = 0; q < n; ++q) out[q].event = phase == 1 ? mid[q] : done[q];
      return out;
    });
  } catch (const std::exception& x) {
    const auto* known = dynamic_cast<const Error*>(&x);
    const Error e = known != nullptr ? *known : Error(chorusInternalError, Subsys::Core, x.what());
    if (!from_rendezvous && next_phase <= 2) {
      try {
        all_gather(comm, PhaseFlag{1});
      } catch (...) {
        // the peers are failing already
      }
    }
    // What this call enqueued may still read peers' mapped buffers: teardown waits for it too.
    ev.record_tail_after_failure(s);
    // Peers' streams may wait for events recorded here, and ours for theirs: nothing later can be trusted.
    comm.break_with(e);
    throw e;
  }
  return true;
}

}  // namespace

bool applies(const CommImpl& comm, const CollArgs& a, chorusStream_t user_stream) {
  if (!switch_setting(Param::CudaDirect) || a.compressed || a.premul || comm.widens(a)) return false;
  if (!comm.all_ranks_in_this_process() && !comm.ranks_are_processes_on_this_host()) return false;
  switch (a.coll) {
    case Coll::AllReduce:
    case Coll::ReduceScatter:
    case Coll::AllGather:
    case Coll::Broadcast:
    case Coll::Reduce: break;
    case Coll::AllToAll:
      if (a.send == a.recv) return false;  // in place: a rank would overwrite blocks its peers still read
      break;
    default: return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(user_stream), &capture) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return capture == cudaStreamCaptureStatusNone;
}

bool enqueue(CommImpl& comm, const CollArgs& a, chorusStream_t user_stream) {
  auto s = reinterpret_cast<cudaStream_t>(user_stream);
  const int device = cuda_stream::stream_device(user_stream);
  cuda_stream::OnDevice on(device);
  if (comm.all_ranks_in_this_process()) {
    enqueue_threads(comm, a, s, device);
    return true;
  }
  return enqueue_processes(comm, a, s, device);
}

}  // namespace chorus::cuda_local
