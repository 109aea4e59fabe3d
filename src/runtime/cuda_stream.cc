// Collectives on device buffers ordered on the caller's CUDA stream: see cuda_stream.h for the data flow.
#include "runtime/cuda_stream.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/host_flag.cuh"
#include "kernels/cuda/reduce.cuh"
#include "runtime/cuda_local.h"

namespace chorus::cuda_stream {
namespace {

[[noreturn]] void cuda_fail(cudaError_t e, const char* what) {
  throw Error(chorusUnhandledCudaError, Subsys::Core,
              cat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}

// Pinned host memory for one call's buffers, and its completion flag (pinned, mapped into the device's address
// space: a one-thread kernel on the stream waits for it, kernels/cuda/host_flag.cuh).
struct Staging {
  std::byte* host = nullptr;
  size_t capacity = 0;
  uint32_t* flag = nullptr;
  const uint32_t* flag_dev = nullptr;  // the flag's device address
};

// Lets this thread make calls that stream capture would refuse (allocations, pointer queries) while a graph is
// being captured, as CUDA allows libraries to (cudaThreadExchangeStreamCaptureMode); restores the mode after.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Stagings are reused: pinning memory costs far more than a call (milliseconds per allocation).
class Pool {
 public:
  // A staging of at least `bytes`, its flag at 0. Calls CUDA: never from a host function.
  Staging* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if ((*it)->capacity >= bytes && (best == free_.end() || (*it)->capacity < (*best)->capacity)) best = it;
      if (best != free_.end()) {
        Staging* s = *best;
        free_.erase(best);
        __atomic_store_n(s->flag, 0u, __ATOMIC_RELEASE);
        return s;
      }
    }
    RelaxedCapture relaxed;
    auto s = std::make_unique<Staging>();
    s->capacity = std::max<size_t>(bytes, size_t{1} << 20);
    void* host = nullptr;
    check(cudaHostAlloc(&host, s->capacity, cudaHostAllocPortable), "cudaHostAlloc (staging)");
    s->host = static_cast<std::byte*>(host);
    void* flag = nullptr;
    if (cudaError_t e = cudaHostAlloc(&flag, 64, cudaHostAllocPortable | cudaHostAllocMapped); e != cudaSuccess) {
      cudaFreeHost(host);
      cuda_fail(e, "cudaHostAlloc (completion flag)");
    }
    s->flag = static_cast<uint32_t*>(flag);
    *s->flag = 0;
    void* dev = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&dev, flag, 0); e != cudaSuccess) {
      cudaFreeHost(host);
      cudaFreeHost(flag);
      cuda_fail(e, "cudaHostGetDevicePointer (completion flag)");
    }
    s->flag_dev = static_cast<const uint32_t*>(dev);
    return s.release();
  }

  // Back to the pool. No CUDA call: safe in host functions and user-object destructors.
  void give(Staging* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<Staging*> free_;  // kept for the process's life (freeing pinned memory at exit races CUDA's teardown)
};

Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

// One enqueued call: the arguments with buffers in the staging.
struct Op {
  std::shared_ptr<CommLifeline> lifeline;  // the communicator, while it lives
  CollArgs args;
  Staging* staging = nullptr;
  std::byte* recv = nullptr;  // the receive region in the staging, recv_bytes long
  size_t recv_bytes = 0;
  std::shared_ptr<RequestState> place;  // reserved when issued; null under graph capture (taken per replay)
};

void set_flag(uint32_t* flag) { __atomic_store_n(flag, 1u, __ATOMIC_RELEASE); }

// What the worker runs when a call ends: a failed call's receive region is zeroed first (the stream copies it out
// anyway, and it must not hand the caller bytes of an earlier call), then the stream is released.
std::function<void(chorusResult_t)> completion(uint32_t* flag, std::byte* recv, size_t recv_bytes) {
  return [=](chorusResult_t res) {
    if (res != chorusSuccess && recv != nullptr) std::memset(recv, 0, recv_bytes);
    set_flag(flag);
  };
}

