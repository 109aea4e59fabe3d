/*
 * Chorus: topology-aware collective communication. Stable C ABI.
 *
 * Conventions for every function here:
 *  - Counts are numbers of elements (not bytes) and are 64-bit; byte sizes are count * chorusTypeSize(dtype).
 *  - Every function returns a chorusResult_t. On failure, chorusGetLastError(comm) (or chorusGetLastError(NULL):
 *    this thread's last error, also of calls without a communicator) returns text naming the rank and, where it
 *    applies, the peer, the collective and its sequence number. In a communicator made by chorusCommSplit the
 *    text starts "rank R (split color C of rank P): ", P being this rank in the communicator it was split from
 *    (nested for a split of a split); the ranks named after it are numbered in the split communicator.
 *  - Arguments are validated before anything happens: a bad argument returns chorusInvalidArgument and no
 *    buffer is read or written.
 *  - A failure of a call (a peer that died or called a mismatched collective, a timeout) breaks the communicator,
 *    as in NCCL: every later call on it, chorusCommSplit included, and the non-blocking requests queued behind the
 *    failed call return that failure's code and text unchanged. The text names the call that failed (say
 *    "AllReduce #1"), not the later one. chorusCommDestroy and chorusCommAbort still free it.
 *  - Thread safety: one communicator is driven by one thread at a time (as with NCCL and MPI); different
 *    communicators may be used from different threads at once. chorusCommAbort may be called from any thread.
 *    A call made while another thread's call on the same communicator is in progress is chorusInvalidUsage.
 *    Calls from several threads that do not overlap are not detected: they are the caller's to order, and if
 *    they reach the ranks in different orders with the same arguments, nothing can tell them apart.
 *  - fork: a child forked (without exec) from a process that holds communicators cannot use them, their requests,
 *    nor destroy or abort them: chorusInvalidUsage (its copies are its parent's). The child lets go of its copies
 *    of their sockets (bootstrap and tcp) at once, so that the parent's peers still see the parent's death when the
 *    child outlives it. A child may make communicators of its own only if no other thread of the parent was inside
 *    Chorus when it forked: a lock such a thread held stays held in the child, as POSIX says of a multithreaded
 *    process's child (only async-signal-safe calls until it execs). A child that execs may use Chorus freely.
 *  - All ranks of a communicator call its collectives in the same order with matching arguments. A mismatch
 *    (different collective, count, dtype, op or root) is detected and reported on every rank: the mismatched call
 *    fails on every rank that exchanges a message with a mismatched peer; a rank whose own messages all matched may
 *    return chorusSuccess from that call, and then gets chorusRemoteError from its next call (or from
 *    chorusCommGetAsyncError), since the mismatch breaks the communicator.
 *  - Buffers: host memory with stream NULL, and the call blocks until the operation is complete. In a CUDA build
 *    the blocking collectives, chorusSend and chorusRecv also take device buffers: given a cudaStream_t (or device
 *    buffers with stream NULL, the legacy default stream) the call is ordered on the stream and returns at once
 *    (docs/cuda.md); the non-blocking forms take host buffers only. cudaStreamLegacy counts as NULL (the same
 *    stream); cudaStreamPerThread is a stream like any other.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

/* Result codes: 0..7 have the values of NCCL's ncclResult_t. */
typedef enum {
  chorusSuccess = 0,
  chorusUnhandledCudaError = 1,
  chorusSystemError = 2,   /* an OS call failed (socket, shm, ...) */
  chorusInternalError = 3, /* a Chorus bug */
  chorusInvalidArgument = 4,
  chorusInvalidUsage = 5, /* e.g. a communicator used after destroy, or by two threads at once */
  chorusRemoteError = 6,  /* a peer failed, died, or called a mismatched collective */
  chorusInProgress = 7,   /* a non-blocking operation has not completed yet */
  chorusTimeout = 8,      /* an operation passed its deadline (CHORUS_TIMEOUT_MS) */
  chorusNotSupported = 9,
  chorusNumResults = 10
} chorusResult_t;

