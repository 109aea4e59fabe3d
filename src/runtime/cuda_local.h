// The device-direct path for ranks that are threads of one process (docs/cuda.md): no staging, no network, no
// executor. Each rank's stream reads its peers' device buffers directly: all-gather, all-to-all and broadcast are
// device-to-device cudaMemcpyAsync (copy engines, no kernel), reductions are the reduction kernels of
// src/kernels/cuda/ reading peers' buffers (each rank reduces its own chunk, then the chunks are copied around).
// Built only with CUDA; this header names no CUDA type.
//
// Ordering across ranks uses CUDA events and two or three host-side rendezvous per call among the rank threads
// (in-process, under the communicator's timeout): rank r records "input ready" on its stream and publishes its
// buffers; every rank's stream waits for the events of the peers it reads; at the end every rank's stream waits
// for every peer's "done", so no rank's stream moves on (and its caller may overwrite its buffers) while a peer
// still reads them. The host waits only for the peer threads to issue the same call, never for the GPU.
//
// Applies when every rank of the communicator is a thread of this process, the call is all-reduce,
// reduce-scatter, all-gather, broadcast, reduce or all-to-all (not in place), without compression or a
// pre-multiplied sum, and the stream is not capturing a graph (those take cuda_stream's staging path). All ranks
// decide alike as long as they agree on capture (a requirement for any collective in a graph) and, for all-to-all,
// on in place or not (else both sides time out with an error). CHORUS_CUDA_DIRECT=0 turns the path off (for
// comparison; read at each call, must agree on every rank). Ranks on different devices of the process: copies go
// by unified addressing, reduction kernels enable peer access (an error where the devices cannot reach each other).
#pragma once

#include <chorus/chorus.h>

namespace chorus {

class CommImpl;
struct CollArgs;

namespace cuda_local {

// Whether the validated call `a` on device buffers takes the device-direct path.
bool applies(const CommImpl& comm, const CollArgs& a, chorusStream_t stream);

// Enqueues `a` on `stream` (NULL: the legacy default stream). Throws chorusRemoteError naming the ranks that did
// not issue the call within the communicator's timeout, chorusUnhandledCudaError when CUDA fails (the rendezvous
// state is then inconsistent: the communicator is broken).
void enqueue(CommImpl& comm, const CollArgs& a, chorusStream_t stream);

}  // namespace cuda_local
}  // namespace chorus