// Host function, when the stream reaches the call: hand it to the communicator's worker. Never throws, never
// blocks. A call issued outside a capture took its place in the communicator's order then (Op::place): that place is
// completed once, by the worker's on_done (posted here, or failed by an abort or the communicator's end: see
// CommImpl::reserve), which alone releases the stream; here a call that will not run only gets its zeroed result
// (before the copy out, which comes after this function on the stream). A replayed graph's call takes its place here;
// if it cannot, the stream is released here, with a zeroed result (the error is the communicator's async error).
void CUDART_CB post_call(void* p) {
  Op* op = static_cast<Op*>(p);
  auto zero_result = [op] {
    if (op->recv != nullptr) std::memset(op->recv, 0, op->recv_bytes);
  };
  std::shared_ptr<RequestState> place = op->place;  // once set, its on_done releases the stream
  CommImpl* comm = nullptr;
  std::unique_lock<std::mutex> lock(op->lifeline->mu, std::defer_lock);
  try {
    lock.lock();
    comm = op->lifeline->comm;
    if (place) {
      // Issued once: its arguments are not needed after this.
      if (comm == nullptr || !comm->post(place, std::move(op->args))) zero_result();  // failed by an abort or the end
      return;
    }
    if (comm == nullptr) {  // a graph replayed after the communicator's end
      zero_result();
      set_flag(op->staging->flag);
      return;
    }
    uint32_t* flag = op->staging->flag;
    __atomic_store_n(flag, 0u, __ATOMIC_RELEASE);
    place = comm->reserve(completion(flag, op->recv, op->recv_bytes));
    comm->post(place, op->args);  // copied: the graph replays it
  } catch (...) {
    zero_result();
    if (!place)
      set_flag(op->staging->flag);
    else if (comm != nullptr && lock.owns_lock())
      comm->fail_place(place);  // in the order but not posted (out of memory): the worker fails it, and releases
  }
}

// Host function after the result was copied out (or the graph's user-object destructor): staging back to the pool.
void CUDART_CB release_call(void* p) {
  Op* op = static_cast<Op*>(p);
  pool().give(op->staging);
  delete op;
}

using PointerGetAttributeFn = CUresult(CUDAAPI*)(void*, CUpointer_attribute, CUdeviceptr);

int count_loaded(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_adds;  // objects loaded so far, on every entry
  return 1;
}

int find_libcuda(dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libcuda.so") != nullptr) {
    *static_cast<bool*>(out) = true;
    return 1;
  }
  return 0;
}

// The driver's cuPointerGetAttribute once libcuda is in the process, else null. A process that has not loaded
// libcuda (the CUDA runtime loads it when first used) holds no device memory, and asking would load the driver and
// may create a context on a GPU: host-only callers of a CUDA build must not pay for that on every call. Looking for
// libcuda costs a walk of the loaded objects, done again only when objects were loaded since the last look (the
// loader's counter), so a host call pays one loader lock (dlopen with RTLD_NOLOAD would search the library path:
// tens of microseconds).
PointerGetAttributeFn pointer_get_attribute() {
  static std::atomic<PointerGetAttributeFn> fn{nullptr};
  static std::atomic<unsigned long long> looked_at{~0ull};
  PointerGetAttributeFn f = fn.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  unsigned long long loaded = 0;
  dl_iterate_phdr(count_loaded, &loaded);
  if (loaded == looked_at.load(std::memory_order_acquire)) return nullptr;
  bool found = false;
  dl_iterate_phdr(find_libcuda, &found);
  looked_at.store(loaded, std::memory_order_release);
  if (!found) return nullptr;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  f = reinterpret_cast<PointerGetAttributeFn>(dlsym(lib, "cuPointerGetAttribute"));
  // The runtime never unloads the driver, so the pointer stays valid; the handle's reference is dropped.
  dlclose(lib);
  fn.store(f, std::memory_order_release);
  return f;
}

}  // namespace

int stream_device(chorusStream_t stream) {
  int device = -1;
  check(cudaStreamGetDevice(reinterpret_cast<cudaStream_t>(stream), &device), "cudaStreamGetDevice");
  return device;
}