/* Datatypes: values equal NCCL's ncclDataType_t. */
typedef enum {
  chorusInt8 = 0,
  chorusChar = 0,
  chorusUint8 = 1,
  chorusInt32 = 2,
  chorusInt = 2,
  chorusUint32 = 3,
  chorusInt64 = 4,
  chorusUint64 = 5,
  chorusFloat16 = 6,
  chorusHalf = 6,
  chorusFloat32 = 7,
  chorusFloat = 7,
  chorusFloat64 = 8,
  chorusDouble = 8,
  chorusBfloat16 = 9,
  chorusFloat8e4m3 = 10, /* OCP FP8 E4M3 (no infinities, max 448) */
  chorusFloat8e5m2 = 11, /* OCP FP8 E5M2 (IEEE-like) */
  chorusNumTypes = 12,
  /* The two bounds widen the type to every int, so that any invalid value can be passed and reported (in C++ an
   * enum holds only the values its enumerators need; the same holds for the enums below). */
  chorusMinDataType = -0x7fffffff - 1,
  chorusMaxDataType = 0x7fffffff
} chorusDataType_t;

/*
 * Reduction operators: values equal NCCL's ncclRedOp_t.
 *  - fp16, bf16 and fp8: each reduction step widens its operands to fp32, combines them and rounds the result to
 *    the type (nearest-even) once; values travel between ranks in the type, so a ring rounds once per hop.
 *    With CHORUS_FP32_PARTIALS=1, sums, averages, products and pre-multiplied sums of these types carry fp32
 *    partial sums instead (the data widened to fp32, reduced as fp32, rounded to the type once at the end: twice
 *    the bytes on the wire for 16-bit types, four times for fp8; the communicator keeps fp32 copies of the input and
 *    output until chorusCommDestroy, and CHORUS_ALGO size ranges count the fp32 bytes).
 *    A result beyond the type's range is infinity for fp16, bf16 and fp8 e5m2, and saturates to +-448 for fp8 e4m3,
 *    which has no infinity (a sum of 8 x 448 is 448).
 *  - chorusMin and chorusMax propagate NaN: if any rank holds NaN, the result is NaN.
 *  - chorusAvg on floating types is the sum, rounded to the type as above, divided by nranks (so the same bits
 *    whichever algorithm runs: an fp8 e4m3 average of 8 x 448 is 448 / 8 = 56; with CHORUS_FP32_PARTIALS=1 it is
 *    the fp32 average rounded once, 448); on integer types it is the integer sum
 * divided by nranks, truncated toward zero (C semantics), with the sum computed in the type (wrapping on overflow).
 *  - chorusProd and chorusSum on integer types wrap modulo 2^bits.
 *  - Pre-multiplied sums are created with chorusRedOpCreatePreMulSum.
 *  - Float sums may change bits when the message size crosses a point where the selector switches algorithms (the
 *    order of additions changes). CHORUS_DETERMINISTIC=1 pins all-reduce and reduce-scatter to recursive
 *    halving/doubling and reduce to the ring, so an element gets the same bits at every size; CHORUS_ALGO rules and
 *    per-call algorithm names still come first, and CHORUS_NCHANNELS still changes bits.
 */
typedef enum {
  chorusSum = 0,
  chorusProd = 1,
  chorusMax = 2,
  chorusMin = 3,
  chorusAvg = 4,
  chorusNumOps = 5,
  chorusMinRedOp = -0x7fffffff - 1,
  chorusMaxRedOp = 0x7fffffff
} chorusRedOp_t;

typedef enum {
  chorusScalarDevice = 0,        /* scalar in device memory: not supported (chorusNotSupported) in any build */
  chorusScalarHostImmediate = 1, /* scalar is read from host memory when the op is created */
  chorusMinScalarResidence = -0x7fffffff - 1,
  chorusMaxScalarResidence = 0x7fffffff
} chorusScalarResidence_t;

