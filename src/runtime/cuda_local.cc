// The device-direct path for ranks as threads of one process: see cuda_local.h.
#include "runtime/cuda_local.h"

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/communicator.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
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
// late rank does not go on alone), or with the reason of a rank that gave up.
std::vector<Entry> arrive(Call& c, int phase, int rank, const Entry& e, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(c.mu);
  const int n = static_cast<int>(c.arrived[phase].size());
  if (c.failed.empty()) {
    c.phase[phase][rank] = e;
    c.arrived[phase][rank] = true;
    if (++c.count[phase] == n) c.cv.notify_all();
  }
  const auto done = [&] { return c.count[phase] == n || !c.failed.empty(); };
  if (timeout_ms > 0) {
    if (!c.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), done)) {
      std::string missing;
      for (int r = 0; r < n; ++r)
        if (!c.arrived[phase][r]) missing += cat(missing.empty() ? "" : ", ", r);
      c.failed = cat("rank ", rank, ": rank(s) ", missing, " did not issue the same device collective within ",
                     timeout_ms, " ms");
      c.cv.notify_all();
    }
  } else {
    c.cv.wait(lock, done);
  }
  if (!c.failed.empty()) throw Error(chorusRemoteError, Subsys::Core, c.failed);
  return c.phase[phase];
}

// Every rank issued the same call (checked on every rank alike, before anything is enqueued).
void check_same_call(const std::vector<Entry>& in, int me) {
  const Entry& a = in[me];
  const bool has_op = a.coll == Coll::AllReduce || a.coll == Coll::ReduceScatter || a.coll == Coll::Reduce;
  const bool has_root = a.coll == Coll::Broadcast || a.coll == Coll::Reduce;
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

// Three events per communicator (kept in CommImpl::device_state, destroyed with it), reused call after call: a
// peer's cudaStreamWaitEvent takes the record that was current when it was enqueued, and the rendezvous orders every
// re-record after those. Made again when the communicator's calls move to another device.
struct Events {
  int device = -1;
  cudaEvent_t ready = nullptr, mid = nullptr, done = nullptr;
  ~Events() {
    for (cudaEvent_t e : {ready, mid, done})
      if (e != nullptr) cudaEventDestroy(e);
  }
};

Events& events_of(CommImpl& comm, int device) {
  auto* e = static_cast<Events*>(comm.device_state().get());
  if (e != nullptr && e->device == device) return *e;
  auto fresh = std::make_shared<Events>();
  fresh->device = device;
  check(cudaEventCreateWithFlags(&fresh->ready, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&fresh->mid, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&fresh->done, cudaEventDisableTiming), "cudaEventCreate");
  comm.device_state() = fresh;
  return *fresh;
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

}  // namespace

bool applies(const CommImpl& comm, const CollArgs& a, chorusStream_t user_stream) {
  if (param_int(Param::CudaDirect) == 0 || a.compressed || a.premul || !comm.all_ranks_in_this_process()) return false;
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

void enqueue(CommImpl& comm, const CollArgs& a, chorusStream_t user_stream) {
  auto s = reinterpret_cast<cudaStream_t>(user_stream);
  const int n = comm.nranks(), me = comm.rank();
  const size_t esz = dtype_size(a.dtype);
  const uint64_t id = comm.comm_id(), seq = comm.next_direct_seq();
  const int64_t timeout = comm.timeout_ms();
  std::shared_ptr<Call> call = registry().join(id, seq, n);
  struct Leave {
    uint64_t id, seq;
    std::shared_ptr<Call> call;
    ~Leave() { registry().leave(id, seq, call); }
  } leave{id, seq, call};
  try {
    const int device = cuda_stream::stream_device(user_stream);
    cuda_stream::OnDevice on(device);
    Events& ev = events_of(comm, device);
    // Phase 0: every rank's input is ready on its stream; the calls are compared before anything is enqueued.
    check(cudaEventRecord(ev.ready, s), "cudaEventRecord");
    Entry mine{static_cast<const std::byte*>(a.send), static_cast<std::byte*>(a.recv), ev.ready, device};
    mine.coll = a.coll;
    mine.dtype = a.dtype;
    mine.op = a.op;
    mine.count = a.count;
    mine.root = a.root;
    const std::vector<Entry> in = arrive(*call, 0, me, mine, timeout);
    check_same_call(in, me);
    if (a.coll == Coll::AllReduce || a.coll == Coll::ReduceScatter || a.coll == Coll::Reduce) {
      check_peer_access(in, me);
      enable_peer_access(in, device);
    }
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
      const std::vector<Entry> mid = arrive(*call, 1, me, Entry{send, recv, ev.mid, device}, timeout);
      wait_peers(mid, me, s);
      for (int q = 0; q < n; ++q)
        if (q != me) copy_d2d(recv + off(q) * esz, mid[q].recv + off(q) * esz, (off(q + 1) - off(q)) * esz, s);
    }
    // Last phase: no rank's stream moves on while a peer may still read its buffers.
    check(cudaEventRecord(ev.done, s), "cudaEventRecord");
    const std::vector<Entry> done = arrive(*call, 2, me, Entry{send, recv, ev.done, device}, timeout);
    wait_peers(done, me, s);
  } catch (const Error& e) {
    // Peers waiting in a phase this rank will not reach fail with this reason now, not at their timeout; their
    // streams may wait for events recorded here: nothing later on this communicator can be trusted.
    give_up(*call, e.what());
    comm.break_with(e);
    throw;
  }
}

}  // namespace chorus::cuda_local