void* driver_entry_point(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

namespace {
using CtxGetCurrentFn = CUresult(CUDAAPI*)(CUcontext*);
using CtxSetCurrentFn = CUresult(CUDAAPI*)(CUcontext);
}  // namespace

// The caller's context is saved and put back as it was (possibly none): restoring by cudaSetDevice would create a
// primary context on a device the thread never used (CUDA 12 makes cudaSetDevice initialise it), at a cost of
// hundreds of MB of device memory.
OnDevice::OnDevice(int device) {
  static const CtxGetCurrentFn get = reinterpret_cast<CtxGetCurrentFn>(driver_entry_point("cuCtxGetCurrent"));
  CUcontext ctx = nullptr;
  if (get == nullptr || get(&ctx) != CUDA_SUCCESS)
    throw Error(chorusUnhandledCudaError, Subsys::Core, "cuCtxGetCurrent failed (no usable CUDA driver)");
  int current = -1;
  if (ctx != nullptr) check(cudaGetDevice(&current), "cudaGetDevice");
  if (current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  saved_ = ctx;
  switched_ = true;
}

OnDevice::~OnDevice() {
  static const CtxSetCurrentFn set = reinterpret_cast<CtxSetCurrentFn>(driver_entry_point("cuCtxSetCurrent"));
  if (switched_ && set != nullptr) set(static_cast<CUcontext>(saved_));
}

void require_device_buffer(const void* p, const char* name) {
  if (!is_device_pointer(p))
    throw Error(chorusInvalidArgument, Subsys::Core,
                cat(name,
                    " is not device memory: a call with a stream (or with device buffers) takes device buffers "
                    "for every buffer; pass stream NULL and host buffers for a host call"));
}

namespace {

// For a thread without a current context, where the driver wants one for the query: asks again from a device's
// primary context that is already active (with unified addressing any context answers for every allocation). With
// none active no runtime allocation exists, and none is created here (a context costs hundreds of MB of its
// device's memory).
bool asked_in_an_active_primary_context(const void* p, PointerGetAttributeFn get) {
  using DeviceGetCountFn = CUresult(CUDAAPI*)(int*);
  using DeviceGetFn = CUresult(CUDAAPI*)(CUdevice*, int);
  using PrimaryStateFn = CUresult(CUDAAPI*)(CUdevice, unsigned int*, int*);
  using PrimaryRetainFn = CUresult(CUDAAPI*)(CUcontext*, CUdevice);
  using PrimaryReleaseFn = CUresult(CUDAAPI*)(CUdevice);
  using CtxSetCurrentFn = CUresult(CUDAAPI*)(CUcontext);
  static const auto count = reinterpret_cast<DeviceGetCountFn>(driver_entry_point("cuDeviceGetCount"));
  static const auto device = reinterpret_cast<DeviceGetFn>(driver_entry_point("cuDeviceGet"));
  static const auto state = reinterpret_cast<PrimaryStateFn>(driver_entry_point("cuDevicePrimaryCtxGetState"));
  static const auto retain = reinterpret_cast<PrimaryRetainFn>(driver_entry_point("cuDevicePrimaryCtxRetain"));
  static const auto release = reinterpret_cast<PrimaryReleaseFn>(driver_entry_point("cuDevicePrimaryCtxRelease"));
  static const auto set_current = reinterpret_cast<CtxSetCurrentFn>(driver_entry_point("cuCtxSetCurrent"));
  if (!count || !device || !state || !retain || !release || !set_current) return false;
  int n = 0;
  if (count(&n) != CUDA_SUCCESS) return false;
  for (int i = 0; i < n; ++i) {
    CUdevice dev = 0;
    unsigned int flags = 0;
    int active = 0;
    if (device(&dev, i) != CUDA_SUCCESS || state(dev, &flags, &active) != CUDA_SUCCESS || !active) continue;
    CUcontext ctx = nullptr;
    if (retain(&ctx, dev) != CUDA_SUCCESS) continue;
    unsigned int type = 0;
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (set_current(ctx) == CUDA_SUCCESS) {
      r = get(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p));
      set_current(nullptr);  // the thread had no context: leave it so
    }
    release(dev);
    return r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE;
  }
  return false;
}

}  // namespace

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  const PointerGetAttributeFn get = pointer_get_attribute();
  if (get == nullptr) return false;
  // Device memory (managed memory too, where the driver reports it as device memory: staging handles it as well).
  unsigned int type = 0;
  const CUresult r = get(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p));
  if (r == CUDA_ERROR_INVALID_CONTEXT) return asked_in_an_active_primary_context(p, get);
  return r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE;
}