#define CHORUS_UNIQUE_ID_BYTES 128
/* Opaque: the root's address and a 128-bit random secret. Treat it as a secret; share only with the job's ranks. */
typedef struct {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorusUniqueId;

typedef struct chorusComm* chorusComm_t;
typedef struct chorusRequest* chorusRequest_t;
struct CUstream_st; /* cudaStream_t without including CUDA headers */
typedef struct CUstream_st* chorusStream_t;

#define CHORUS_SPLIT_NOCOLOR (-1)

/* ---- Library ---- */
chorusResult_t chorusGetVersion(int* version);
const char* chorusGetErrorString(chorusResult_t result);
/* Text of the last error of a call on `comm`, made from any thread. With comm NULL (or a handle already destroyed
 * or aborted): the last error of any call made on this thread. Never NULL; empty when there was none. Valid until
 * the next Chorus call on this thread. */
const char* chorusGetLastError(chorusComm_t comm);
/* Size in bytes of one element of `dtype`, or 0 if dtype is invalid. */
size_t chorusTypeSize(chorusDataType_t dtype);

/* ---- Communicators ---- */
/* Creates a unique id and starts the rendezvous service in this process. The service must live until every rank
 * has initialised, so call this from a process that stays alive (typically rank 0). Each id holds one thread and
 * a listening socket, which also relay the communicator's bootstrap messages, until its ranks have destroyed it
 * (or its rendezvous failed); an id that no rank ever uses holds them for the life of the process (as in NCCL), so
 * create one id per communicator, not ahead of need. */
chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId);
/* Collective over `nranks` processes or threads: each calls it with its own `rank` in [0, nranks). Blocks until all
 * have joined or CHORUS_TIMEOUT_MS passes. On failure *comm is left as it was and chorusGetLastError(NULL) says why
 * (as for chorusCommInitFromEnv). */
chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank);
/* Initialises all `nranks` ranks of one new job in this process (ranks as threads, as ncclCommInitAll makes the
 * communicators of one process's GPUs): comms[r] is rank r, for r in [0, nranks). `comms` has room for `nranks`
 * handles. Each rank joins the rendezvous from a thread of its own, which has ended when this returns; any thread may
 * then drive the communicators, one thread all of them inside chorusGroupStart/End. comms NULL or nranks < 1:
 * chorusInvalidArgument. If any rank fails to initialise, none is kept, `comms` is untouched, and the error (that
 * rank's code) names the rank. Thread-safe; blocks until every rank has joined or failed. chorusCommSplit blocks
 * until every rank of the communicator calls it, so split these communicators from a thread per rank. If a thread
 * cannot be created, the job's rendezvous service (a thread and a socket) stays until the process exits. */
chorusResult_t chorusCommInitAll(chorusComm_t* comms, int nranks);
/* Init from the launcher's environment: torchrun (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK),
 * Open MPI (OMPI_COMM_WORLD_*), Slurm (SLURM_*), PMI (PMI_*); CHORUS_RANK, CHORUS_NRANKS, CHORUS_ROOT_ADDR
 * (host:port) and CHORUS_SECRET (32 hex digits) override them. chorusrun sets the CHORUS_* ones. */
chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm);
/* Collective over `comm`: ranks with the same color form a new communicator, ordered by (key, old rank). A rank
 * passing CHORUS_SPLIT_NOCOLOR gets *newcomm = NULL. If any rank passes a bad argument (a negative color other than
 * CHORUS_SPLIT_NOCOLOR, or a NULL newcomm), every rank returns chorusInvalidArgument (the others' error names it),
 * no communicator is created and `comm` stays usable. An abort of `comm`, or a peer failure it hears of, ends
 * this rank's wait for the new communicator's rendezvous within milliseconds, and the members already waiting there
 * are told why. */
chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm);
/* Waits for outstanding operations, then frees the communicator. NULL: chorusSuccess, nothing to free (as NCCL). */
chorusResult_t chorusCommDestroy(chorusComm_t comm);
/* Stops outstanding operations (they fail) and frees the communicator; returns within a bounded time. From any
 * thread, also while another thread is inside a call on comm: that call fails and returns, and the communicator is
 * freed once it has left; later calls with the handle are chorusInvalidUsage. Aborting twice (or aborting while
 * another thread destroys it) is safe: one frees it, the other gets chorusSuccess or chorusInvalidUsage. */
chorusResult_t chorusCommAbort(chorusComm_t comm);
chorusResult_t chorusCommCount(const chorusComm_t comm, int* count);
chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank);
/* chorusSuccess if the communicator is healthy, else the error that broke it (see chorusGetLastError). */
chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError);

/* A sum whose every input is first multiplied by *scalar (read as `datatype` when the op is created), as NCCL's
 * ncclRedOpCreatePreMulSum; each product is rounded to `datatype` once, whichever rank multiplies it. The op belongs to
 * `comm`: a call with it on another communicator, with another datatype, or after chorusRedOpDestroy is
 * chorusInvalidArgument. Op values are unique in the process. */
chorusResult_t chorusRedOpCreatePreMulSum(chorusRedOp_t* op, void* scalar, chorusDataType_t datatype,
                                          chorusScalarResidence_t residence, chorusComm_t comm);
chorusResult_t chorusRedOpDestroy(chorusRedOp_t op, chorusComm_t comm);

/* ---- Collectives (blocking for host buffers with stream == NULL; stream-ordered for device buffers) ----
 * In place: all-reduce, broadcast, reduce and all-to-all with sendbuff == recvbuff; all-gather with
 * sendbuff == recvbuff + rank * sendcount; reduce-scatter with recvbuff == sendbuff + rank * recvcount; gather at
 * the root with sendbuff == recvbuff + root * sendcount; scatter at the root with
 * recvbuff == sendbuff + root * recvcount. Any other overlap of the two buffers is chorusInvalidArgument.
 * Sizes: all-reduce, broadcast, reduce: count elements in and out.
 * all-gather: sendcount in, nranks * sendcount out (rank r's block at offset r * sendcount).
 * reduce-scatter: nranks * recvcount in, recvcount out. all-to-all: nranks * count in and out (block j of the input
 * goes to rank j).
 * gather (MPI_Gather; RCCL's ncclGather): sendcount in on every rank, nranks * sendcount out at the root only (rank
 * r's block at offset r * sendcount); recvbuff is ignored elsewhere and may be NULL.
 * scatter (MPI_Scatter; RCCL's ncclScatter): nranks * recvcount in at the root only (block r goes to rank r),
 * recvcount out on every rank; sendbuff is ignored elsewhere and may be NULL.
 * A root outside [0, nranks) is chorusInvalidArgument. */
chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                               chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                            chorusRedOp_t op, int root, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                   chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype, int root,
                            chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusStream_t stream);
/* Compressed collectives (docs/compression.md): all-reduce, reduce-scatter and all-gather of float32, float16 or
 * bfloat16 data with sum or avg (sign_vote: sum, the result is the majority sign) send codes instead of values. The
 * error is explicit and bounded (docs/compression.md lists it per codec and schedule); every rank of a compressed
 * all-reduce or all-gather ends with the same bits. float16 and bfloat16 data is widened to float32 (exactly) into
 * a buffer the communicator keeps (4 bytes per element of the input and of the output), compressed and reduced as
 * float32, and the result rounded to the caller's type once (nearest-even): the float32 call's result, rounded.
 * Schedules (chorusCollOptions_t::algorithm): "qonce" (quantize once: direct reduce-scatter of codes, fp32 accumulation
 * at the owner, one re-quantization of the result; ZeRO++, Wang et al. 2023; an all-reduce over several hosts first
 * reduces exactly inside each host, so one coded partial per host crosses the network), "qonce-flat" (all-reduce: the
 * one-level form on any topology; what error feedback and sign_vote run), "ring" (codes re-quantized at every hop, for
 * comparison), "hier" (the hierarchical ring with only the messages between hosts coded; needs several hosts). Default:
 * "qonce" ("hier" for a reduce-scatter over several hosts with more than one rank on a host). */
