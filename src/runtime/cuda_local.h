// The device-direct path for ranks that are threads of one process, or processes sharing one GPU (docs/cuda.md):
// no staging, no network, no executor. Each rank's stream reads its peers' device buffers directly: all-gather,
// all-to-all and broadcast are device-to-device cudaMemcpyAsync (copy engines, no kernel), reductions are the
// reduction kernels of src/kernels/cuda/ reading peers' buffers (each rank reduces its own chunk, then the chunks are
// copied around). Built only with CUDA; this header names no CUDA type.
//
// Ordering across ranks uses CUDA events and two or three rendezvous per call: rank r records "input ready" on its
// stream and publishes its buffers; every rank's stream waits for the events of the peers it reads; at the end every
// rank's stream waits for every peer's "done", so no rank's stream moves on (and its caller may overwrite its
// buffers) while a peer still reads them. A rank records before it publishes, so a peer's cudaStreamWaitEvent never
// meets an event not yet recorded. The host waits only for the peers to issue the same call, never for the GPU, and
// no kernel waits on another rank's flag.
//   - Threads of one process: the rendezvous is in-process (a registry keyed by communicator and call number,
//     under the communicator's timeout); buffers are plain device pointers, events ordinary events.
//   - Processes on one GPU (every rank on this host, one per process, all streams on the same GPU by UUID): the
//     rendezvous is an all-gather over the communicator's host path (its timeout and dead-peer errors apply); each
//     rank publishes CUDA IPC handles of its buffers' allocations and of interprocess events, and maps its peers'
//     once per allocation (cudaIpcOpenMemHandle; kept until the communicator is destroyed). Contexts of processes
//     are time-sliced, which is why nothing here spins (shared/GPU-NOTES.md). A buffer without an IPC handle (from a
//     stream-ordered pool or the virtual memory API), or ranks on different GPUs, make every rank stage the call
//     instead.
//
// Applies to all-reduce, reduce-scatter, all-gather, broadcast, reduce and all-to-all (not in place), without
// compression or a pre-multiplied sum, when the stream is not capturing a graph (those take cuda_stream's staging
// path). All ranks decide alike as long as they agree on capture (a requirement for any collective in a graph) and,
// for all-to-all, on in place or not (else both sides time out with an error). CHORUS_CUDA_DIRECT=0 turns the path
// off (for comparison; read at each call, must agree on every rank). Thread-ranks on different devices of the
// process: copies go by unified addressing, reduction kernels enable peer access (an error where the devices cannot
// reach each other).
#pragma once

#include <chorus/chorus.h>

namespace chorus {

class CommImpl;
struct CollArgs;

namespace cuda_local {

// Whether the validated call `a` on device buffers may take the device-direct path.
bool applies(const CommImpl& comm, const CollArgs& a, chorusStream_t stream);

// Enqueues `a` on `stream` (NULL: the legacy default stream) and returns true; false (processes only, decided alike
// on every rank, nothing enqueued) when the call must be staged instead. Throws chorusRemoteError naming the ranks
// that did not issue the same call within the communicator's timeout (or a dead peer), chorusUnhandledCudaError when
// CUDA fails (the rendezvous state is then inconsistent: the communicator is broken).
bool enqueue(CommImpl& comm, const CollArgs& a, chorusStream_t stream);

}  // namespace cuda_local
}  // namespace chorus