namespace {

// One copy between a device buffer and the call's staging: `bytes` at `dev` and at staging offset `off`.
struct Segment {
  std::byte* dev = nullptr;
  size_t off = 0;
  size_t bytes = 0;
};

// Where a call's buffers go in its staging (`total` bytes): copied in before the call runs (what the rank sends),
// copied out after (what it receives). The receive region [recv_off, recv_off + recv_bytes) is zeroed should the
// call fail. A collective's sendbuff and recvbuff sit at send_at and recv_at.
struct StagingPlan {
  std::vector<Segment> in, out;
  size_t total = 0, recv_off = 0, recv_bytes = 0;
  size_t send_at = 0, recv_at = 0;
};

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

// A collective: one region when sendbuff and recvbuff overlap (an in-place call keeps their relative offsets), else
// send then receive.
StagingPlan plan_collective(const CommImpl& comm, const CollArgs& a) {
  const CommImpl::Extents ext = comm.extents(a);
  if (ext.send > 0) require_device_buffer(a.send, "sendbuff");
  if (ext.recv > 0) require_device_buffer(a.recv, "recvbuff");
  auto* s = static_cast<std::byte*>(const_cast<void*>(a.send));
  auto* d = static_cast<std::byte*>(a.recv);
  const bool overlap = a.send == a.recv || (ext.send > 0 && ext.recv > 0 && s < d + ext.recv && d < s + ext.send);
  StagingPlan plan;
  if (overlap) {
    std::byte* base = std::min(s, d);
    plan.send_at = static_cast<size_t>(s - base);
    plan.recv_at = static_cast<size_t>(d - base);
    plan.total = std::max(plan.send_at + ext.send, plan.recv_at + ext.recv);
  } else {
    plan.recv_at = round_up(ext.send);
    plan.total = plan.recv_at + ext.recv;
  }
  if (ext.send > 0) plan.in.push_back({s, plan.send_at, ext.send});
  // All-to-allv writes only its displaced blocks: the rest of the receive region keeps its bytes.
  if (a.coll == algo::Coll::AllToAllv && ext.recv > 0 && !overlap) plan.in.push_back({d, plan.recv_at, ext.recv});
  if (ext.recv > 0) plan.out.push_back({d, plan.recv_at, ext.recv});
  plan.recv_off = plan.recv_at;
  plan.recv_bytes = ext.recv;
  return plan;
}

// Point-to-point (one call, or a group's calls on this communicator): every send's bytes, then every receive's,
// each at a 256-byte boundary; a receive's bytes are its own even where device buffers overlap.
StagingPlan plan_p2p(const CollArgs& a) {
  StagingPlan plan;
  for (const bool sends : {true, false}) {
    if (!sends) plan.recv_off = plan.total;
    for (const P2POp& op : a.p2p) {
      const size_t bytes = op.count * dtype_size(op.dtype);
      if (op.is_send != sends || bytes == 0) continue;
      require_device_buffer(op.buf, sends ? "sendbuff" : "recvbuff");
      (sends ? plan.in : plan.out).push_back({static_cast<std::byte*>(op.buf), plan.total, bytes});
      plan.total = round_up(plan.total + bytes);
    }
  }
  plan.recv_bytes = plan.total - plan.recv_off;
  return plan;
}

// Points the call's buffers at their places in the staging `st` (in the plan's order for point-to-point).
void point_into(CollArgs& a, const StagingPlan& plan, std::byte* st) {
  if (a.coll != algo::Coll::SendRecv) {
    if (a.send != nullptr) a.send = st + plan.send_at;
    if (a.recv != nullptr) a.recv = st + plan.recv_at;
    return;
  }
  size_t next_in = 0, next_out = 0;
  for (P2POp& op : a.p2p) {
    if (op.count * dtype_size(op.dtype) == 0) continue;
    const Segment& g = op.is_send ? plan.in[next_in++] : plan.out[next_out++];
    op.buf = st + g.off;
  }
}

// Loads every kernel a call may launch on `device`, once per process, before this process's first call there
// enqueues anything (reduce.cuh, load_kernels: a lazy first load could wait for a stream that waits for a peer).
void load_kernels_once(int device) {
  static std::atomic<uint64_t> loaded{0};  // bit d: device d (devices 64 and up are loaded on every call)
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (loaded.load(std::memory_order_acquire) & bit) != 0) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (bit != 0 && (loaded.load(std::memory_order_relaxed) & bit) != 0) return;
  OnDevice on(device);
  RelaxedCapture relaxed;
  kernels::cuda::load_kernels();
  kernels::cuda::load_wait_host_flag_kernel();
  loaded.fetch_or(bit, std::memory_order_release);
}

}  // namespace