typedef enum {
  chorusCodecInt8 = 1,     /* int8, one fp32 scale per block (block 32..1024 elements, multiple of 32; default 256) */
  chorusCodecFp8E4M3 = 2,  /* OCP MX fp8 e4m3, one power-of-two (E8M0) scale per 32 elements; never saturates */
  chorusCodecInt4 = 3,     /* int4 [-7, 7], one fp16 scale per 32 elements */
  chorusCodecSign1 = 4,    /* 1 bit per element, scale = L2 norm / sqrt(n) per block (default 2048; 1-bit Adam) */
  chorusCodecSignVote = 5, /* signSGD with majority vote: the sign of the sum of the ranks' signs (+1 on a tie);
                              all-reduce, qonce, op sum only */
  chorusMinCodec = -0x7fffffff - 1,
  chorusMaxCodec = 0x7fffffff
} chorusCodec_t;
typedef struct {
  size_t size; /* sizeof(chorusCompression_t) of the caller's header */
  chorusCodec_t codec;
  uint32_t block;          /* elements per scale; 0 = the codec's default */
  int stochastic_rounding; /* 1: unbiased rounding from Philox keyed on (seed, step, rank, element); int8/fp8/int4 */
  uint64_t seed;
  uint64_t step; /* the training step: stochastic rounding draws fresh variates, and rotation a fresh D, per step */
  /* Error feedback (quantize-once schedule only): a residual the caller owns and keeps between calls (save it with
   * a checkpoint), error_feedback_elems floats (float32 whatever the data's type), zero-initialised before the
   * first call. All-reduce of count elements: 2 * count (the worker residual over the input, then the owner
   * residual); reduce-scatter of recvcount: nranks * recvcount. NULL: no feedback. Not for all-gather. Every rank
   * passes its own. The layout follows the count (the owner residual of an all-reduce starts at element count): a
   * residual serves one tensor of one count, and reusing it for another count mixes elements (zero it first). */
  float* error_feedback;
  size_t error_feedback_elems;
  /* 1: randomized Hadamard rotation of each record before quantizing (int8 with a power-of-two block, fp8_e4m3,
   * int4, sign1 with a power-of-two block up to 4096; signs D drawn from (seed, step), equal on every rank): an
   * outlier is spread over its record instead of setting its block's scale, so heavy-tailed data (gradients with
   * outliers) quantizes about as well as normal data (Suresh et al. 2017, "Distributed mean estimation with limited
   * communication"). With sign1 and error feedback, the fresh D of every step keeps the residual small when the
   * gradient has a direction that persists over steps (docs/compression.md). Costs O(log block) flops per element
   * on both sides. A message's last record shorter than a block (and so a rank's whole shard when it is
   * shorter than one block) is not rotated. A record holding a magnitude of 2^115 (4.2e34) or more cannot be rotated
   * within fp32 and decodes to NaN like a non-finite record. 0: none. */
  int rotation;
} chorusCompression_t;
#define CHORUS_COMPRESSION_INIT(codec_) \
  { sizeof(chorusCompression_t), (codec_), 0, 0, 0, 0, NULL, 0, 0 }

/* Per-call options for the *Ex forms. Start from CHORUS_COLL_OPTIONS_INIT, so that fields added in later versions
 * keep their defaults. `size` must be sizeof(chorusCollOptions_t) of the caller's header (at least the fields
 * below); NULL options mean all defaults. */
