// Collectives and point-to-point calls on device buffers, ordered on the caller's CUDA stream (docs/cuda.md). Built
// only with CUDA (CHORUS_WITH_CUDA); this header names no CUDA type, so the API layer can include it either way.
//
// Data flow of one call, all enqueued on the caller's stream, nothing waited for on the host:
//   1. cudaMemcpyAsync device -> pinned host staging of what the rank sends (the receive region too, for
//      all-to-allv, whose gaps must keep their bytes);
//   2. a host function posts the call, with buffers in the staging, to the communicator's worker thread, at the
//      place in the communicator's order that the call took when it was issued (CommImpl::reserve / post); under
//      graph capture the place is taken when the host function runs, once per replay;
//   3. a one-thread kernel holds the stream until the worker writes the call's completion flag (pinned host memory
//      mapped into the device; kernels/cuda/host_flag.cuh says why not cuStreamWaitValue32);
//   4. cudaMemcpyAsync pinned staging -> device of what the rank receives;
//   5. the staging goes back to a pool (a host function; under capture, the destructor of a CUDA user object that
//      the graph holds, so the staging lives as long as the graph).
// Every step is capturable, so the sequence can be captured in a CUDA graph and replayed. This is the path every
// transport uses for device buffers (network peers stage through pinned host memory); a failed call still writes
// its flag (its receive region zeroed), so the stream never hangs, and leaves its error in chorusCommGetAsyncError;
// chorusCommAbort fails the calls whose streams have not reached them yet.
//
// Rules for the caller (as with NCCL): the communicator outlives its streams' pending calls and every graph that
// captured one of its calls; a graph holding its calls is not launched while other calls of the communicator are in
// flight (a replayed call takes its place when the stream reaches it), nor instantiated twice and launched at once
// (the instances share the call's staging); an error-feedback residual (host memory) is read and written when the
// stream reaches the call, so it is saved with a checkpoint only after the stream is synchronized. Each waiting call
// holds one of the device's hardware queues: with more streams of waiting calls than CUDA_DEVICE_MAX_CONNECTIONS
// (default 8) a wait can hold up another rank's copy and deadlock, so ranks-as-threads on one GPU set it higher (32).
//
// Thread-safety: enqueue() is called under the communicator's API guard (one thread per communicator at a time).
#pragma once

#include <chorus/chorus.h>

#include <exception>
#include <vector>

#include "core/communicator.h"

namespace chorus {

namespace cuda_stream {

// Whether `p` is device memory (or managed memory) that host code must not touch; host memory, registered or
// pinned host memory, null and pointers CUDA does not know are not. Never throws.
bool is_device_pointer(const void* p);

// Throws chorusInvalidArgument naming `name` (sendbuff, recvbuff) unless `p` is device memory: a call with a stream
// (or with device buffers) takes device buffers only.
void require_device_buffer(const void* p, const char* name);

// Checks the validated call `a`'s buffers as enqueue() does (throws chorusInvalidArgument naming one that is not
// device memory, or for a device error-feedback residual), enqueueing nothing: a call made inside a group is
// refused when it is made, not at chorusGroupEnd. Thread-safe.
void check_buffers(const CommImpl& comm, const CollArgs& a);

// Enqueues the validated call `a` on `stream` (NULL: the legacy default stream): a collective, or point-to-point
// calls (Coll::SendRecv: one chorusSend/chorusRecv, or a group's calls on this communicator, all staged; every
// send's bytes are copied in before the call runs and every receive's copied out after). Its buffers must all be
// device memory (or null where the rank does not use one). Throws chorusInvalidArgument for a mix of device and host
// buffers (naming sendbuff or recvbuff) or a device error-feedback residual, chorusUnhandledCudaError when CUDA fails
// before the call is committed to the stream (nothing is enqueued then); a failure after that breaks the
// communicator (later calls fail with it). A collective of count 0 does nothing; point-to-point calls and
// all-to-allv that move no bytes on this rank still meet their peers (their empty messages), as on the host.
void enqueue(CommImpl& comm, CollArgs a, chorusStream_t stream);

// One communicator's validated point-to-point calls in a group that spans several communicators.
struct Call {
  CommImpl* comm = nullptr;
  CollArgs args;
  chorusStream_t stream = nullptr;  // NULL: the legacy default stream
  std::exception_ptr error;         // set by enqueue_together when this communicator's calls failed
};

// Enqueues the calls of several communicators (each communicator once, on its own stream or a shared one) so that
// they run at once: every call's staging in and post first, then every call's wait and staging out. Enqueued one
// after another, a communicator's post would wait on the stream (or, through the legacy default stream's implicit
// synchronization, on another stream) until the previous communicator's calls finished, so ranks that issued the
// communicators in other orders would wait for each other. A call that fails gets in `error` what enqueue would
// have thrown (the others still run); never throws.
void enqueue_together(std::vector<Call>& calls);

// The CUDA driver function `name` (as of the CUDA 12 API), looked up through the runtime since libchorus does not
// link libcuda; null where the driver has none. Cast it to the function's type.
void* driver_entry_point(const char* name);

// The device that `stream` belongs to (NULL: the calling thread's current device). Throws chorusUnhandledCudaError.
int stream_device(chorusStream_t stream);

// Makes `device` the calling thread's current CUDA device for the object's lifetime (kernels, events and streams
// belong to a device), then restores the thread's previous context (or none). Throws chorusUnhandledCudaError if
// it cannot be set.
class OnDevice {
 public:
  explicit OnDevice(int device);
  ~OnDevice();
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  void* saved_ = nullptr;  // the caller's CUcontext
  bool switched_ = false;
};

}  // namespace cuda_stream
}  // namespace chorus