namespace {

// A call between its two halves on the stream: begin() (staging in, the post) and finish() (the wait, staging out).
struct Pending {
  CommImpl* comm = nullptr;
  std::unique_ptr<Op> op;
  StagingPlan plan;
};

// Whether `stream` is capturing a graph (the graph in `graph`); throws chorusInvalidArgument for an invalidated
// capture.
bool capturing_into(cudaStream_t stream, cudaGraph_t* graph) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusInvalidated)
    throw Error(chorusInvalidArgument, Subsys::Core, "stream: its graph capture was invalidated");
  *graph = nullptr;
  if (capture != cudaStreamCaptureStatusActive) return false;
  check(cudaStreamGetCaptureInfo(stream, &capture, nullptr, graph), "cudaStreamGetCaptureInfo");
  return true;
}

// The staging plan of the validated call `a`, checking its buffers (throws chorusInvalidArgument naming one that is
// not device memory, or a device error-feedback residual).
StagingPlan plan_call(const CommImpl& comm, const CollArgs& a) {
  if (a.error_feedback != nullptr && is_device_pointer(a.error_feedback))
    throw Error(chorusInvalidArgument, Subsys::Core,
                "options->compression->error_feedback is device memory: the residual must be host memory");
  return a.coll == algo::Coll::SendRecv ? plan_p2p(a) : plan_collective(comm, a);
}

// Takes the call's staging and place, enqueues its staging in and its post. Throws with nothing enqueued that
// would run the call (its place given up).
Pending begin(CommImpl& comm, CollArgs a, StagingPlan plan, cudaStream_t stream, bool capturing) {
  Pending p;
  p.comm = &comm;
  p.plan = std::move(plan);
  p.op = std::make_unique<Op>();
  Op& op = *p.op;
  op.lifeline = comm.lifeline();
  op.staging = pool().take(std::max<size_t>(p.plan.total, 1));
  std::byte* st = op.staging->host;
  op.args = std::move(a);
  point_into(op.args, p.plan, st);
  op.recv = p.plan.recv_bytes > 0 ? st + p.plan.recv_off : nullptr;
  op.recv_bytes = p.plan.recv_bytes;
  bool copying = false;
  try {
    if (!capturing) op.place = comm.reserve(completion(op.staging->flag, op.recv, op.recv_bytes));
    for (const Segment& g : p.plan.in) {
      copying = true;  // from here a copy may be writing into the staging
      check(cudaMemcpyAsync(st + g.off, g.dev, g.bytes, cudaMemcpyDeviceToHost, stream), "staging in");
    }
    check(cudaLaunchHostFunc(stream, post_call, &op), "cudaLaunchHostFunc (post)");
  } catch (const Error&) {
    // Nothing will fill the reserved place: give it up, and the call did not happen. A staging that a copy may
    // still be writing into, or whose place an abort already failed (its on_done will still write the flag), is not
    // given back (leaked, on these error paths only).
    const bool withdrawn = !op.place || comm.cancel(op.place);
    if (!copying && withdrawn) pool().give(op.staging);
    throw;
  }
  return p;
}