typedef struct {
  size_t size;
  /* Algorithm for this call, by name as `chorus-info` lists them for the collective ("ring", "tree", "rhd", "bruck",
   * "pat", "hier", "oneshot", "pairwise"; gather and scatter: "linear", "binomial"), or NULL (or "") to let the
   * selector choose (CHORUS_ALGO, then the cost model). Every rank must pass the same name. An unknown name is
   * chorusInvalidArgument listing the known ones. */
  const char* algorithm;
  /* Compression of this call (all-reduce, reduce-scatter, all-gather), or NULL. With compression, `algorithm`
   * names a compressed schedule ("qonce", "qonce-flat", "ring", "hier") or is NULL for the default. Every rank must
   * pass the same codec, block, rotation, seed and step (with rotation or stochastic rounding) and schedule: a
   * mismatch is chorusRemoteError on every rank, naming both settings, and breaks the communicator (as any
   * mismatched call does). An unsupported datatype (anything but float32, float16 and bfloat16) or op (prod, max,
   * min, or avg with sign_vote) is chorusInvalidArgument naming it. */
  const chorusCompression_t* compression;
} chorusCollOptions_t;
#define CHORUS_COLL_OPTIONS_INIT \
  { sizeof(chorusCollOptions_t), NULL, NULL }

/* The collectives above with per-call options (same arguments, same errors; plus chorusInvalidArgument for bad
 * options, or an algorithm that does not apply to the communicator, e.g. "oneshot" beyond 64 ranks; the
 * communicator stays usable). Non-blocking all-reduce, all-gather and reduce-scatter take options through their Ex
 * forms (below); the other non-blocking calls, all-to-allv and barrier take none: they follow CHORUS_ALGO and the
 * selector. */
chorusResult_t chorusAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                 chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                 chorusStream_t stream);
chorusResult_t chorusBroadcastEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                 int root, const chorusCollOptions_t* options, chorusComm_t comm,
                                 chorusStream_t stream);
chorusResult_t chorusReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusRedOp_t op, int root, const chorusCollOptions_t* options, chorusComm_t comm,
                              chorusStream_t stream);
chorusResult_t chorusAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                 const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                     chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                     chorusStream_t stream);
chorusResult_t chorusAllToAllEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                              int root, const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                               int root, const chorusCollOptions_t* options, chorusComm_t comm, chorusStream_t stream);
/* Counts and displacements are in elements, one per rank. In place is not supported, nor receive regions that
 * overlap (an element written twice, as MPI_Alltoallv forbids): chorusInvalidArgument, naming the ranks. Sizes are
 * checked by the receiver: when rank i's sendcounts[j] differs from rank j's recvcounts[i], rank j fails in the
 * call, and rank i may return chorusSuccess and then fail at its next call (see the conventions above). */
chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                               const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream);
/* Point to point. Between two ranks, sends and receives match in the order they are called (a call of count 0
 * too: it pairs with the peer's call of count 0). Inside
 * chorusGroupStart/End they are issued together at chorusGroupEnd (so a rank may send to and receive from the
 * same peer without deadlock). Device buffers (CUDA build): ordered on `stream` as the collectives are, staged
 * through pinned host memory; the calls of one communicator in a group take the same stream (else
 * chorusInvalidUsage) and all device buffers or all host buffers (else chorusInvalidArgument naming the buffer),
 * refused when the call is made. A send to this rank itself pairs, in order, with a receive from itself of the same
 * size in the same call or group (else chorusInvalidArgument, nothing run). */
chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream);
chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream);
/* Groups nest; the outermost chorusGroupEnd issues everything called since the outermost chorusGroupStart on
 * this thread. Inside a group the calls that communicate are the blocking collectives, chorusSend and chorusRecv;
 * they are checked when made and issued at chorusGroupEnd, so their buffers must stay valid until then (and, on a
 * stream, until the stream gets there). A non-blocking collective, chorusCommSplit or chorusCommDestroy there is
 * chorusInvalidUsage (it would wait for peers that wait for this group, or drop what it queued). An init inside a
 * group blocks until its rendezvous completes, as outside one (one rank per thread); chorusCommAbort, the queries,
 * chorusWait/chorusTest and the reduction ops are allowed. The calls of one communicator in a group take one stream
 * and all device or all host buffers (else refused when made). On each communicator the group's collectives run
 * in the order they were called (every rank calls the same ones in the same order, as outside a group), then its
 * sends and receives, issued together; as in NCCL, nothing orders a send or receive of the group against its
 * collectives. A group that spans several communicators runs their calls at once (host buffers on the
 * communicators' worker threads; stream-ordered sends and receives, on one stream or several, enqueued with every
 * post ahead of every wait), so one thread may drive the communicators of several ranks, and ranks may call the
 * communicators in different orders. Stream-ordered collectives in a group that spans several communicators are
 * chorusNotSupported, and nothing of the group runs (call them outside the group, one thread per communicator). It
 * returns the error of the first communicator (in the order they
 * first appear in the group) whose calls failed; each communicator's error is in its chorusGetLastError. A call
 * refused when it was made inside the group (bad argument, or one of the calls above) is left out and the others
 * run, so that peers are not left waiting; chorusGroupEnd then returns that refusal again (the first one, when no
 * communicator's calls failed), with the text in chorusGetLastError(NULL), as NCCL's group end reports errors of
 * calls made in the group. A communicator with collectives in the group (queued, or refused when made), or one of
 * which the thread drives other ranks in the group too (one thread for several thread-ranks), runs all of its calls
 * or none: after a refusal on it (when made, or its sends against its receives at chorusGroupEnd) none of them runs,
 * since its later collectives would meet other collectives of its peers; the group end returns that refusal as this
 * communicator's error. The other ranks of that communicator in the same group then run none of their calls either,
 * saying which rank (their calls would wait for it); peers elsewhere that wait for those calls time out naming this
 * rank. */
chorusResult_t chorusGroupStart(void);
chorusResult_t chorusGroupEnd(void);

/* ---- Non-blocking collectives ----
 * Same arguments as above; they return at once with a request. The operation progresses in the background;
 * buffers must not be touched until chorusTest reports done or chorusWait returns. Operations on one
 * communicator complete in the order they were issued. Every request must be freed with chorusRequestFree. */
chorusResult_t chorusIallReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIbroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                                chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIreduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                             chorusRedOp_t op, int root, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIallGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIreduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                    chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIallToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIallToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                                const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIgather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIscatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                              int root, chorusComm_t comm, chorusRequest_t* request);
/* With per-call options (algorithm, compression) as the blocking Ex forms; options are read before the call
 * returns, a compression's error-feedback residual is read and written while the request runs (do not touch it
 * until the request is done). */
chorusResult_t chorusIallReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                  chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                  chorusRequest_t* request);
chorusResult_t chorusIallGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                  const chorusCollOptions_t* options, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIreduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                      chorusRedOp_t op, const chorusCollOptions_t* options, chorusComm_t comm,
                                      chorusRequest_t* request);
/* *done = 1 when complete (then the request's result is returned), else *done = 0 and chorusSuccess. */
chorusResult_t chorusTest(chorusRequest_t request, int* done);
/* Waits up to timeout_ms milliseconds; negative: until the operation ends, which it does by itself (a hang ends
 * at the operation's own deadline, CHORUS_TIMEOUT_MS, with an error naming the ranks that did not take part; an
 * operation queued behind a stream-ordered call of the same communicator also waits for that call's stream to
 * reach it). Returns the operation's result (chorusTimeout if the operation itself timed out: it is done), or
 * chorusInProgress if it is still running when timeout_ms has passed (the request stays valid; like chorusTest's
 * *done = 0 this is not an error, and chorusGetLastError keeps its text). */
chorusResult_t chorusWait(chorusRequest_t request, int64_t timeout_ms);
/* Frees a request; a request still running is waited for first. NULL: nothing. A request already freed, here or
 * in chorusTest/chorusWait, is chorusInvalidUsage (unless a newer request was given the same handle). */
chorusResult_t chorusRequestFree(chorusRequest_t request);

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_CHORUS_H_ */