// Enqueues the begun call's wait and staging out, and hands its staging to the stream (or to the captured graph,
// which keeps it until the graph is destroyed). On failure the host function still runs the call on this rank while
// the stream may not wait for it or copy its result: the communicator is broken (later calls fail with this error
// rather than mismatch), the Op stays alive for the host function, and the error is thrown.
void finish(Pending& p, cudaStream_t stream, cudaGraph_t graph) {
  Op* op = p.op.release();
  try {
    kernels::cuda::wait_host_flag(op->staging->flag_dev, 1, stream);
    for (const Segment& g : p.plan.out)
      check(cudaMemcpyAsync(g.dev, op->staging->host + g.off, g.bytes, cudaMemcpyHostToDevice, stream), "staging out");
    if (graph != nullptr) {
      cudaUserObject_t obj = nullptr;
      check(cudaUserObjectCreate(&obj, op, release_call, 1, cudaUserObjectNoDestructorSync), "cudaUserObjectCreate");
      check(cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove), "cudaGraphRetainUserObject");
    } else {
      check(cudaLaunchHostFunc(stream, release_call, op), "cudaLaunchHostFunc (release)");
    }
  } catch (const Error& e) {
    p.comm->break_with(e);
    throw;
  }
}

}  // namespace

void check_buffers(const CommImpl& comm, const CollArgs& a) { (void)plan_call(comm, a); }

void enqueue(CommImpl& comm, CollArgs a, chorusStream_t user_stream) {
  auto stream = reinterpret_cast<cudaStream_t>(user_stream);
  StagingPlan plan = plan_call(comm, a);
  // Nothing to move (count 0, the same on every rank): nothing to order either, as a host call of count 0 does
  // nothing. Point-to-point and all-to-allv sizes are per rank: a rank moving no bytes still exchanges its (empty)
  // messages with its peers, as on the host, so it posts the call.
  const bool p2p = a.coll == algo::Coll::SendRecv;
  const bool sizes_per_rank = p2p || a.coll == algo::Coll::AllToAllv || a.coll == algo::Coll::Barrier;
  if (plan.in.empty() && plan.out.empty() && !sizes_per_rank) return;
  load_kernels_once(stream_device(user_stream));
  // Ranks that are threads of this process, or processes on this GPU, read each other's device buffers directly.
  if (!p2p && cuda_local::applies(comm, a, user_stream) && cuda_local::enqueue(comm, a, user_stream)) {
    comm.note_algorithm(CommImpl::kDeviceDirect);
    return;
  }
  // The wait kernel (and the staging's pool) belong to the stream's device.
  OnDevice on(stream_device(user_stream));
  cudaGraph_t graph = nullptr;
  const bool capturing = capturing_into(stream, &graph);
  Pending p = begin(comm, std::move(a), std::move(plan), stream, capturing);
  finish(p, stream, graph);
}

void enqueue_together(std::vector<Call>& calls) {
  // Each call's half-enqueued state: its stream's device, graph (under capture) and begun call.
  struct Begun {
    cudaStream_t stream = nullptr;
    int device = 0;
    cudaGraph_t graph = nullptr;
    Pending pending;
  };
  std::vector<Begun> begun;
  begun.reserve(calls.size());  // no reallocation: a Pending dropped after its post would free the Op it posted
  for (Call& c : calls) {
    try {
      auto stream = reinterpret_cast<cudaStream_t>(c.stream);
      const int device = stream_device(c.stream);
      load_kernels_once(device);
      OnDevice on(device);  // the wait kernel (and the staging's pool) belong to the stream's device
      cudaGraph_t graph = nullptr;
      const bool capturing = capturing_into(stream, &graph);
      StagingPlan plan = plan_call(*c.comm, c.args);
      Pending pending = begin(*c.comm, std::move(c.args), std::move(plan), stream, capturing);
      begun.push_back(Begun{stream, device, graph, std::move(pending)});  // within the reserved capacity: no throw
    } catch (...) {
      c.error = std::current_exception();
    }
  }
  // Every begun call is finished, also after another call failed: its post is on its stream.
  size_t next = 0;
  for (Call& c : calls) {
    if (c.error) continue;
    Begun& b = begun[next++];
    try {
      OnDevice on(b.device);
      finish(b.pending, b.stream, b.graph);
    } catch (...) {
      c.error = std::current_exception();
    }
  }
}

}  // namespace chorus::cuda_stream
